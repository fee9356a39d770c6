"""The ``this-machine`` preset: measured by a calibration run of the local runtime, read back by
``Cluster.preset``, and used to predict the local benchmarks' rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pwkernel.backends.sim import CALIBRATION_KEYS, Cluster, SimError
from pwkernel.bench import sim_calibrate as calibrate
from pwkernel.bench import sim_validate as validate


@pytest.fixture(scope="module")
def measured() -> dict:
    return calibrate.measure(repeats=2, n=16)


def test_calibration_writes_what_the_preset_reads(measured, tmp_path, monkeypatch):
    assert set(CALIBRATION_KEYS) | set(calibrate.EXTRA_KEYS) <= set(measured)
    for key in ("peak_flops", "memory_bandwidth", "ici_bandwidth", "host_to_device",
                "jax_dispatch"):
        assert math.isfinite(measured[key]) and measured[key] > 0, (key, measured[key])
    assert measured["measured"]["per_node_by_devices_s"].keys() == {1, 2, 4}
    assert measured["measured"]["per_program_by_devices_s"].keys() == {1, 2, 4}
    assert 0 < measured["compute_parallelism"] <= 4 and 0 < measured["memory_parallelism"] <= 4
    # a transfer between the islands, timed on the runtime's own path (a chain alternating
    # between them against one on a single slice; noise may bring the difference to 0)
    transfers = measured["measured"]["transfer_s"]
    assert transfers["alternating"] > 0 and transfers["one slice"] > 0
    assert measured["dcn_latency"] >= 0 and measured["dcn_bandwidth"] > 0
    path = calibrate.write(measured, tmp_path / "cal.json")
    monkeypatch.setenv("PWKERNEL_SIM_CALIBRATION", str(path))
    cluster = Cluster.preset("this-machine")
    assert cluster.name == "this-machine" and cluster.islands == (4, 4)
    assert cluster.chips_per_host == 1 and cluster.num_chips == 8
    assert cluster.host.client_per_program == pytest.approx(measured["client_per_program"])
    assert cluster.host.fanout_per_host == pytest.approx(measured["fanout_per_host"])
    assert cluster.chip.hbm_bandwidth == pytest.approx(measured["memory_bandwidth"])
    monkeypatch.setenv("PWKERNEL_SIM_CALIBRATION", str(tmp_path / "none.json"))
    with pytest.raises(SimError, match="needs a calibration file"):
        Cluster.preset("this-machine")


def test_the_calibrated_simulator_predicts_every_local_benchmark_row(measured):
    rows = validate.dispatch_rows(measured, "tiny")
    assert {(r["devices"], r["size"]) for r in rows} == {(1, 256), (1, 4096), (2, 256),
                                                          (2, 4096)}
    for r in rows:
        rates = r["steps_per_s"]
        assert set(rates) == {"pw_opbyop", "pw_chained", "pw_fused", "jax_opbyop", "jax_fused"}
        assert all(math.isfinite(v) and v > 0 for v in rates.values()), rates
        # one program per step costs the client more than one program for the chain
        assert rates["pw_chained"] >= rates["pw_opbyop"]
    tenants = validate.multitenancy_rows(measured, "tiny")
    assert [r["clients"] for r in tenants] == [1, 2]
    stages = validate.parallel_dispatch_rows(measured, "tiny")[0]["stages_per_s"]
    assert stages["parallel"] >= stages["sequential"]  # sequential adds the hand-offs
    rows = [validate.row("dispatch", "x", {"median": 100.0, "min": 90.0, "max": 130.0}, 120.0),
            validate.row("parallel-dispatch", "ratio", 2.0, 1.0)]
    assert rows[0]["error_pct"] == pytest.approx(20.0) and rows[1]["error_pct"] == -50.0
    table = validate.table(rows)
    assert "-10..+30 %" in table  # the measured rounds' spread against their median
    assert "1 of 2 rows within 25 %; 1 predictions inside their row's measured min..max" in table


def test_fit_line_fits_relative_error_and_keeps_both_terms_non_negative():
    assert calibrate.fit_line({1: 5.0, 2: 8.0, 4: 14.0}) == pytest.approx((2.0, 3.0))
    # the line through both would start at -2: through the origin instead, on relative error
    # (b minimises ((b - 1) / 1)^2 + ((2b - 4) / 4)^2: b = 1.5 / 1.25)
    assert calibrate.fit_line({1: 1.0, 2: 4.0}) == pytest.approx((0.0, 1.2))
    # falling costs: flat, at the weighted mean (weights 1 / y^2)
    a, b = calibrate.fit_line({1: 5.0, 2: 3.0, 4: 1.0})
    assert b == 0 and a == pytest.approx((1 / 5 + 1 / 3 + 1) / (1 / 25 + 1 / 9 + 1))


def _cal(**extra) -> dict:
    """A calibration with round numbers (what ``sim_calibrate`` writes, by hand)."""
    cal = {"islands": [4, 4], "chips_per_host": 1, "peak_flops": 5e10, "hbm_bytes": 8e9,
           "memory_bandwidth": 1e10, "launch_overhead": 0.0, "ici_bandwidth": 5e9,
           "ici_latency": 2e-6, "dcn_bandwidth": 1e9, "dcn_latency": 50e-6,
           "client_per_node": 5e-6, "fanout_per_host": 10e-6, "rpc_latency": 1e-6,
           "host_per_node": 0.0, "host_to_device": 5e9, "client_per_program": 3e-6,
           "program_fanout_per_host": 4e-6, "jax_dispatch": 5e-6, "cores": 2,
           "compute_parallelism": 2.0, "memory_parallelism": 2.0,
           "measured": {"per_node_by_devices_s": {"1": 20e-6},
                        "per_program_by_devices_s": {"1": 10e-6}}}
    cal.update(extra)
    return cal


def test_this_machine_launches_in_line_with_its_computations():
    """The local runtime launches on the submitting thread: a chain's host-side work and its
    computations add up (they do not overlap as a remote client's would)."""
    from pwkernel.bench import dispatch as bench

    m = validate.Machine(_cal())
    assert m.launch(1) == 20e-6 and m.program(1) == 10e-6  # measured on that slice size
    # on one device a step with more output than the tiny one ends through another thread
    cal = _cal(inline_output_bytes=1024)
    cal["measured"]["per_node_async_1_device_s"] = 45e-6
    slow = validate.Machine(cal)
    assert slow.launch(1, 1024) == 20e-6 and slow.launch(1, 4096) == 45e-6
    assert slow.launch(2, 4096) == m.launch(2)  # more devices: every launch waits
    assert m.launch(2) == pytest.approx(5e-6 + 2 * 10e-6)   # else the fitted line
    assert m.program(4) == pytest.approx(3e-6 + 4 * 4e-6)
    assert m.cluster.host.client_per_node == 0 and m.cluster.host.client_per_program == 0
    row = validate.dispatch_rows(_cal(), "tiny")[0]
    assert (row["devices"], row["size"], row["chain"]) == (1, 256, 8)
    c = m.device_seconds(bench.step, (256,), 1, P("x"))
    hops = 3 * 1e-6  # to the scheduler, to the host, the end heard by the client
    rates = row["steps_per_s"]
    assert rates["pw_chained"] == pytest.approx(8 / (hops + 10e-6 + 8 * (20e-6 + c)))
    assert rates["pw_opbyop"] == pytest.approx(8 / (hops + 8 * (10e-6 + 20e-6 + c)))


def test_devices_sharing_the_cores_stretch_by_the_measured_parallelism():
    from pwkernel.bench import multitenancy as bench

    def busy(parallelism: float) -> float:
        m = validate.Machine(_cal(compute_parallelism=parallelism))
        return m.device_seconds(bench.work, (256, 256), 4, P())

    # a product of 256 x 256 matrices is compute-bound here: 4 devices at a speed-up of 2
    # take twice what they take at a speed-up of 4 (their own speed: no stretch)
    assert busy(2.0) == pytest.approx(2 * busy(4.0))
    assert busy(0.5) == pytest.approx(8 * busy(4.0))  # contention: slower than one device
    one = validate.Machine(_cal(compute_parallelism=0.5))
    alone = validate.Machine(_cal(compute_parallelism=4.0))
    assert one.device_seconds(bench.work, (256, 256), 1, P()) == pytest.approx(
        alone.device_seconds(bench.work, (256, 256), 1, P()))  # one device: as measured


def test_compute_runs_at_the_rate_measured_for_products_of_its_size():
    from pwkernel.bench import multitenancy as bench

    rates = [[1e6, 1e9, 1.0], [1e8, 1e11, 2.0]]   # small products slow, large ones fast
    assert validate.matmul_rate(rates, 1e7) == pytest.approx((1e9 + 0.5 * 99e9, 1.5))
    assert validate.matmul_rate(rates, 1e4) == (1e9, 1.0)     # beyond the sizes: the nearest
    assert validate.matmul_rate(rates, 1e10) == (1e11, 2.0)
    sized = validate.Machine(_cal(matmul_rates=[[2.0 * 256**3, 1e10, 1.0]]))
    one_peak = validate.Machine(_cal())                  # 5e10 FLOP/s, parallelism 2
    flops = estimate_flops(bench.work)
    # one device: XLA's flops at the rate measured for that size, not at the single peak
    assert sized.device_seconds(bench.work, (256, 256), 1, P()) == pytest.approx(flops / 1e10)
    assert one_peak.device_seconds(bench.work, (256, 256), 1, P()) < 0.3 * \
        sized.device_seconds(bench.work, (256, 256), 1, P())
    # four devices at that size's parallelism (1): four times one device's time
    assert sized.device_seconds(bench.work, (256, 256), 4, P()) == pytest.approx(
        4 * sized.device_seconds(bench.work, (256, 256), 1, P()))


def estimate_flops(fn) -> float:
    import jax

    from pwkernel.backends.sim.cost import abstract_mesh, analyze, lower

    mesh = abstract_mesh((1,), ("x",))
    x = jax.ShapeDtypeStruct((256, 256), np.float32)
    return analyze(lower(fn, (x,), mesh, (P(),)), mesh).flops


def test_large_outputs_of_launched_computations_pay_for_fresh_pages():
    from pwkernel.bench import dispatch as bench

    m = validate.Machine(_cal(fresh_output_s_per_byte=1e-10, fresh_output_bytes=8 << 20))
    spec = P("x")
    for size, fresh in ((1 << 20, 0.0), (1 << 22, 1e-10 * (4 << 22))):  # 4 MiB, 16 MiB out
        alone = m.launch(1) + m.device_seconds(bench.step, (size,), 1, spec)
        assert m.computation(bench.step, (size,), 1, spec, 4 * size) == pytest.approx(
            alone + fresh)
    # a fused loop of 8 steps writes one output
    loop = m.computation(bench.step, (1 << 22,), 1, spec, 4 << 22, steps=8)
    assert loop == pytest.approx(m.launch(1) + 8 * m.device_seconds(bench.step, (1 << 22,), 1,
                                                                    spec) + 1e-10 * (4 << 22))

"""The ``this-machine`` preset: measured by a calibration run of the local runtime, read back by
``Cluster.preset``, and used to predict the local benchmarks' rows."""

from __future__ import annotations

import math

import pytest

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
    assert stages["parallel"] > stages["sequential"]
    table = validate.table([{"benchmark": "dispatch", "what": "x", "measured": 100.0,
                             "simulated": 120.0, "error_pct": 20.0}])
    assert "1 of 1 rows within 25 %" in table

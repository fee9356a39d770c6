"""The simulated cluster: layout, presets with their published figures, the calibration hook."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pwkernel.backends.sim import CALIBRATION_KEYS, PRESETS, Cluster, SimError
from pwkernel.backends.sim.cluster import torus_dims


def test_a_pod_is_islands_of_hosts_of_chips():
    c = Cluster.preset("tpu-v4", chips=2048, islands=2)
    assert c.islands == (256, 256) and c.chips_per_host == 4
    assert (c.num_chips, c.num_hosts) == (2048, 512)
    assert c.island_devices(1)[:2] == (1024, 1025) and len(c.island_devices(1)) == 1024
    assert c.island_of[1023] == 0 and c.island_of[1024] == 1
    assert c.host_of[5] == 1 and c.host_of[2047] == 511
    assert isinstance(c.host_of, np.ndarray)
    assert c.ici.torus == (16, 8, 8)  # each island is its own torus of 1024 chips


@pytest.mark.parametrize("name, peak, hbm_bw, link", [
    ("tpu-v3", 123e12, 900e9, 100e9), ("tpu-v4", 275e12, 1200e9, 45e9),
    ("a100", 312e12, 2039e9, 300e9), ("h100", 989e12, 3350e9, 450e9),
    ("h200", 989e12, 4800e9, 450e9)])
def test_presets_carry_the_published_figures_and_say_where_they_come_from(name, peak, hbm_bw,
                                                                         link):
    c = Cluster.preset(name)
    assert (c.chip.peak_flops, c.chip.hbm_bandwidth, c.ici.link_bandwidth) == (peak, hbm_bw,
                                                                              link)
    for key in ("peak_flops", "hbm", "ici", "dcn", "client_per_node", "rpc_latency"):
        assert c.sources[key]  # every number has its source (or says it is assumed)
    assert "assumed" in c.sources["rpc_latency"]


def test_tpu_torus_and_gpu_switch_shapes():
    assert Cluster.preset("tpu-v3", chips=1024).ici.torus == (32, 32)
    assert torus_dims(2048, 3) == (16, 16, 8) and torus_dims(64, 3) == (4, 4, 4)
    h100 = Cluster.preset("h100", chips=16)
    assert h100.islands == (2,) and h100.ici.chips_per_switch == 8
    assert h100.ici.group_links(8)[0] == 450e9   # inside one node: NVLink
    assert h100.ici.group_links(16)[0] == 50e9   # across nodes: InfiniBand per GPU
    assert h100.dcn.bandwidth_per_host == 8 * 50e9


def test_host_costs_can_be_changed_one_at_a_time():
    c = Cluster.preset("tpu-v4", chips=8)
    d = c.with_host(rpc_latency=1e-3)
    assert d.host.rpc_latency == 1e-3 and d.host.client_per_node == c.host.client_per_node
    assert c.host.rpc_latency == 50e-6  # values are immutable


def test_bad_clusters_are_refused_with_the_fix():
    with pytest.raises(SimError, match="unknown cluster preset 'tpu-v9'"):
        Cluster.preset("tpu-v9")
    with pytest.raises(SimError, match="Maybe you want chips=8"):
        Cluster.preset("tpu-v4", chips=10)
    with pytest.raises(SimError, match="Maybe you want islands=\\(4,\\)"):
        Cluster(PRESETS["tpu-v4"](8, 1).chip, (0,), 4, *([None] * 3))
    with pytest.raises(SimError, match="island 3 does not exist"):
        Cluster.preset("tpu-v4", chips=8).island_devices(3)
    # the field that is wrong is the one named (before: "Maybe you want chips=8" for
    # islands=0, and chips=4 for the string '8')
    for islands in (0, -1, True, 1.5):
        with pytest.raises(SimError, match="needs islands, a whole number from 1.*Maybe you "
                                           "want islands=1"):
            Cluster.preset("tpu-v4", chips=8, islands=islands)
    with pytest.raises(SimError, match="chips as an int.*Maybe you want chips=8\\."):
        Cluster.preset("tpu-v4", chips="8")


def _calibration() -> dict:
    return {"islands": [4, 4], "chips_per_host": 1, "peak_flops": 5e10, "hbm_bytes": 8e9,
            "memory_bandwidth": 1e10, "launch_overhead": 5e-6, "ici_bandwidth": 5e9,
            "ici_latency": 2e-6, "dcn_bandwidth": 1e9, "client_per_node": 30e-6,
            "rpc_latency": 1e-6, "host_per_node": 10e-6, "host_to_device": 5e9}


def test_this_machine_comes_from_a_calibration_run(tmp_path, monkeypatch):
    assert set(_calibration()) == set(CALIBRATION_KEYS)
    c = Cluster.from_calibration(_calibration())
    assert c.name == "this-machine" and c.islands == (4, 4) and c.num_chips == 8
    assert c.host.client_per_node == 30e-6
    missing = tmp_path / "none.json"
    monkeypatch.setenv("PWKERNEL_SIM_CALIBRATION", str(missing))
    with pytest.raises(SimError, match="needs a calibration file.*Write it with "
                                       "`python -m pwkernel.bench.sim_calibrate`"):
        Cluster.preset("this-machine")  # (the error named no command that writes it)
    missing.write_text(json.dumps({k: v for k, v in _calibration().items() if k != "islands"}))
    with pytest.raises(SimError, match=r"calibration data \(from '.*none.json'\) lacks "
                                       r"\['islands'\].*sim_calibrate"):
        Cluster.preset("this-machine")
    missing.write_text(json.dumps(_calibration()))
    assert Cluster.preset("this-machine").chip.peak_flops == 5e10
    with pytest.raises(SimError, match="lacks \\['rpc_latency'\\]"):
        Cluster.from_calibration({k: v for k, v in _calibration().items() if k != "rpc_latency"})


def _toy(chip: dict | None = None, host: dict | None = None, **fields) -> Cluster:
    from pwkernel.backends.sim import Chip, HostCosts, Interconnect, Network

    parts = {"chip": Chip(**{"name": "toy", "peak_flops": 1e12, "hbm_bytes": 1e9,
                             "hbm_bandwidth": 1e11, **(chip or {})}),
             "islands": (2,), "chips_per_host": 2, "ici": Interconnect(1e10, 1e-6),
             "dcn": Network(1e9, 1e-5),
             "host": HostCosts(**{"client_per_node": 1e-5, "fanout_per_host": 0.0,
                                  "rpc_latency": 1e-4, "host_per_node": 5e-6,
                                  "host_to_device": 1e9, **(host or {})})}
    return Cluster(**(parts | fields))


@pytest.mark.parametrize("build, field, valid", [
    # NaN passed every "< 0" check (virtual time became 0.0), inf every "> 0" one
    (lambda: _toy(chip={"launch_overhead": float("nan")}), "Chip.launch_overhead",
     "a finite number >= 0"),
    (lambda: _toy(chip={"launch_overhead": float("inf")}), "Chip.launch_overhead",
     "a finite number >= 0"),
    (lambda: _toy(chip={"peak_flops": float("inf")}), "Chip.peak_flops", "a finite number > 0"),
    (lambda: _toy(chip={"peak_flops_f32": float("nan")}), "Chip.peak_flops_f32",
     "a finite number > 0"),
    (lambda: _toy(host={"rpc_latency": float("nan")}), "HostCosts.rpc_latency",
     "a finite number >= 0"),
    (lambda: _toy().with_host(rpc_latency=float("nan")), "HostCosts.rpc_latency",
     "a finite number >= 0"),
    (lambda: _toy().with_host(client_per_node=True), "HostCosts.client_per_node",
     "a finite number >= 0"),
    # a misspelt cost was a bare TypeError from the dataclass, naming none of the valid ones
    (lambda: _toy().with_host(rpc=1e-6), "with_host got ['rpc']", "valid: ['client_per_node'"),
    (lambda: _toy(chips_per_host=True), "chips_per_host", "an int >= 1"),
    (lambda: _toy(islands=(True,)), "islands", "each an int >= 1"),
])
def test_impossible_numbers_are_refused_naming_the_field_and_its_range(build, field, valid):
    with pytest.raises(SimError) as info:
        build()
    text = str(info.value)
    assert field in text and valid in text, text
    assert "\n" not in text


@pytest.mark.parametrize("torus", [(0, 2), (-2,), (2.0, 2), (True, 4)])
def test_a_torus_needs_positive_whole_dimensions(torus):
    from pwkernel.backends.sim import Interconnect

    with pytest.raises(SimError, match=r"Interconnect.torus must be .*each an int >= 1") as info:
        Interconnect(1e10, 1e-6, torus=torus)
    assert "\n" not in str(info.value)


def test_a_torus_holds_exactly_the_chips_of_each_island():
    from pwkernel.backends.sim import Interconnect

    # 2 hosts x 2 chips per island: a 2 x 2 torus fits, 2 x 4 (or 3) does not
    assert _toy(ici=Interconnect(1e10, 1e-6, torus=(2, 2))).ici.torus == (2, 2)
    with pytest.raises(SimError, match=r"torus \(2, 4\) has 8 chips but island 0 has 4 "
                                       r".* Maybe you want torus=\(2, 2\)") as info:
        _toy(ici=Interconnect(1e10, 1e-6, torus=(2, 4)))
    assert "\n" not in str(info.value)


def test_a_calibration_file_that_is_missing_or_not_one_is_named_with_the_fix(tmp_path):
    # (these were open's bare FileNotFoundError and json's "Expecting value: line 1 column 1")
    with pytest.raises(SimError, match=r"no calibration file at '.*nope.json'.*sim_calibrate"):
        Cluster.from_calibration(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    for text in ("hello", "[1, 2]"):
        bad.write_text(text)
        with pytest.raises(SimError, match=r"'.*bad.json' is not a calibration file \(a JSON "
                                           r"object of .*peak_flops.*sim_calibrate"):
            Cluster.from_calibration(str(bad))

"""The views read a simulator's trace, and stay readable at 2048 chips: rows per host, group
of hosts or island (with the device count), and drill-down to devices."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.sim import Cluster, SimNode, SimProgram, Simulator
from pwkernel.backends.sim.scale import pipeline
from pwkernel.viz.columns import DeviceLayout, merged_busy


@pytest.fixture(scope="module")
def pod() -> Simulator:
    """A TPU v4 pod of 2048 chips: 16-stage pipelines of 128 chips (with ICI transfers) and
    a few SPMD steps on all 2048 chips."""
    cluster = Cluster.preset("tpu-v4", chips=2048)
    sim = Simulator(cluster)
    sim.submit(pipeline(cluster, stages=16, microbatches=4), client="pipe")
    chips = cluster.island_devices(0)
    sim.submit(SimProgram("spmd", [SimNode(i, "step", chips, (i - 1,) if i else (), 1e-3)
                                   for i in range(3)]), client="spmd")
    sim.run()
    return sim


def test_layout_rows_per_device_host_group_or_island():
    islands = [(0, tuple(range(8))), (1, tuple(range(8, 16)))]
    by_host = DeviceLayout.grouped(islands, host_of=lambda d: d // 4, rows="host")
    assert by_host.n_rows == 4
    assert by_host.labels[0.0] == "island 0 · host 0 (4 devices)"
    assert by_host.row(5) == by_host.row(7) == 1.0
    by_island = DeviceLayout.grouped(islands, host_of=lambda d: d // 4, rows="island")
    assert list(by_island.labels.values()) == ["island 0 · all (8 devices)",
                                               "island 1 · all (8 devices)"]
    assert DeviceLayout.grouped(islands, rows="auto").n_rows == 16  # 16 devices fit
    # one bar per row an event touches, first device of the event on each row
    assert by_host.shown((2, 3, 4, 9)) == (2, 4, 9)
    assert by_host.pairs((0, 1, 2, 3), (8, 9, 10, 11)) == [(0, 8)]
    with pytest.raises(ValueError, match="rows must be one of"):
        DeviceLayout.grouped(islands, rows="chip")


def test_a_2048_chip_schedule_is_drawn_per_group_of_hosts_and_drills_down(pod):
    view = pw.ScheduleView(pod, live=False)
    try:
        layout = view.layout_rows
        assert layout.n_rows <= 64
        assert layout.labels[0.0] == "island 0 · hosts 0-7 (32 devices)"
        bars = view.decoded()
        computations = [e for e in pod.trace.events() if e.kind == "compute"]
        # every computation is drawn, once per group of hosts it ran on (not once per chip)
        assert set(bars["name"]) == {e.name for e in computations}
        expected = sum(len({layout.rows[d] for d in e.devices}) for e in computations)
        assert len(bars["index"]) == expected < sum(len(e.devices) for e in computations) // 8
        spmd = [y for p, y in zip(bars["program"], view.source.data["y"], strict=True)
                if p == "spmd"]
        assert len(spmd) == 3 * 64  # three steps on all 64 rows
        inner = view.drill(hosts=range(2))  # hosts 0 and 1: chips 0..7, a row each
        try:
            assert inner.layout_rows.n_rows == 8
            assert inner.layout_rows.labels[0.0] == "island 0 · device 0"
            shown = inner.decoded()
            assert set(shown["device"]) == set(range(8))
            assert {"spmd", "pipeline"} == set(shown["program"])
            links = inner.decoded(inner.links)
            assert all(d < 8 and s < 8 for s, d in zip(links["src_device"],
                                                        links["dst_device"], strict=True))
        finally:
            inner.close()
        with pytest.raises(ValueError, match="exactly one of"):
            view.drill()
    finally:
        view.close()


def test_topology_view_of_a_simulated_pod(pod):
    view = pw.TopologyView(pod, live=False, window=pod.now)
    try:
        data = view.source.data
        assert len(data["x"]) == view.layout_rows.n_rows <= 64
        assert data["x"][0] == ("island 0", "hosts 0-7 (32 devices)")
        assert all(0 < u <= 1 for u in data["utilization"])  # every row computed
        assert "simulated" in view.islands.value
    finally:
        view.close()


def test_a_view_made_after_a_run_keeps_max_rows_bars_of_grouped_rows(pod):
    """A row grouping 32 chips draws one bar per computation, not one per chip: a view made
    after the run holds the newest ``max_rows`` bars (it held 12 of 300: the history was cut
    as if each 2048-chip step made 2048 bars)."""
    view = pw.ScheduleView(pod, live=False, max_rows=300)
    try:
        layout = view.layout_rows
        computations = [e for e in pod.trace.events() if e.kind == "compute"]
        drawn = [e.index for e in computations for _ in {layout.rows[d] for d in e.devices}]
        assert len(drawn) > 300
        assert view.decoded()["index"] == drawn[-300:]
    finally:
        view.close()


def test_a_topology_view_of_a_long_simulated_run_holds_a_bounded_number_of_computations():
    """On a virtual clock utilization is over the whole run: the view folds the busy time of
    older computations into per-row totals instead of keeping every computation (it kept all
    of them, past the trace's own capacity, and each update walked them all)."""
    with pw.Controller(backend="sim", cluster=Cluster.preset("tpu-v4", chips=16)) as ctl:
        step = pw.function(lambda x: x + 1, slice=ctl.slice(4), name="step", sim_cost=1e-4)
        idle = pw.function(lambda x: x * 2, slice=ctl.slice(4), name="idle", sim_cost=3e-4)
        view = pw.TopologyView(ctl, live=False)
        try:
            view.hold = 50
            x = np.zeros(4, np.float32)
            for _ in range(6):
                for i in range(40):
                    (step if i % 4 else idle)(x).wait()
                view.update()
                assert view.held <= 2 * view.hold
            events = [e for e in ctl.trace.events() if e.kind == "compute"]
            assert len(events) == 240  # the trace kept every one: the expectation's source
            first = min(e.t_start for e in events)
            span = ctl.executor.now() - first
            for device, util in zip(view.source.data["device"], view.source.data["utilization"],
                                    strict=True):
                busy = merged_busy([(e.t_start, e.t_end) for e in events if device in e.devices])
                assert util == pytest.approx(busy / span, rel=1e-9), device
            assert sum(u > 0 for u in view.source.data["utilization"]) == 8  # both slices
        finally:
            view.close()


def test_a_report_of_a_2048_chip_pod_groups_its_rows_as_the_views_do(pod, tmp_path):
    """``pw.report`` draws a row per group of hosts, as the schedule view does: one bar per
    computation per row, and a utilization bar per row (it drew 2048 rows, a bar per chip, so
    a 2048-chip step took 2048 of the report's ``max_rows`` bars)."""
    from tests.viz.test_page_state import report_document

    doc = report_document(pw.report(pod, tmp_path / "pod.html"))
    computations = [e for e in pod.trace.events() if e.kind == "compute"]
    hosts_of = [{pod.host_of[d] // 8 for d in e.devices} for e in computations]  # 8 a row
    bars = doc.get_model_by_name("compute").data_source.data
    assert len(bars["index"]) == sum(map(len, hosts_of))
    assert sorted(bars["index"]) == sorted(e.index for e, h in zip(computations, hosts_of,
                                                                    strict=True) for _ in h)
    util = next(m for m in doc.models if "u" in getattr(m, "data", {})).data
    assert len(util["x"]) == 64
    assert util["x"][0] == ["island 0", "hosts 0-7 (32 devices)"]
    spmd_rows = {pod.host_of[d] // 8 for d in pod.cluster.island_devices(0)}
    assert sum(u > 0 for u in util["u"]) >= len(spmd_rows)
    device_rows = doc_rows = pw.report(pod, tmp_path / "chips.html", rows="device")
    chips = report_document(doc_rows).get_model_by_name("compute").data_source.data
    assert len(chips["index"]) == sum(len(e.devices) for e in computations)
    assert device_rows.exists()

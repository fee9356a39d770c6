"""The trace export of a 2048-chip TPU v4 pod: tracks grouped as the views' rows (per group of
hosts by default), one span per computation per track it touches; ``rows="device"`` keeps a
track per chip."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends import sim
from pwkernel.backends.sim.scale import pipeline

STEPS = 6


@pytest.fixture(scope="module")
def pod():
    """A simulated controller on all 2048 chips: STEPS steps after an upload from the host."""
    cluster = sim.Cluster.preset("tpu-v4", chips=2048)
    with pw.Controller(backend="sim", cluster=cluster) as ctl:
        step = pw.function(lambda x: x + 1, slice=ctl.slice(2048), name="step", sim_cost=1e-4)

        @pw.program
        def steps(x):
            for _ in range(STEPS):
                x = step(x)
            return x

        steps(np.zeros(2048 * 16, np.float32)).wait(timeout=60)
        yield ctl


def chrome(path) -> list[dict]:
    """The file's events, checked as Perfetto / chrome://tracing read them."""
    doc = json.loads(path.read_text())
    assert set(doc) == {"traceEvents", "displayTimeUnit"}
    events = doc["traceEvents"]
    for e in events:
        assert {"ph", "name", "pid", "tid"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and e["cat"] in ("compute", "transfer"), e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and e["args"]["name"], e
        else:
            assert e["ph"] in ("s", "f") and "id" in e and e["ts"] >= 0, e
    return events


def tracks(events: list[dict]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e["name"] == "thread_name"}


def test_a_pod_is_exported_per_group_of_hosts_by_default(pod, tmp_path):
    events = chrome(pod.trace.save(tmp_path / "pod.json"))
    named = tracks(events)
    compute = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    used = {(e["pid"], e["tid"]) for e in compute}
    # 512 hosts of 4 chips in 64 groups of 8 consecutive hosts, a track each
    assert len(used) == 64 and all(re.fullmatch(r"hosts \d+-\d+ \(32 devices\)", named[t])
                                   for t in used)
    assert named[0, 0] == "hosts 0-7 (32 devices)"
    assert named[0, 2016] == "hosts 504-511 (32 devices)"
    # one span per computation per group of hosts it ran on, worked out from the hosts
    host_of = pod.host_of
    steps = [e for e in pod.trace.events() if e.kind == "compute"]
    assert len(steps) == STEPS
    assert len(compute) == sum(len({host_of[d] // 8 for d in e.devices}) for e in steps) \
        == STEPS * 64
    for tid in {t for _, t in used}:  # each track: every step once
        assert sum(e["tid"] == tid for e in compute) == STEPS
    # the upload is one span on the host's track, as at any size
    (upload,) = [e for e in events if e["ph"] == "X" and e["cat"] == "transfer"]
    assert named[upload["pid"], upload["tid"]] == "transfers from the host"


def test_rows_device_keeps_a_track_per_chip(pod, tmp_path):
    events = chrome(pod.trace.save(tmp_path / "chips.json", rows="device"))
    compute = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    assert len(compute) == STEPS * 2048
    named = tracks(events)
    assert {named[e["pid"], e["tid"]] for e in compute} == {f"device {d}" for d in range(2048)}
    grouped = pod.trace.save(tmp_path / "pod.json")
    assert (tmp_path / "chips.json").stat().st_size > 20 * grouped.stat().st_size


@pytest.mark.parametrize("rows, count, label", [
    ("host", 512, "host 0 (4 devices)"), ("island", 1, "all (2048 devices)"),
])
def test_rows_host_and_island(pod, rows, count, label):
    events = pod.trace.to_chrome(rows)["traceEvents"]
    compute = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    assert len(compute) == STEPS * count
    assert tracks(events)[0, 0] == label


@pytest.mark.parametrize("rows", ["chip", "hosts", "", None, 64])
def test_a_bad_rows_is_refused_before_writing(pod, tmp_path, rows):
    with pytest.raises(ValueError) as info:
        pod.trace.save(tmp_path / "t.json", rows=rows)
    text = str(info.value)
    assert "rows must be one of ('auto', 'device', 'host', 'island')" in text, text
    assert f"got {rows!r}" in text and "rows='auto'" in text and "\n" not in text
    assert not (tmp_path / "t.json").exists()


def test_a_simulators_transfers_join_the_tracks_of_their_groups(tmp_path):
    """``pw.sim.Simulator``'s trace groups as the controller's: a 16-stage pipeline of 128
    chips (32 hosts, 4 groups) sends from one stage's groups to the next's."""
    cluster = sim.Cluster.preset("tpu-v4", chips=2048)
    s = sim.Simulator(cluster)
    s.submit(pipeline(cluster, stages=16, microbatches=2), client="pipe")
    s.run()
    events = chrome(s.trace.save(tmp_path / "pipe.json"))
    named = tracks(events)
    moved = [e for e in s.trace.events() if e.kind == "transfer"]
    spans = [e for e in events if e["ph"] == "X" and e["cat"] == "transfer"]
    assert len(spans) == len(moved) == 2 * 15  # one span per transfer, as ungrouped
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(ends) == {e.index for e in moved}
    for e in moved:  # each arrow from the first group of the sender to that of the receiver
        src, dst = starts[e.index], ends[e.index]
        assert named[src["pid"], src["tid"]] == f"hosts {e.src_devices[0] // 4}-" \
            f"{e.src_devices[0] // 4 + 7} (32 devices)"
        assert named[dst["pid"], dst["tid"]] == f"hosts {e.devices[0] // 4}-" \
            f"{e.devices[0] // 4 + 7} (32 devices)"
    compute = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    assert len(compute) == 16 * 2 * 4  # each stage on its 4 groups of hosts

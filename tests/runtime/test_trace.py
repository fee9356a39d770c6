"""The event log and its Chrome-trace / Perfetto export."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import threading

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.device_groups import Topology
from pwkernel.runtime.trace import Event, Trace


def run_figure2(ctl):
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    a = pw.function(lambda x: x * 2, slice=s0)
    b = pw.function(lambda x: x + 1, slice=s1)
    y = pw.program(lambda v: b(a(v)), name="fig")(np.array([1.0, 2.0]))
    return y.result(timeout=60)


def test_events_have_the_documented_fields(ctl):
    with ctl.client("alice"):
        run_figure2(ctl)
    events = ctl.trace.events()
    assert [e.index for e in events] == list(range(len(events)))
    for e in events:
        assert e.kind in ("compute", "transfer") and e.program == "fig" and e.client == "alice"
        assert e.t_submit <= e.t_start <= e.t_end and e.devices
    (dcn,) = [e for e in events if e.link == "dcn"]
    assert (dcn.src, dcn.dst, dcn.nbytes) == (0, 1, 8)
    # A copy that landed before its source's end was seen spans no time (its start is that
    # end): no bandwidth then, rather than an infinite one (the formula on known times: below).
    assert dcn.bandwidth == (dcn.nbytes / dcn.duration if dcn.duration > 0 else None)
    assert ctl.trace.events(since=len(events) - 1) == events[-1:]


def test_chrome_trace_has_a_track_per_device_and_transfer_flows(ctl, tmp_path):
    run_figure2(ctl)
    path = ctl.trace.save(tmp_path / "run.json")
    doc = json.loads(path.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    compute = [e for e in spans if e["cat"] == "compute"]
    assert {(e["pid"], e["tid"]) for e in compute} == {(0, 0), (0, 1), (1, 4), (1, 5)}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 and flows[0]["id"] == flows[1]["id"]
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"]
    assert "island 0" in names and "device 4" in names
    # each transfer on its source's track: the host's uploads apart from island 0's sends
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
              if e["name"] == "thread_name"}
    moved = [e for e in spans if e["cat"] == "transfer"]
    assert {e["args"]["src"] for e in moved} >= {None, 0}
    for e in moved:
        src = e["args"]["src"]
        assert tracks[e["pid"], e["tid"]] == ("transfers from the host" if src is None else
                                              f"transfers from island {src} ({e['args']['link']})")



def test_a_small_controllers_export_keeps_a_track_per_device_by_default(ctl, tmp_path):
    run_figure2(ctl)
    # 8 devices: rows="auto" is the per-device export, byte for byte, with or without hosts
    default = ctl.trace.save(tmp_path / "auto.json").read_bytes()
    assert default == ctl.trace.save(tmp_path / "dev.json", rows="device").read_bytes()
    doc = json.loads(default)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"device 0", "device 1", "device 4", "device 5"} <= names
    assert not [n for n in names if "host" in n and "transfers" not in n]


def small_trace(topology=None) -> Trace:
    """Two computations and a transfer between islands, at hand-picked times."""
    trace = Trace(topology=topology)
    trace.record(kind="compute", name="a", program="p", program_id=0, client="c", island=0,
                 devices=(0, 1), t_submit=1.0, t_start=1.5, t_end=2.0)
    trace.record(kind="transfer", name="t", program="p", program_id=0, client="c", island=1,
                 devices=(4,), t_submit=2.0, t_start=2.0, t_end=2.25, nbytes=8, src=0, dst=1,
                 src_devices=(0,), link="dcn")
    trace.record(kind="compute", name="b", program="p", program_id=0, client="c", island=1,
                 devices=(4,), t_submit=2.0, t_start=2.25, t_end=3.0)
    return trace


def test_the_default_export_of_a_few_devices_is_the_per_device_one():
    """The export as it was before tracks could be grouped, pinned field by field."""
    meta = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0,
             "args": {"name": f"island {p}"}} for p in (0, 1, 0, 1, 1)]
    thread = [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": n}}
              for p, t, n in ((0, 0, "device 0"), (0, 1, "device 1"),
                              (1, 10_001, "transfers from island 0 (dcn)"), (1, 4, "device 4"))]
    args = {"program": "p", "client": "c", "status": "ok"}
    expected = [
        meta[0], thread[0],
        {"ph": "X", "name": "a", "cat": "compute", "pid": 0, "tid": 0, "ts": 500000.0,
         "dur": 500000.0, "args": args | {"queued_us": 500000.0}},
        meta[0], thread[1],
        {"ph": "X", "name": "a", "cat": "compute", "pid": 0, "tid": 1, "ts": 500000.0,
         "dur": 500000.0, "args": args | {"queued_us": 500000.0}},
        meta[1], thread[2],
        {"ph": "X", "name": "t", "cat": "transfer", "pid": 1, "tid": 10_001, "ts": 1000000.0,
         "dur": 250000.0, "args": args | {"queued_us": 0.0, "nbytes": 8, "src": 0, "dst": 1,
                                          "link": "dcn"}},
        meta[1], thread[3],
        {"name": "t", "cat": "transfer", "id": 1, "ph": "s", "pid": 0, "tid": 0,
         "ts": 1000000.0},
        {"name": "t", "cat": "transfer", "id": 1, "ph": "f", "bp": "e", "pid": 1, "tid": 4,
         "ts": 1250000.0},
        {"ph": "X", "name": "b", "cat": "compute", "pid": 1, "tid": 4, "ts": 1250000.0,
         "dur": 750000.0, "args": args | {"queued_us": 250000.0}},
    ]
    eight = Topology.of([(0, range(4)), (1, range(4, 8))], host_of=[0, 0, 1, 1, 2, 2, 3, 3])
    for trace in (small_trace(), small_trace(eight)):
        assert trace.to_chrome() == {"traceEvents": expected, "displayTimeUnit": "ms"}
        assert trace.to_chrome(rows="device") == trace.to_chrome()


def test_tracks_grouped_per_host_and_island_name_what_they_hold():
    eight = Topology.of([(0, range(4)), (1, range(4, 8))], host_of=[0, 0, 1, 1, 2, 2, 3, 3])
    trace = small_trace(eight)
    by_host = trace.to_chrome(rows="host")["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in by_host
             if e["name"] == "thread_name"}
    assert names == {(0, 0): "host 0 (2 devices)", (1, 4): "host 2 (2 devices)",
                     (1, 10_001): "transfers from island 0 (dcn)"}
    spans = [(e["name"], e["tid"]) for e in by_host if e["ph"] == "X"]
    assert spans == [("a", 0), ("t", 10_001), ("b", 4)]  # "a" once: both its devices on host 0
    # a bare trace knows only the devices its events name, each its own host
    bare = small_trace().to_chrome(rows="island")["traceEvents"]
    assert {e["args"]["name"] for e in bare if e["name"] == "thread_name"} == {
        "all (2 devices)", "all (1 device)", "transfers from island 0 (dcn)"}


def test_transfer_tracks_keep_apart_from_devices_past_ten_thousand():
    """A 16,384-chip cluster (tpu-v4, 4 islands) has devices 10,000 and 10,001 on island 2:
    the host's and island 0's transfers there kept tracks 10,000 and 10,001, the devices'."""
    trace = Trace()
    for d in (10_000, 10_001):
        trace.record(kind="compute", name=f"c{d}", program="p", program_id=0, client="c",
                     island=2, devices=(d,), t_submit=1.0, t_start=1.0, t_end=2.0)
    trace.record(kind="transfer", name="up", program="p", program_id=0, client="c", island=2,
                 devices=(10_000,), t_submit=2.0, t_start=2.0, t_end=3.0, nbytes=8,
                 link="host", dst=2)
    trace.record(kind="transfer", name="dcn", program="p", program_id=0, client="c", island=2,
                 devices=(10_001,), t_submit=2.0, t_start=2.0, t_end=3.0, nbytes=8, src=0,
                 dst=2, src_devices=(0,), link="dcn")
    for rows in ("device", "host"):
        doc = trace.to_chrome(rows=rows)["traceEvents"]
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc
                 if e["name"] == "thread_name"}
        track = {e["name"]: names[e["pid"], e["tid"]] for e in doc if e["ph"] == "X"}
        assert track["c10000"] != track["up"] and track["c10001"] != track["dcn"], track
        assert track["up"] == "transfers from the host", track
        assert track["dcn"] == "transfers from island 0 (dcn)", track


def test_spans_that_run_at_once_on_one_track_get_lanes_of_their_own():
    """The JSON trace format needs a track's spans nested (Perfetto cuts or drops the rest):
    two transfers between the same islands at once, or two computations on two chips of one
    host's track, used to overlap on it."""
    trace = Trace(topology=Topology.of([(0, range(4)), (1, range(4, 8))],
                                       host_of=[0, 0, 1, 1, 2, 2, 3, 3]))
    for name, device, start, end in (("a", 0, 1.0, 3.0), ("b", 1, 2.0, 4.0), ("c", 0, 3.0, 5.0)):
        trace.record(kind="compute", name=name, program="p", program_id=0, client="c",
                     island=0, devices=(device,), t_submit=1.0, t_start=start, t_end=end)
    for name, start, end in (("t1", 5.0, 7.0), ("t2", 6.0, 8.0)):
        trace.record(kind="transfer", name=name, program="p", program_id=0, client="c",
                     island=1, devices=(4,), t_submit=start, t_start=start, t_end=end,
                     nbytes=8, src=0, dst=1, src_devices=(0,), link="dcn")
    doc = trace.to_chrome(rows="host")["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc if e["name"] == "thread_name"}
    tracks: dict = {}
    for e in doc:
        if e["ph"] == "X":
            tracks.setdefault(names[e["pid"], e["tid"]], []).append((e["ts"], e["dur"], e["name"]))
    for spans in tracks.values():  # none starts before the one before it on its track ended
        spans.sort()
        assert all(t0 + d0 <= t1 for (t0, d0, _), (t1, _, _) in itertools.pairwise(spans)), spans
    assert {k: [n for _, _, n in v] for k, v in tracks.items()} == {
        "host 0 (2 devices)": ["a", "c"], "host 0 (2 devices) · 2": ["b"],
        "transfers from island 0 (dcn)": ["t1"], "transfers from island 0 (dcn) · 2": ["t2"]}
    # the lanes' tids are none of a device's or a transfer track's
    assert len(set(names)) == len(names) and min(t for _, t in names if t > 10_001) >= 20_000


def test_an_unknown_rows_is_refused_in_one_line(tmp_path):
    for call in (lambda: small_trace().to_chrome(rows="chips"),
                 lambda: small_trace().save(tmp_path / "t.json", rows="chips")):
        with pytest.raises(ValueError, match=r"rows must be one of \('auto', 'device', 'host', "
                           r"'island'\), got 'chips'. Maybe you want rows='auto'"):
            call()
    assert not (tmp_path / "t.json").exists()


def test_record_takes_the_event_fields_by_name_with_defaults_for_a_computation():
    trace = Trace()
    trace.record(kind="compute", name="f", program="p", program_id=3, client="alice",
                 island=1, devices=(4, 5), t_submit=1.0, t_start=2.0, t_end=3.5)
    trace.record(kind="transfer", name="t", program="p", program_id=3, client="alice",
                 island=1, devices=(4,), t_submit=3.5, t_start=3.5, t_end=4.0, nbytes=8,
                 src=0, dst=1, src_devices=(0,), link="dcn", node_id=7)
    compute, transfer = trace.events()
    # status "ok", no transfer part:
    assert compute == Event(0, "compute", "f", "p", 3, "alice", 1, (4, 5), 1.0, 2.0, 3.5)
    assert (transfer.index, transfer.src, transfer.dst, transfer.link, transfer.node_id,
            transfer.bandwidth) == (1, 0, 1, "dcn", 7, 16.0)


def test_record_names_every_event_field_in_order():
    # record stores one tuple in the Event's field order: its keywords must be those fields
    names = [n for n in inspect.signature(Trace.record).parameters if n != "self"]
    assert names == list(Event._fields[1:])


def test_record_refuses_fields_by_position():
    with pytest.raises(TypeError):
        Trace().record("compute", "f", "p", 0, "default", 0, (0,), 0.0, 0.0, 1.0)


@pytest.mark.parametrize("name, needle", [
    (".json", "names no file"), ("", "names no file"), ("runs/", "is a directory"),
    ("t\x00.json", "NUL byte"),
])
def test_save_refuses_a_path_that_names_no_file_in_one_line(tmp_path, name, needle):
    (tmp_path / "runs").mkdir()
    with pytest.raises(ValueError) as info:
        Trace().save(tmp_path / name if name else name)
    text = str(info.value)
    assert needle in text and "such as 'run.json'" in text and "\n" not in text, text
    assert sorted(os.listdir(tmp_path)) == ["runs"]


def test_clear_and_disable(ctl):
    run_figure2(ctl)
    n = ctl.trace.next_index
    ctl.trace.clear()
    assert ctl.trace.events() == [] and ctl.trace.next_index == n
    ctl.trace.enabled = False
    run_figure2(ctl)
    assert ctl.trace.events() == []
    ctl.trace.enabled = True
    done = threading.Event()
    threading.Thread(target=lambda: (run_figure2(ctl), done.set())).start()
    assert ctl.trace.wait_for(n + 3, timeout=60) and done.wait(60)
    assert ctl.trace.events(since=n)[0].index == n
    assert ctl.trace.events(since=np.int64(n))[0].index == n
    with pytest.raises(TypeError, match="since is an event index"):
        ctl.trace.events(since=2.5)


def _record(trace: Trace, n: int) -> None:
    for i in range(n):
        trace.record(kind="compute", name=f"c{i}", program="p", program_id=i, client="",
                     island=0, devices=(0,), t_submit=i, t_start=i, t_end=i + 0.5)


def test_a_trace_keeps_its_newest_events_up_to_its_capacity():
    trace = Trace(capacity=100)
    _record(trace, 1000)  # ten times what it keeps: a log that grew per event would hold all
    assert len(trace) == 100 and trace.next_index == 1000
    assert [e.index for e in trace.events()] == list(range(900, 1000))
    assert [e.index for e in trace.events(since=950)] == list(range(950, 1000))
    assert trace.events(since=5) == trace.events()  # dropped ones: from the oldest kept
    assert trace.rows(since=1000) == [] and trace.rows(since=2000) == []
    trace.capacity = 10  # smaller: the newest 10 stay
    assert [e.index for e in trace.events()] == list(range(990, 1000))
    trace.capacity = None  # every event from now on
    _record(trace, 500)
    assert len(trace) == 510 and trace.capacity is None
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="an int > 0, or None"):
            trace.capacity = bad
    assert Trace().capacity == 1_000_000  # bounded by default (documented in README)


def test_a_long_loop_keeps_the_controllers_trace_bounded(ctl):
    ctl.trace.capacity = 50
    step = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=0))
    x = step(np.zeros(4, np.float32))
    for _ in range(300):  # a computation each, and uploads: hundreds of events
        x = step(x)
    assert ctl.wait(60.0)
    assert ctl.trace.next_index > 300
    assert len(ctl.trace) == 50
    assert [e.index for e in ctl.trace.events()] == list(range(ctl.trace.next_index - 50,
                                                                 ctl.trace.next_index))


def test_save_names_a_missing_folder_and_a_path_that_is_not_one(tmp_path):
    # (a missing folder was open's bare "[Errno 2] No such file or directory", a number
    # os.fspath's "expected str, bytes or os.PathLike object, not int")
    with pytest.raises(FileNotFoundError) as info:
        Trace().save(tmp_path / "runs" / "run.json")
    text = str(info.value)
    assert "the folder" in text and "does not exist" in text and "create it" in text, text
    with pytest.raises(TypeError, match=r"a file path \(str or pathlib.Path\), got 3.*"
                                        r"trace.save\('run.json'\)"):
        Trace().save(3)
    assert os.listdir(tmp_path) == []

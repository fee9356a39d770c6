"""The event log and its Chrome-trace / Perfetto export."""

from __future__ import annotations

import inspect
import json
import os
import threading

import numpy as np
import pytest

import pwkernel as pw
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

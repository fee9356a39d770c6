"""The ``pwkernel`` comm's hygiene (what it echoes, where it writes, how many threads it keeps)
and, in a real kernel, that it answers while a cell runs: the sidebar's Cancel ends a blocked
``%%pathways`` cell at once."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from pwkernel.notebook import comm
from tests.helpers.kernel import CommClient, run_code  # the `kernel` fixture: conftest.py


# --- what replies quote ----------------------------------------------------------------------
@pytest.mark.parametrize("msg", [
    {"type": "x" * 10_000_000},
    {"type": "status", "id": "i" * 10_000_000},
    {"type": "policy", "policy": ["p" * 1_000_000] * 10},
    {"type": "status", **{f"field{i}": i for i in range(100_000)}},
    {"type": "cancel", "run": 10**5000},
    ["x" * 10_000_000],
])
def test_replies_never_echo_a_message_back_whole(ctl, msg):
    out = comm.reply(ctl, msg)
    text = json.dumps(out)
    assert out["type"] == "error" and len(text) < 1000, text[:2000]
    assert "id" not in out  # an over-long id is refused, not echoed


def test_valid_ids_are_echoed(ctl):
    assert comm.reply(ctl, {"type": "status", "id": "a" * 200})["id"] == "a" * 200
    assert comm.reply(ctl, {"type": "nope", "id": -7})["id"] == -7
    assert "id" not in comm.reply(ctl, {"type": "status", "id": 2**60})


# --- where a trace may be written -----------------------------------------------------------
def test_trace_writes_only_new_json_files_in_the_notebook_directory(ctl, tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    outside = tmp_path / "precious.json"
    outside.write_text("keep me")
    (root / "mine.json").write_text("mine")
    (root / "link").symlink_to(tmp_path)

    def ask(path=None):
        return comm.reply(ctl, {"type": "trace", **({} if path is None else {"path": path})},
                          root=root)

    for path, needle in [(str(outside), "outside it"), ("../precious.json", "outside it"),
                         ("link/precious.json", "outside it"), ("~/t.json", "outside it"),
                         ("mine.json", "exists already"), ("notes.txt", ".json file name")]:
        out = ask(path)
        assert out["type"] == "error" and needle in out["error"], (path, out)
    assert outside.read_text() == "keep me" and (root / "mine.json").read_text() == "mine"

    first, second = ask(), ask()  # time-stamped names, never the same file twice
    assert first["type"] == second["type"] == "trace"
    assert first["path"] != second["path"]
    for out in (first, second):
        path = root.resolve() / os.path.basename(out["path"])
        assert out["path"] == str(path) and json.loads(path.read_text())["traceEvents"] == []
    sub = root / "runs"
    sub.mkdir()
    assert ask("runs/a.json")["path"] == str(sub.resolve() / "a.json")



@pytest.mark.parametrize("path, needle", [
    (".json", "hidden"), ("runs/.json", "hidden"), (".cache/t.json", "hidden"),
    ("runs/../.t.json", "hidden"),
    ("t\x00.json", "NUL byte"), ("\x00/../x.json", "NUL byte"),
])
def test_trace_refuses_hidden_files_and_nul_bytes_in_one_line(ctl, tmp_path, path, needle):
    (tmp_path / "runs").mkdir()
    out = comm.reply(ctl, {"type": "trace", "path": path}, root=tmp_path)
    assert out["type"] == "error" and needle in out["error"], out
    assert "\n" not in out["error"] and "Pass a file name such as 'trace.json'" in out["error"]
    assert sorted(os.listdir(tmp_path)) == ["runs"] and os.listdir(tmp_path / "runs") == []


def test_trace_rows_picks_the_tracks_and_refuses_others(ctl, tmp_path):
    import numpy as np

    import pwkernel as pw

    pw.function(lambda x: x + 1, slice=ctl.slice(4, island=0))(np.ones(8)).result()

    def tracks(out) -> set[str]:
        events = json.loads(open(out["path"]).read())["traceEvents"]
        return {e["args"]["name"] for e in events if e.get("name") == "thread_name"
                and not e["args"]["name"].startswith("transfers")}

    plain = comm.reply(ctl, {"type": "trace", "path": "plain.json"}, root=tmp_path)
    assert plain["rows"] == "auto" and len(tracks(plain)) == 4  # a track per device
    island = comm.reply(ctl, {"type": "trace", "path": "i.json", "rows": "island", "id": 3},
                        root=tmp_path)
    assert {k: island[k] for k in ("type", "rows", "id")} == \
        {"type": "trace", "rows": "island", "id": 3}
    assert tracks(island) == {"all (4 devices)"}
    for bad in ("chip", "", 3, None, ["host"]):
        out = comm.reply(ctl, {"type": "trace", "path": "bad.json", "rows": bad},
                         root=tmp_path)
        assert out["type"] == "error" and "field 'rows' must be one of ['auto', 'device', " \
            "'host', 'island']" in out["error"], out
    assert sorted(os.listdir(tmp_path)) == ["i.json", "plain.json"]


# --- one updater thread, however many subscribe --------------------------------------------
def test_one_updater_serves_every_subscribed_comm_and_caps_them(ctl):
    sent: dict[int, list[dict]] = {}
    pushed = threading.Event()

    def sender(i):
        def send(msg):
            sent.setdefault(i, []).append(msg)
            if msg["type"] == "status" and len(sent[i]) >= 2:
                pushed.set()
        return send

    before = {t.name for t in threading.enumerate()}
    conns = [comm.Connection(sender(i), lambda: ctl) for i in range(100)]
    try:
        for conn in conns:
            assert conn.handle({"type": "subscribe", "interval": 0.1})["type"] == "status"
        new = [t for t in threading.enumerate() if t.name not in before]
        assert [t.name for t in new] == ["pwkernel-comm-updater"]
        served = [c for c in conns if c.thread is not None]
        assert served == conns[-comm.MAX_SUBSCRIBERS:]
        # the ones dropped to make room were told, and how to resume
        dropped = [sent[i][-1] for i in range(100 - comm.MAX_SUBSCRIBERS)]
        assert all(m["type"] == "error" and "Send 'subscribe' again" in m["error"]
                   for m in dropped)
        ctl.policy = "share"  # a change: the updater pushes it to every served comm
        assert pushed.wait(60)
        deadline = time.monotonic() + 60
        while not all(sent[i][-1]["type"] == "status" and sent[i][-1]["data"]["policy"] == "share"
                      for i in range(100 - comm.MAX_SUBSCRIBERS, 100)):
            assert time.monotonic() < deadline, "not every served comm got the change"
            pushed.clear()
            pushed.wait(1)
    finally:
        for conn in conns:
            conn.close()
    assert not [t for t in threading.enumerate() if t.name == "pwkernel-comm-updater"]


# --- in a real kernel: answered while a cell runs --------------------------------------------
class SubshellComm(CommClient):
    """A comm whose messages go to a kernel subshell, as JupyterLab sends them (JEP 91)."""

    def __init__(self, kc, comm_id: str):
        super().__init__(kc, comm_id)
        kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
        reply = kc.get_control_msg(timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        self.subshell = reply["content"]["subshell_id"]

    def send(self, msg_type: str, content: dict) -> None:
        msg = self.kc.session.msg(msg_type, content)
        msg["header"]["subshell_id"] = self.subshell
        self.kc.shell_channel.send(msg)


def test_a_live_view_the_page_closes_stops_its_thread_in_the_kernel(kernel):
    """The page closing a view's widget (a comm_close to the kernel, on the shell or, as
    JupyterLab sends comm messages, on a subshell) ends the view's updater thread."""
    for n, channel in enumerate((CommClient, SubshellComm)):
        model = run_code(kernel, f"import pwkernel as pw\nv{n} = pw.ScheduleView("
                                 f"pw.controller(), interval=0.02)\nt{n} = v{n}.updater.thread\n"
                                 f"print(t{n}.is_alive(), v{n}.model_id)").split()
        assert model[0] == "True", model
        channel(kernel, model[1]).close()
        # (a subshell's close may come after this cell started: the join waits for it)
        assert run_code(kernel, f"t{n}.join(60)\nprint(t{n}.is_alive(), v{n}.comm)"
                        ).split() == ["False", "None"]


TICKS = """\
import threading, jax, numpy as np, pwkernel as pw
held = threading.Event()
def slow(v):
    held.wait(120)            # each step holds its device until the test lets go
    return v
tick = pw.function(lambda v: jax.pure_callback(slow, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
                   slice=pw.controller().slice(1, island=0))
x = np.ones(4, np.float32)
"""
BLOCKING_CELL = "%%pathways\ny = x\nfor _ in range(300):\n    y = tick(y)"


def _reply_to(kc, msg_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def test_sidebar_cancel_is_answered_while_a_cell_blocks(kernel):
    # The cell's first step holds its device until the test lets go, so the cell cannot end
    # by itself: answers that come back were given while it blocked, and its end after the
    # cancel did not wait for the step already running. (How fast the kernel answers is a
    # latency figure for a benchmark, not a rule for a test.)
    c = SubshellComm(kernel, "pw-cancel-test")
    c.open({"interval": 0.1})  # pushes on: they publish from the updater thread
    assert c.next(lambda d: d["type"] == "status")["data"]["protocol"] == comm.PROTOCOL
    run_code(kernel, TICKS)
    # (stop_on_error off: the cell's expected error must not abort the requests that follow
    # it, which a loaded machine can deliver inside the kernel's abort window)
    cell = kernel.execute(BLOCKING_CELL, stop_on_error=False)
    pushed = c.next(lambda d: d["type"] == "status" and any(
        r["name"].startswith("cell[") and r["state"] == "running" for r in d["data"]["runs"]))
    (run,) = [r for r in pushed["data"]["runs"] if r["name"].startswith("cell[")]

    c.request({"type": "status", "id": 1})
    status = c.next(lambda d: d.get("id") == 1)
    assert [r["id"] for r in status["data"]["runs"]] == [run["id"]]  # the cell still runs
    c.request({"type": "cancel", "run": run["id"], "id": 2})
    cancelled = c.next(lambda d: d.get("id") == 2)
    # every step but the one holding its device was still queued: all of them cancelled
    assert cancelled["type"] == "cancel" and cancelled["cancelled"] == 299, cancelled

    reply = _reply_to(kernel, cell, timeout=60)["content"]  # while the first step holds
    assert reply["status"] == "error" and reply["ename"] == "CancelledError", reply
    assert "cancelled from the Pathways sidebar" in reply["evalue"]
    c.close()
    assert run_code(kernel, "print(len(pw.controller().runs()))").strip() == "1"  # it holds
    assert run_code(kernel, "held.set()\nassert pw.controller().wait(60)\n"
                            "print(pw.controller().runs())").strip() == "[]"


NASTY = [
    None, 7, "status", ["status"], {}, {"type": None}, {"type": ["status"]},
    {"type": "x" * 1_000_000}, {"type": "status", "id": {"a": 1}},
    {"type": "cancel", "run": -1}, {"type": "cancel", "run": 10**30},
    {"type": "policy", "policy": "__import__('os').system('touch pwned')"},
    {"type": "trace", "path": "/etc/passwd.json"}, {"type": "trace", "path": "../up.json"},
    {"type": "subscribe", "interval": 1e-9}, {"type": "subscribe", "interval": "0.5"},
    {"type": "dispatch", "dispatch": {"$ne": 1}}, {"type": "status", "extra": "x" * 100_000},
]


def test_every_comm_message_is_answered_and_nothing_runs(kernel):
    c = SubshellComm(kernel, "pw-nasty-test")
    c.open({})
    c.next(lambda d: d["type"] == "status")
    cwd = run_code(kernel, "import os; print(os.getcwd())").strip()
    before = set(os.listdir(cwd))
    for msg in NASTY:
        c.request(msg)
        out = c.next(lambda d: True, timeout=60)  # one reply each, in order
        assert out["type"] == "error" and len(json.dumps(out)) < 1000, (msg, out)
    assert set(os.listdir(cwd)) == before  # nothing written, nothing run
    c.close()
    assert run_code(kernel, "print(1 + 1)").strip() == "2"


def test_the_sidebar_is_told_the_controller_was_closed(kernel):
    """``pw.controller().close()`` in a cell: the sidebar said "controller not started yet"
    (the kernel sent the status of a kernel that never started one); it is told the
    controller is closed, its requests are refused with how to start a new one, and the next
    ``%pathways`` shows the new controller."""
    c = CommClient(kernel, "pw-closed-test")
    c.open({})
    c.next(lambda d: d["type"] == "status")
    run_code(kernel, "import pwkernel as pw\nget_ipython().run_line_magic('pathways', 'status')\n"
                     "pw.controller().close()")
    c.request({"type": "status", "id": 1})
    assert c.next(lambda d: d.get("id") == 1)["data"] == {"closed": True,
                                                          "protocol": comm.PROTOCOL}
    c.request({"type": "policy", "policy": "share", "id": 2})
    error = c.next(lambda d: d.get("id") == 2)["error"]
    assert "controller is closed" in error and "%pathways status" in error, error
    run_code(kernel, "get_ipython().run_line_magic('pathways', 'status')")
    c.request({"type": "status", "id": 3})
    data = c.next(lambda d: d.get("id") == 3)["data"]
    assert data["started"] and not data["closed"] and len(data["islands"]) == 2, data
    c.close()

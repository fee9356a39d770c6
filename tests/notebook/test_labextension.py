"""The JupyterLab extension (the Pathways sidebar): its TypeScript unit tests, its build and
installation, and the kernel side of its comm protocol (in process and in a real kernel)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.notebook import comm
from pwkernel.runtime.device_groups import ROW_MODES
from pwkernel.runtime.trace import Trace
from tests.helpers import ROOT
from tests.helpers.kernel import CommClient, run_code

EXT = ROOT / "extension"
BUILT = ROOT / "pwkernel" / "labextension"
BIN = Path(sys.executable).parent


def _need_npm() -> str:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("node/npm are not installed: the TypeScript tests need Node >= 20 "
                    "(the committed build in pwkernel/labextension still works without it)")
    if not (EXT / "node_modules").is_dir():
        pytest.fail("extension/node_modules is missing: run `make setup` (or `cd extension && "
                    "npm ci`) first")
    return npm


@pytest.fixture(scope="module")
def npm_tested() -> Path:
    """Runs `npm test` once (it compiles src/protocol.ts to build-test/ for node)."""
    npm = _need_npm()
    proc = subprocess.run([npm, "test"], cwd=EXT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"npm test failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout, proc.stdout[-2000:]
    return EXT / "build-test" / "src" / "protocol.js"


def test_typescript_unit_tests(npm_tested):
    assert npm_tested.is_file()


# --- a computation that runs until the test lets it finish ---------------------------------
def gated_program(ctl, gate, entered=None):
    """A program of two computations on one device: the first waits for ``gate`` (a
    ``threading.Event``), so the program is 'running' (and its second node queued) for as long
    as the test wants; ``entered`` (an Event) is set once the first one runs."""
    vs = ctl.slice(1, island=0)

    def wait(v):
        if entered is not None:
            entered.set()
        gate.wait(60)
        return v

    def held(x):
        return jax.pure_callback(wait, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    slow = pw.function(held, slice=vs)

    @pw.program
    def gated(x):
        return slow(slow(x))

    return gated


def test_status_from_python_validates_in_the_sidebar(npm_tested, ctl, tmp_path):
    """The real kernel-side status (with a running program) passes the TypeScript validator."""
    gate = threading.Event()
    out = gated_program(ctl, gate)(np.ones(4, np.float32))
    try:
        msg = comm.status_message(ctl)
        (run,) = msg["data"]["runs"]
        assert run["name"] == "gated" and run["islands"] == [0]
        (tmp_path / "status.json").write_text(json.dumps(msg))
        script = (f"const p = require({json.dumps(str(npm_tested))});"
                  f"const r = p.parseReply(JSON.parse(require('fs').readFileSync("
                  f"{json.dumps(str(tmp_path / 'status.json'))}, 'utf8')));"
                  "console.log(JSON.stringify({n: r.data.islands.length, runs: r.data.runs,"
                  " devices: r.data.devices.length}));")
        proc = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
        assert seen["n"] == 2 and seen["devices"] == 8 and seen["runs"][0]["id"] == run["id"]
    finally:
        gate.set()
        assert out.run.wait(60)


def test_sidebar_offers_the_rows_the_kernel_accepts(npm_tested):
    """The sidebar's trace rows choices are the kernel's ``ROW_MODES``, in its order."""
    script = f"console.log(JSON.stringify(require({json.dumps(str(npm_tested))}).ROW_MODES))"
    proc = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == list(ROW_MODES)


def test_built_extension_is_complete():
    meta = json.loads((BUILT / "package.json").read_text())
    assert meta["name"] == "pwkernel"
    entry = meta["jupyterlab"]["_build"]["load"]
    assert (BUILT / entry).is_file(), f"{entry} is missing: rebuild with `make setup`"
    assert json.loads((BUILT / "install.json").read_text())["packageName"] == "pwkernel"
    recorded = json.loads((BUILT / "sources.json").read_text())
    files, digest = source_hash(EXT)
    assert recorded["files"] == files and recorded["sha256"] == digest, (
        "the committed build in pwkernel/labextension was not built from extension/src and "
        "extension/style as they are: run `sh extension/setup.sh .venv` and commit the build")


def source_hash(ext: Path) -> tuple[list[str], str]:
    """What extension/hash-sources.mjs records: SHA-256 over src/ and style/ (path, NUL,
    bytes, NUL per file, in sorted order of the paths relative to ``ext``)."""
    files = sorted(p.relative_to(ext).as_posix() for root in ("src", "style")
                   for p in (ext / root).rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (ext / name).read_bytes() + b"\0")
    return files, digest.hexdigest()


def test_the_source_hash_sees_any_change(tmp_path):
    """The stale-build check can fail: one byte changed in a copy of the sources changes it."""
    copy = tmp_path / "extension"
    for root in ("src", "style"):
        shutil.copytree(EXT / root, copy / root)
    assert source_hash(copy) == source_hash(EXT)
    panel = copy / "src" / "panel.ts"
    panel.write_text(panel.read_text() + " ")
    assert source_hash(copy)[1] != source_hash(EXT)[1]


def test_labextension_list_shows_it_enabled():
    jupyter = BIN / "jupyter"
    if not jupyter.exists():
        pytest.skip(f"no jupyter next to {sys.executable}; run the tests from `make test`")
    proc = subprocess.run([str(jupyter), "labextension", "list"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    text = proc.stdout + proc.stderr
    line = next((x for x in text.splitlines() if x.strip().startswith("pwkernel ")), None)
    assert line is not None, f"pwkernel is not installed in JupyterLab (run `make setup`):\n{text}"
    assert "enabled" in line and "OK" in line, line


# --- the protocol, in process ------------------------------------------------------------
@pytest.mark.parametrize("msg, needle", [
    ({"type": "status", "verbose": True}, "unknown field(s) ['verbose']"),
    ({"type": "policy"}, "needs field 'policy'"),
    ({"type": "policy", "policy": "lifo"}, "one of ['fifo', 'priority', 'share']; got 'lifo'"),
    ({"type": "dispatch", "dispatch": 1}, "one of ['parallel', 'sequential']"),
    ({"type": "cancel", "run": "3"}, "a run id (int >= 0)"),
    ({"type": "cancel", "run": True}, "a run id (int >= 0)"),
    ({"type": "subscribe", "interval": 0}, "between 0.1 and 10.0"),
    ({"type": "trace", "path": ""}, "a new .json file name in the notebook's directory"),
    ({"type": "trace", "path": "notes.txt"}, "a new .json file name"),
    ({"type": "status", "id": [1]}, "'id' must be an int or a string"),
    ({"type": "launch"}, "this kernel answers ['status', 'subscribe'"),
    ("status", "expected a JSON object with a 'type' field"),
])
def test_bad_requests_get_clear_errors(ctl, msg, needle):
    out = comm.reply(ctl, msg)
    assert out["type"] == "error" and needle in out["error"], out
    if isinstance(msg, dict):
        assert out["request"] == msg["type"]


def test_actions_policy_dispatch_trace(ctl, tmp_path):
    assert comm.reply(ctl, {"type": "policy", "policy": "share", "id": 5}) == \
        {"type": "policy", "policy": "share", "id": 5}
    assert ctl.policy == "share"
    assert comm.reply(ctl, {"type": "dispatch", "dispatch": "sequential"})["dispatch"] == \
        "sequential" == ctl.dispatch
    f = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1))
    f(np.arange(4.0)).result()
    out = comm.reply(ctl, {"type": "trace", "path": "t.json", "id": "x"}, root=tmp_path)
    assert out["type"] == "trace" and out["id"] == "x" and out["events"] >= 1
    assert out["path"] == str(tmp_path.resolve() / "t.json")
    assert json.loads(Path(out["path"]).read_text())["traceEvents"]
    bad = comm.reply(ctl, {"type": "trace", "path": "no/dir/t.json"}, root=tmp_path)
    assert bad["type"] == "error" and "writable directory" in bad["error"]


def test_cancel_a_running_program_by_run_id(ctl):
    gate, entered = threading.Event(), threading.Event()
    out = gated_program(ctl, gate, entered)(np.ones(4, np.float32))
    try:
        assert entered.wait(60)  # the first node runs: cancelling stops only the second
        status = comm.status_message(ctl)["data"]
        assert [r["id"] for r in status["runs"]] == [out.run.id]
        reply = comm.reply(ctl, {"type": "cancel", "run": out.run.id})
        assert reply == {"type": "cancel", "run": out.run.id, "cancelled": 1}
        missing = comm.reply(ctl, {"type": "cancel", "run": out.run.id + 1000})
        assert missing["type"] == "error" and f"[{out.run.id}]" in missing["error"]
    finally:
        gate.set()
    assert out.run.wait(60)
    with pytest.raises(pw.PathwaysError):
        out.result(timeout=60)
    assert comm.status_message(ctl)["data"]["runs"] == []


def test_utilization_counts_finished_and_running_work():
    trace = Trace()
    for t0, t1, devices in [(0.0, 1.0, (0,)), (9.0, 9.5, (0, 1)), (9.2, 9.8, (0,))]:
        trace.record(kind="compute", name="f", program="p", program_id=0, client="default",
                     island=0, devices=devices, t_submit=t0, t_start=t0, t_end=t1)
    trace.record(kind="transfer", name="t", program="p", program_id=0, client="default",
                 island=0, devices=(3,), t_submit=9.0, t_start=9.0, t_end=10.0)
    util = comm.Utilization(window=2.0)
    use = util.sample(trace, running=[(9.5, (2,))], now=10.0)
    # device 0: [9.0, 9.8] (overlaps merged) = 0.8 s of 2 s; devices 1 and 2: 0.5 s;
    # transfers are not device compute time
    assert use == pytest.approx({0: 0.4, 1: 0.25, 2: 0.25})
    assert util.sample(trace, running=[], now=100.0) == {}  # everything left the window


def test_push_thread_stops_when_the_connection_closes(ctl):
    got: list[dict] = []
    pushed = threading.Event()

    def send(msg):
        got.append(msg)
        if len(got) >= 2:
            pushed.set()

    conn = comm.Connection(send, lambda: ctl)
    try:
        assert conn.handle({"type": "subscribe", "interval": 0.1})["type"] == "status"
        thread = conn.thread
        assert thread is not None and thread.is_alive()
        f = pw.function(lambda x: x + 1, slice=ctl.slice(1, island=0))
        f(np.ones(3)).result()  # a change in the status, so the pusher sends it
        assert pushed.wait(60), got
        assert conn in comm.connections()
    finally:
        conn.close()
    assert not thread.is_alive() and conn.thread is None
    assert conn not in comm.connections()
    assert not [t for t in threading.enumerate() if t.name == thread.name]


# --- the protocol, in a real kernel --------------------------------------------------------
def test_kernel_pushes_status_and_answers_actions(kernel):
    c = CommClient(kernel, "pw-sidebar-test")
    c.open({"interval": 0.2})
    first = c.next()  # the kernel has left JAX alone: no controller yet
    assert first["type"] == "status" and first["data"]["started"] is False
    assert first["data"]["islands"] == [] and first["data"]["protocol"] == comm.PROTOCOL
    run_code(kernel, "import threading, jax, numpy as np, pwkernel as pw\n"
                     + inspect.getsource(gated_program) + "\ngate = threading.Event()\n"
                     "y = gated_program(pw.controller(), gate)(np.ones(4, np.float32))\n")
    # pushed by the comm's thread (nobody asked): the program shows as running on island 0
    pushed = c.next(lambda d: d["type"] == "status" and d["data"]["runs"]
                    and d["data"]["runs"][0]["state"] == "running")
    assert pushed["data"]["started"] is True and len(pushed["data"]["islands"]) == 2
    (run,) = pushed["data"]["runs"]
    assert run["name"] == "gated" and run["state"] == "running" and run["running_on"] == [0]
    c.request({"type": "cancel", "run": run["id"], "id": 1})
    assert c.next(lambda d: d.get("id") == 1) == \
        {"type": "cancel", "run": run["id"], "cancelled": 1, "id": 1}
    c.request({"type": "policy", "policy": "priority", "id": 2})
    assert c.next(lambda d: d.get("id") == 2)["policy"] == "priority"
    c.request({"type": "policy", "policy": "nope", "id": 3})
    bad = c.next(lambda d: d.get("id") == 3)
    assert bad["type"] == "error" and "'nope'" in bad["error"]
    run_code(kernel, "gate.set(); y.run.wait(60)")
    c.next(lambda d: d["type"] == "status" and not d["data"]["runs"])
    alive = "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('pwkernel-'" \
            "'comm')))"
    assert "pwkernel-comm-" in run_code(kernel, alive)
    c.close()
    # comm_close is handled before the next execute_request: the push thread is gone by then
    assert run_code(kernel, alive).strip() == "[]"
    c.request({"type": "status", "id": 4})  # a closed comm answers nothing; the kernel lives
    assert run_code(kernel, "print(pw.controller().policy)").strip() == "priority"

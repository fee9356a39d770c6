"""The controller's life cycle, the process-wide controller, transfers and the link model."""

from __future__ import annotations

import gc
import sys
import threading

import jax
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from tests.helpers.gang_order import LaunchLog
from tests.helpers.programs import gate


def test_process_wide_controller_is_created_once_and_follows_the_environment(monkeypatch):
    monkeypatch.setenv("PWKERNEL_ISLANDS", "2,3")
    ctl = pw.controller()
    try:
        assert pw.controller() is ctl
        assert [len(i.devices) for i in ctl.islands] == [2, 3]
    finally:
        ctl.close()
    fresh = pw.controller(islands=(4, 4))
    try:
        assert fresh is not ctl and not fresh.closed
    finally:
        fresh.close()


def test_process_wide_controller_refuses_settings_it_was_not_made_with():
    """pw.controller(...) with settings the process-wide controller lacks used to return it
    all the same: a memory budget asked for was silently not there. The same settings (or
    none) still give it back."""
    ctl = pw.controller(islands=(2, 2))
    try:
        assert pw.controller(islands=(2, 2)) is ctl and pw.controller(policy="fifo") is ctl
        with pytest.raises(ValueError, match=r"memory_budget=1024\): the process-wide .* fixed "
                           r"when it is made.*pw\.Controller\(memory_budget=1024\)"):
            pw.controller(memory_budget=1024)
        with pytest.raises(ValueError, match=r"pw\.controller\(islands=\(4, 4\), pool='p'\)"):
            pw.controller(islands=(4, 4), pool="p")
        assert pw.controller() is ctl and ctl.memory_budget is None
    finally:
        ctl.close()


def test_threads_asking_for_the_process_wide_controller_at_once_get_one(recwarn):
    """Each thread that found none made its own: four controllers over the same devices, each
    with its own gang scheduler (a SharedDevicesWarning each), three of them never closed."""
    start, got = threading.Barrier(4), []

    def ask():
        start.wait()
        got.append(pw.controller(islands=(4, 4)))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = {id(c): c for c in got}
    for ctl in made.values():
        ctl.close()
    assert len(got) == 4 and len(made) == 1
    assert not [w for w in recwarn if issubclass(w.category, pw.SharedDevicesWarning)]


def test_a_misspelt_setting_of_the_process_wide_controller_is_a_type_error():
    """Once it existed, pw.controller(memory_bugdet=...) said the setting "would be ignored"
    and suggested pw.Controller(memory_bugdet=...), which fails too; it is the TypeError
    a misspelt keyword gives, named, whether the controller exists yet or not."""
    ctl = pw.controller(islands=(2, 2))
    try:
        for _ in range(2):
            with pytest.raises(TypeError, match=r"pw.controller\(\) got an unexpected keyword "
                                                r"argument 'memory_bugdet'.*memory_budget"):
                pw.controller(memory_bugdet=1024)
            ctl.close()
    finally:
        ctl.close()


def test_islands_none_on_cpu_is_the_default_two_by_four():
    ctl = pw.Controller(islands=None)
    try:
        assert [len(i.devices) for i in ctl.islands] == [4, 4]
        assert repr(ctl) == ("Controller(islands={0: 4 cpu, 1: 4 cpu}, policy='fifo', "
                             "dispatch='parallel')")
    finally:
        ctl.close()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(islands=(0, 4)), pw.DeviceSetupError, "positive device counts"),
        (dict(policy="random"), ValueError, "expected one of"),
        (dict(dispatch="eager"), ValueError, "'parallel' or 'sequential'"),
        (dict(memory_budget=-1), ValueError, "memory_budget"),
        (dict(memory_budget="1GB"), ValueError, "memory_budget must be a finite positive"),
        (dict(memory_budget=True), ValueError, "memory_budget must be a finite positive"),
        (dict(memory_budget=float("inf")), ValueError, "or None .no budget."),
        (dict(dcn=10e9), TypeError, "pw.Link"),
    ],
)
def test_bad_controller_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        pw.Controller(**kwargs)


def test_bad_environment_islands(monkeypatch):
    monkeypatch.setenv("PWKERNEL_ISLANDS", "four")
    with pytest.raises(pw.DeviceSetupError, match="PWKERNEL_ISLANDS=4,4"):
        pw.controller()


def test_transfers_overlap_with_computation(ctl):
    entered, release = threading.Event(), threading.Event()
    busy = pw.function(gate(entered, release), slice=ctl.slice(1, island=0))
    held = busy(np.ones(2, np.float32))
    assert entered.wait(60)  # island 0's device 0 is now occupied
    src = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=1))
    dst = ctl.slice(2, island=0)
    moved = pw.function(lambda x: x, slice=dst)  # placed beside busy: devices 1, 2
    assert not set(dst.device_ids) & {0}
    value = src(np.arange(4, dtype=np.float32))
    value.result(timeout=60)
    out = moved(value)  # a DCN transfer into island 0 while it computes
    assert out.result(timeout=60).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert not held.done()
    release.set()
    held.result(timeout=60)


def test_emulated_dcn_link_holds_transfers_to_its_bandwidth():
    link = pw.Link(bandwidth=1e6, latency=1e-3)  # 1 MB/s
    ctl = pw.Controller(islands=(2, 2), dcn=link)
    try:
        a = pw.function(lambda x: x, slice=ctl.slice(2, island=0))
        b = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1))
        out = pw.program(lambda v: b(a(v)))(np.ones(5000, np.float32))  # 20 kB
        assert np.asarray(out.result(timeout=60))[0] == 2.0
        (dcn,) = [e for e in ctl.trace.events() if e.link == "dcn"]
        assert dcn.nbytes == 20_000
        assert dcn.duration >= link.duration(20_000) == pytest.approx(0.021)
    finally:
        ctl.close()
    with pytest.raises(ValueError, match="bandwidth > 0"):
        pw.Link(bandwidth=0)


@pytest.mark.parametrize("bandwidth, latency", [
    (1e9, float("inf")), (1e9, float("nan")), (float("inf"), 0.0), ("fast", 0.0),
    (True, 0.0), (1e9, None)])
def test_a_link_takes_finite_numbers_only(bandwidth, latency):
    """An infinite latency used to be taken and every copy between islands then waited
    for ever (a NaN one was taken as no latency, a string failed on a bare comparison)."""
    with pytest.raises(ValueError, match="finite numbers"):
        pw.Link(bandwidth=bandwidth, latency=latency)


def test_many_threads_submit_at_once(ctl):
    s = ctl.slice(2)
    f = pw.function(lambda x: x * 2, slice=s)
    out: dict[int, pw.Future] = {}

    def client(k: int) -> None:
        with ctl.client(f"c{k}", weight=1 + k % 3, priority=k % 2):
            out[k] = f(np.full(4, k, np.float32))
            assert ctl.current_client.name == f"c{k}"

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {k: float(np.asarray(v.result(timeout=60))[0]) for k, v in out.items()} == {
        k: 2.0 * k for k in range(8)}
    assert {e.client for e in ctl.trace.events() if e.kind == "compute"} == {
        f"c{k}" for k in range(8)}
    assert ctl.current_client.name == "default"


def test_policy_and_dispatch_switch_at_run_time(ctl, monkeypatch):
    log = LaunchLog().install(monkeypatch)  # the schedulers the switch reaches, at handle()
    ctl.policy = "share"
    ctl.dispatch = "sequential"
    assert (ctl.policy, ctl.dispatch) == ("share", "sequential")
    assert len(log.schedulers) == len(ctl.islands)
    assert all(s.policy == "share" for s in log.schedulers.values())
    f = pw.function(lambda x: x - 1, slice=ctl.slice(1))
    assert f(np.ones(1, np.float32)).result(timeout=60).tolist() == [0.0]
    status = ctl.status()
    assert status["policy"] == "share" and len(status["islands"]) == 2
    with pytest.raises(ValueError, match="client weight"):
        with ctl.client("x", weight=0):
            pass


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -1.0, True, "2", None])
def test_a_client_weight_is_a_finite_positive_number(ctl, weight):
    """As the magics' --weight: an infinite weight is refused (under "share" its client was
    never charged, and every other client waited until it ran out of work), and so are
    values that are not numbers (a raw TypeError before)."""
    with pytest.raises(ValueError, match="client weight must be a finite number > 0"):
        with ctl.client("x", weight=weight):
            pass


@pytest.mark.parametrize("priority", [1.5, "1", None, True])
def test_a_client_priority_is_an_integer(ctl, priority):
    with pytest.raises(ValueError, match="client priority must be an integer"):
        with ctl.client("x", priority=priority):
            pass
    with ctl.client("x", weight=np.float32(2.0), priority=np.int64(3)) as spec:
        assert (spec.weight, spec.priority) == (2.0, 3)


def test_jax_arrays_already_on_the_slice_are_used_in_place(ctl):
    s = ctl.slice(2, island=1)
    f = pw.function(lambda x: x + 1, slice=s, in_specs=pw.BATCH)
    x = jax.device_put(np.zeros(4, np.float32), jax.sharding.NamedSharding(
        s.mesh, jax.sharding.PartitionSpec("x")))
    assert f(x).result(timeout=60).tolist() == [1.0] * 4
    assert [e.kind for e in ctl.trace.events()] == ["compute"]


def test_a_backend_is_a_name_or_an_executor_object():
    from pwkernel.backends.local import LocalBackend

    executor = LocalBackend(islands=(2, 2))
    assert isinstance(executor, pw.Executor)
    with pw.Controller(backend=executor) as ctl:
        assert ctl.executor is executor and ctl.backend == "local"
        assert [len(i.devices) for i in ctl.islands] == [2, 2]
        f = pw.function(lambda x: x * 3, slice=ctl.slice(2, island=1))
        assert f(np.ones(2, np.float32)).result(timeout=60).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match=r"islands=\(4, 2\) but the executor object LocalBa"):
        pw.Controller(islands=(4, 2), backend=LocalBackend(islands=(2, 2)))
    with pytest.raises(TypeError, match="lacks"):
        pw.Controller(backend=object())
    with pytest.raises(ValueError, match="unknown backend 'nope'.*'local'"):
        pw.Controller(backend="nope")


def test_islands_given_with_an_executor_object_must_match_its_islands():
    # Issue 24: islands=(4, 4) (the default's value, given on purpose) used to be ignored.
    from pwkernel.backends.local import LocalBackend

    two = LocalBackend(islands=(2, 2))
    try:
        with pytest.raises(ValueError) as info:
            pw.Controller(islands=(4, 4), backend=two)
    finally:
        two.close()
    text = str(info.value)
    assert text.startswith("islands=(4, 4) but the executor object LocalBackend brings "
                           "islands of (2, 2) devices, and an executor object's own islands "
                           "win"), text
    assert "LocalBackend(islands=(4, 4))" in text and "backend='local', islands=(4, 4)" \
        in text and "\n" not in text
    for same in ({}, {"islands": (2, 2)}, {"islands": None}):  # left out, or no conflict
        with pw.Controller(backend=LocalBackend(islands=(2, 2)), **same) as ctl:
            assert [len(i.devices) for i in ctl.islands] == [2, 2], same
    with pw.Controller(islands=(2, 2)) as ctl:  # by name: islands= is what it builds
        assert [len(i.devices) for i in ctl.islands] == [2, 2]
    with pw.Controller() as ctl:
        assert [len(i.devices) for i in ctl.islands] == list(pw.backends.local.DEFAULT_ISLANDS)


def test_the_runtime_imports_no_backend():
    # Backends plug in from above (a registry the package fills): runtime/ never imports one.
    import ast
    from pathlib import Path

    runtime = Path(pw.__file__).parent / "runtime"
    for path in sorted(runtime.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("backends" in n for n in names), f"{path.name} imports {names}"


_ENDS_WITHOUT_CLOSE = """
import atexit, threading

def after_pwkernel():  # registered first, so it runs after pwkernel's own exit hook
    left = [t.name for t in threading.enumerate() if t.name.startswith("pw-")]
    print("open:", [c for c in ctls if not c.closed], "threads:", left, flush=True)

atexit.register(after_pwkernel)
import jax
jax.config.update("jax_num_cpu_devices", 4)
import jax.numpy as jnp
import pwkernel as pw

ctls = [pw.Controller(islands=(2, 2)), pw.controller(islands=(2,))]
for ctl in ctls:
    step = pw.function(lambda x: jnp.tanh(x @ x.T) @ x, slice=ctl.slice(2))
    x = jnp.ones((256, 256))
    for _ in range(8):
        x = step(x)  # left running: nobody waits for it
# a program across islands, still running at exit: its copy is watched and its future's
# done-callback runs (the interpreter stops its thread pools before atexit's hooks), with the
# value, or the CancelledError of a computation the exit's close found not yet launched
s0, s1 = ctls[0].slice(2, island=0), ctls[0].slice(2, island=1)
slow = pw.function(lambda x: jax.pure_callback(
    lambda v: (threading.Event().wait(0.3), v)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x),
    slice=s0)
inc = pw.function(lambda x: x + 1, slice=s1)
later = pw.program(lambda v: inc(slow(v)))(jnp.zeros(8))
later.add_done_callback(lambda f: print("callback:", type(f.exception()).__name__
                                       if f.exception() else f.result().tolist()[:2], flush=True))
print("submitted", flush=True)
"""


def test_a_script_that_ends_without_closing_its_controllers_exits_cleanly():
    # Before, the interpreter stopped the controllers' watcher threads itself at exit, and one
    # dropping a jax.Array there aborted the process (status 134) in about a third of runs.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ENDS_WITHOUT_CLOSE], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "submitted" and lines[2] == "open: [] threads: []", done.stdout
    assert lines[1] in ("callback: [1.0, 1.0]", "callback: CancelledError"), done.stdout


_LIVE_FUTURES_AT_EXIT = """
import jax
jax.config.update("jax_num_cpu_devices", 2)
import numpy as np
import pwkernel as pw
from pwkernel.runtime import store  # (keeps the module, whose globals the exit then clears)

ctl = pw.Controller(islands=(2,))
f = pw.function(lambda x: x * 2, slice=ctl.slice(2))
ys = [f(np.ones(4, np.float32)) for _ in range(3)]
print(ys[-1].result().tolist(), flush=True)
"""


def test_futures_alive_as_the_interpreter_exits_go_quietly():
    # Before, each future the interpreter dropped after the store module's globals were gone
    # printed "Exception ignored in ... ObjectStore._dropped" with a TypeError (83 of them
    # after a training script with an 83-leaf state).
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LIVE_FUTURES_AT_EXIT], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[2.0, 2.0, 2.0, 2.0]"], done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr[-2000:]


def test_wait_with_a_timeout_gives_up_after_that_long_in_all(ctl):
    """``ctl.wait(timeout)`` is one deadline over every run, not a timeout per run (which
    waited 3 s on six half-second runs for timeout=0.8, and said they had all ended)."""
    s = ctl.slice(2)
    slow = pw.function(lambda x: jax.pure_callback(
        lambda v: (threading.Event().wait(0.4), v)[1], jax.ShapeDtypeStruct(x.shape, x.dtype),
        x), slice=s)
    runs = [slow(np.zeros(4, np.float32)) for _ in range(5)]  # one after another: 2 s
    assert not ctl.wait(timeout=0.6)
    assert not runs[-1].done()
    assert ctl.wait(timeout=60)


def _inside(thread: threading.Thread, code) -> bool:
    """``thread`` is running ``code`` now (some frame of its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def test_a_second_close_returns_once_the_first_has_closed_everything():
    """``close()`` from a second thread while another closes waits for that close to end;
    before, it returned at once, with a computation still running and its thread alive."""
    before = {t.name for t in threading.enumerate() if t.name.startswith("pw-")}
    ctl = pw.Controller(islands=(2, 2))
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release), slice=ctl.slice(1))(np.zeros(2, np.float32))
    assert entered.wait(60)
    first = threading.Thread(target=ctl.close)  # it waits for the gate
    main, close = threading.current_thread(), pw.Controller.close.__code__

    def open_the_gate_once_main_is_in_close():  # (waits on a condition, not for a time)
        while not release.is_set() and not _inside(main, close):
            release.wait(0.001)
        release.set()

    opener = threading.Thread(target=open_the_gate_once_main_is_in_close)
    first.start()
    while not ctl.closed:  # the first close has begun
        release.wait(0.001)
    opener.start()
    try:
        ctl.close()
        done, left = held.done(), {t.name for t in threading.enumerate()
                                   if t.name.startswith("pw-")} - before
    finally:
        release.set()
        first.join(60)
        opener.join(60)
    assert done and not left, (done, left)
    assert held.exception(timeout=0) is None


@pytest.mark.parametrize("gone", ["closed", "released"])
def test_a_first_call_whose_slice_goes_while_it_is_traced_says_so(gone):
    """Another thread closes the controller (or releases the slice) while a first call's
    function is traced: the call raises the slice's own error, not a tracing error; before,
    it said "could not be traced" and blamed JAX ("JAX raised it while tracing")."""
    ctl = pw.Controller(islands=(2, 2))
    vs = ctl.slice(1)
    tracing, go = threading.Event(), threading.Event()

    def body(x):
        tracing.set()
        assert go.wait(60)
        return x * 2

    f, got = pw.function(body, slice=vs), []

    def first_call():
        try:
            got.append(f(np.ones(2, np.float32)))
        except Exception as e:  # noqa: BLE001 - handed to the test to assert on
            got.append(e)

    caller = threading.Thread(target=first_call)
    caller.start()
    try:
        assert tracing.wait(60)
        ctl.close() if gone == "closed" else vs.release()
    finally:
        go.set()
        caller.join(60)
        ctl.close()
    (error,) = got
    expected = pw.ControllerClosedError if gone == "closed" else pw.SliceError
    assert type(error) is expected, repr(error)
    assert "could not be traced" not in str(error) and f"slice {vs.id}" in str(error)


class _CancelledAtSubmission(LocalBackend):
    """A local backend whose ``submitted`` hook (the moment a run joins the controller's runs,
    before its tasks start) lets another thread run ``ctl.cancel_all()`` to its end."""

    ctl = None

    def submitted(self, run):
        if self.ctl is not None:
            canceller = threading.Thread(target=self.ctl.cancel_all, name="canceller")
            canceller.start()
            canceller.join(timeout=60)
            assert not canceller.is_alive()


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_cancel_all_from_another_thread_as_a_run_is_submitted_cancels_it(dispatch):
    backend = _CancelledAtSubmission(islands=(2, 2))
    ctl = pw.Controller(backend=backend, dispatch=dispatch)
    try:
        s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
        a = pw.function(lambda v: v * 2, slice=s0)
        b = pw.function(lambda v: v + 1, slice=s1)

        @pw.program
        def p(v):
            return b(a(v))

        x = np.arange(4.0, dtype=np.float32)
        backend.ctl = ctl
        y = p(x)  # (raised a TypeError: the run was ended before its start read its values)
        backend.ctl = None
        with pytest.raises(pw.CancelledError):
            y.result(timeout=60)
        del y
        gc.collect()
        assert ctl.wait(timeout=60) and ctl.runs() == []
        assert sum(ctl.memory().values()) == 0
        np.testing.assert_allclose(np.asarray(p(x).result(timeout=60)), x * 2 + 1)
    finally:
        ctl.close()

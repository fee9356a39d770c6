"""Ctrl-C while the main thread is inside the runtime (``runtime/interrupts.py``): the work in
hand ends whole, then the interrupt is raised; the island is never left waiting for an end
nobody reports, and no buffer leaks.

The interrupt is delivered for real (``_thread.interrupt_main``, what a notebook's stop button
does through SIGINT) at the first Python call of a chosen runtime function in the main thread.
"""

from __future__ import annotations

import _thread
import gc
import signal
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.local.executor import LocalBackend
from pwkernel.runtime import interrupts
from pwkernel.runtime.store import ObjectStore
from pwkernel.runtime.tasks import Task


class _InterruptAt:
    """Deliver one interrupt to the main thread when it enters ``code`` (one at each of
    ``codes``, entered in that order)."""

    def __init__(self, *codes):
        self.codes, self.fired = list(codes), False

    def __enter__(self):
        def profile(frame, event, _arg):
            if event == "call" and self.codes and frame.f_code is self.codes[0]:
                self.codes.pop(0)
                self.fired = not self.codes
                if self.fired:  # (off before the interrupt can come, wherever that is)
                    sys.setprofile(None)
                _thread.interrupt_main()
        sys.setprofile(profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        return False


@pytest.fixture
def handler():
    """Python's default SIGINT handler around the test (the runtime's goes over it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _settled(ctl: pw.Controller, f, x) -> None:
    """The island still works: everything submitted ends, a new call runs, nothing is held."""
    assert ctl.wait(timeout=60), "a run never ended: the island waits for a lost end"
    np.testing.assert_allclose(np.asarray(f(x).result(timeout=60)), np.asarray(x) * 2 + 1)
    gc.collect()
    assert ctl.wait(timeout=60)
    assert sum(ctl.memory().values()) == 0, ctl.memory()


@pytest.mark.parametrize("where", [LocalBackend.launch, Task.report_end],
                         ids=["launch", "end"])
def test_an_interrupt_inside_a_call_is_raised_after_it_and_leaves_the_island_working(
        handler, where):
    ctl = pw.Controller(islands=(4,))
    try:
        f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4))
        x = jnp.arange(8.0)
        f(x).result()  # compiled: the interrupt lands in the launch, not in tracing
        with pytest.raises(KeyboardInterrupt), _InterruptAt(where.__code__) as hook:
            for _ in range(50):  # (an end is reported by this thread within a few calls)
                f(x)
        assert hook.fired
        _settled(ctl, f, x)
    finally:
        ctl.close()


def test_an_interrupt_inside_a_donating_call_comes_after_the_caller_took_its_result(handler):
    """``w = step(w)`` with ``donate_argnums``: Ctrl-C inside the call is raised once it has
    returned, at the next call's start, so ``w`` is the state that call made. Raised inside
    it, the new state's only future was dropped after the old state's buffers were donated:
    the training state was lost on every interrupt."""
    ctl = pw.Controller(islands=(4,))
    try:
        step = pw.function(lambda v: v + 1, slice=ctl.slice(4), donate_argnums=0)
        w = step(jnp.zeros(8))
        w.wait()
        with pytest.raises(KeyboardInterrupt), _InterruptAt(LocalBackend.launch.__code__) as hook:
            for _ in range(50):
                w = step(w)
        assert hook.fired
        assert w.result(60).tolist() == [2.0] * 8  # the interrupted call's result, kept
        assert ctl.wait(timeout=60)
    finally:
        ctl.close()


@pytest.mark.parametrize("where", ["_free", "_dropped"])
def test_an_interrupt_inside_a_free_keeps_the_free_whole_and_is_raised_by_the_next_call(
        handler, where):
    """Inside the free, or at the start of the weak reference's callback that calls it
    (``_dropped``): Python checks for a signal on entering a function, so Ctrl-C as the
    garbage collector calls a dropped future's callback, before its hold, was raised there,
    where Python ignores it ("Exception ignored in ... _dropped"): the free never ran, and the
    buffer stayed counted in ``ctl.memory()`` for the controller's life."""
    ctl = pw.Controller(islands=(4,))
    try:
        f, x, y = _one_result(ctl)
        assert sum(ctl.memory().values()) > 0
        with pytest.raises(KeyboardInterrupt):  # kept, not lost: the next call raises it (or
            with _InterruptAt(getattr(ObjectStore, where).__code__) as hook:  # GRACE later)
                del y  # freed by the weak reference's callback, where Python ignores it
            f(x)
        assert hook.fired
        assert sum(ctl.memory().values()) == 0, "the interrupted free leaked its buffer"
        _settled(ctl, f, x)
    finally:
        ctl.close()


def _one_result(ctl: pw.Controller):
    """A function on an island's 4 devices, an input, and its result (ended)."""
    f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4))
    x = jnp.arange(8.0)
    y = f(x)
    y.wait()
    return f, x, y


def _spin(seconds: float) -> None:
    """The user's own code running (no runtime call) for up to ``seconds``: a bound on a
    failure, never waited for when the interrupt comes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@pytest.mark.parametrize("user", ["running", "blocked"])
def test_an_interrupt_inside_a_free_is_raised_without_another_call(handler, user):
    """``state, loss = step(state, batch)`` drops the old state, freed by the weak references'
    callbacks: Ctrl-C there was kept until the next runtime call, with no timer (a script got
    it at some later, unrelated call; a notebook's next cell dropped it). It is raised in the
    main thread once, soon after the free, wherever the user's code is: running Python, or
    blocked in a wait (``threading.Event().wait``, ``time.sleep``), which it ends as Ctrl-C
    does (before, the wait ran to its end first)."""
    ctl = pw.Controller(islands=(4,))
    try:
        f, x, y = _one_result(ctl)
        raised_in = None
        try:
            with _InterruptAt(ObjectStore._free.__code__) as hook:
                del y  # freed by the weak reference's callback, where Python ignores exceptions
            assert hook.fired
            t0 = time.monotonic()
            _spin(20) if user == "running" else threading.Event().wait(20)
        except KeyboardInterrupt:
            raised_in = threading.current_thread()
            assert time.monotonic() - t0 < 10, "raised only once the user's wait had ended"
        if raised_in is None:
            with pytest.raises(KeyboardInterrupt):  # (kept for the next call: taken here)
                f(x)
        assert raised_in is threading.main_thread(), "kept until the next runtime call"
        assert sum(ctl.memory().values()) == 0, "the interrupted free leaked its buffer"
        _settled(ctl, f, x)  # (runtime calls: none raises it again)
    finally:
        ctl.close()


def test_an_interrupt_while_closing_is_raised_once_closing_is_done(handler):
    """Ctrl-C inside ``ctl.close()`` (it waits for what is running): the close finishes, then
    the interrupt is raised. Raised half-way, it left a controller marked closed that kept
    its threads, buffers and slices, and that a second ``close()`` did not finish."""
    from pwkernel.runtime.dispatcher import Dispatcher

    ctl = pw.Controller(islands=(4,))
    f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4))
    kept = f(jnp.arange(8.0))
    kept.wait()
    with pytest.raises(KeyboardInterrupt), _InterruptAt(Dispatcher.shutdown.__code__) as hook:
        ctl.close()
    assert hook.fired and ctl.closed
    assert ctl.store.records() == [] and ctl.resources.slices == ()
    assert not [t for t in threading.enumerate() if t.name.startswith("pw-island")]


def test_an_interrupt_while_waiting_on_a_simulated_cluster_loses_no_event(handler):
    """``ctl.wait()`` on ``backend="sim"`` moves the virtual clock event by event: Ctrl-C
    that landed in an event after it was taken off the heap dropped it, its computation
    never ended, and every later wait on the controller hung."""
    from pwkernel.backends.sim import executor as sim_executor

    ctl = pw.Controller(backend="sim", cluster="tpu-v4", islands=(4,))
    try:
        f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4))
        x = jnp.arange(8.0)
        f(x).wait()
        with pytest.raises(KeyboardInterrupt), \
                _InterruptAt(sim_executor._report.__code__) as hook:
            ys = [f(x) for _ in range(3)]
            ctl.wait()
        assert hook.fired
        assert ctl.wait(timeout=60), f"a computation never ended: {ctl.status()['programs']}"
        assert all(y.done() for y in ys) and f(x).wait(timeout=60)
    finally:
        ctl.close()


def _chain(ctl: pw.Controller, steps: int) -> list:
    f = pw.function(lambda v: v * 2 + 1, slice=ctl.slice(4))
    ys = [f(jnp.arange(8.0))]
    for _ in range(steps):
        ys.append(f(ys[-1]))
    return ys


def test_ctrl_c_interrupts_a_long_simulated_wait_between_two_events(handler):
    """``fut.result()`` on ``backend="sim"`` is a whole simulation: Ctrl-C was held across
    it, so it came only once the wait ended (a long simulation ran to its end first). Now it
    is raised after the event in hand, and the future stays valid: waiting again continues
    the simulation, which ends where one never interrupted does."""
    from pwkernel.backends.sim import executor as sim_executor

    with pw.Controller(backend="sim", cluster="tpu-v4", islands=(4,)) as plain:
        expected = [y.t_done for y in _chain(plain, 100) if y.wait(timeout=60)]
    with pw.Controller(backend="sim", cluster="tpu-v4", islands=(4,)) as ctl:
        ys = _chain(ctl, 100)
        with pytest.raises(KeyboardInterrupt), \
                _InterruptAt(sim_executor._report.__code__) as hook:
            ys[-1].result(timeout=60)
        assert hook.fired
        assert sum(y.done() for y in ys) < 5, "raised only once the wait had ended"
        assert ys[-1].wait(timeout=60)
        assert [y.t_done for y in ys] == expected  # no event lost, none run twice


def test_ctrl_c_interrupts_a_simulated_wait_that_never_ends(handler):
    """A simulated future that waits for memory its user never frees: its wait moves no
    clock and naps until another thread adds work. Ctrl-C, held across that wait, was never
    raised: the kernel could not be interrupted. (The timeout turns that hang into a
    failure.)"""
    with pw.Controller(backend="sim", cluster="tpu-v4", islands=(4,),
                       memory_budget=1024) as ctl:
        f = pw.function(lambda v: v + 1, slice=ctl.slice(4))
        x = np.ones(64, np.float32)  # 256 B per device
        kept = [f(x) for _ in range(3)]  # the user's: 768 B of 1 KiB, no room for another
        assert all(k.wait(timeout=60) for k in kept)
        y = f(x)  # waits for room
        with pytest.raises(KeyboardInterrupt), \
                _InterruptAt(threading.Condition.wait.__code__) as hook:
            y.wait(timeout=60)
        assert hook.fired and not y.done()
        del kept
        gc.collect()
        assert y.wait(timeout=60)  # the same future, once there is room


def test_the_handler_replaces_only_pythons_default(handler):
    assert interrupts.install()
    mine = signal.getsignal(signal.SIGINT)
    assert mine is not signal.default_int_handler
    own = signal.signal(signal.SIGINT, lambda *a: None)  # a handler of the user's own
    try:
        assert not interrupts.install()
        assert signal.getsignal(signal.SIGINT) is not mine
    finally:
        signal.signal(signal.SIGINT, own)
    with pytest.raises(KeyboardInterrupt):  # outside a hold: raised where it lands
        _thread.interrupt_main()
        for _ in range(10):
            pass


def test_futures_alive_at_interpreter_exit_go_quietly():
    """A script that ends holding futures of a closed controller exits without "Exception
    ignored" noise (their frees run after the modules' globals are gone)."""
    script = ("import jax\njax.config.update('jax_num_cpu_devices', 8)\n"
              "import numpy as np, pwkernel as pw\nctl = pw.Controller(islands=(4, 4))\n"
              "y = pw.function(lambda a: a + 1, slice=ctl.slice(2, island=0))(np.arange(4.0))\n"
              "print(y.result())\nctl.close()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "[1. 2. 3. 4.]" in done.stdout
    assert done.stderr.strip() == "", done.stderr


def test_a_second_interrupt_as_a_call_ends_its_hold_keeps_the_calls_result(handler):
    """Two Ctrl-Cs (a press and the runtime's own re-raise, or two presses): the first inside
    a donating call's launch, the second as the call's hold ends (starting the timer that
    raises the first). Raised there, inside the call, the second lost the new state after
    the old one was donated (a stress of Ctrl-C on a Pipeline loop found it)."""
    ctl = pw.Controller(islands=(4,))
    try:
        step = pw.function(lambda v: v + 1, slice=ctl.slice(4), donate_argnums=0)
        w = step(jnp.zeros(8))
        w.wait()
        with pytest.raises(KeyboardInterrupt), _InterruptAt(
                LocalBackend.launch.__code__, interrupts._raise_later.__code__) as hook:
            for _ in range(50):
                w = step(w)
        assert hook.fired
        assert w.result(60).tolist()[0] >= 2.0  # the state in hand is whole
        assert ctl.wait(timeout=60)
    finally:
        ctl.close()


def test_an_interrupt_ends_a_close_that_a_blocked_done_callback_holds(handler):
    """A done-callback that never returns (it waits for work the closing thread was to do)
    held ``ctl.close()`` for good, and with Ctrl-C held off inside close there was no way
    out. An interrupt now ends close's wait for the callbacks: the controller closes without
    them, says so, and the interrupt is raised."""
    from pwkernel.runtime import done_callbacks

    ctl = pw.Controller(islands=(2,))
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def blocked(_fut):
        started.set()
        release.wait(20)  # (before, close returned only once this gave up)
        ended.set()

    try:
        y = pw.function(lambda x: x + 1, slice=ctl.slice(1))(np.ones(4, np.float32))
        done_callbacks.runner.submit([blocked], y)  # (as a resolving future queues it:
        # add_done_callback on a future done already runs it at once, in this thread)
        assert started.wait(60)
        with pytest.warns(RuntimeWarning, match=r"close\(\) was interrupted while a "
                                                r"done-callback still ran"), \
                _InterruptAt(done_callbacks.CallbackRunner.wait_idle.__code__), \
                pytest.raises(KeyboardInterrupt):
            ctl.close()
        assert ctl.closed and not ended.is_set()  # closed while the callback still waits
    finally:
        release.set()
        ctl.close()
    assert done_callbacks.runner.wait_idle(60)


def test_an_interrupt_landing_in_a_gc_callback_is_kept_and_raised():
    """A kept interrupt the courier delivers ``GRACE`` later may land while the main thread runs
    a callback of the garbage collector (JAX's ``_xla_gc_callback``), where Python prints
    "Exception ignored" and drops it: it was lost. It is kept again, and raised soon after,
    wherever the user's code is by then (here, blocked in a wait it ends). In a process of its
    own: an interrupt an earlier test kept can land in the collection and take this one's."""
    script = """
import jax
jax.config.update("jax_num_cpu_devices", 4)
import gc, threading, time
import pwkernel as pw
from pwkernel.runtime import interrupts
ctl = pw.Controller(islands=(4,))
landed, armed = [], threading.Event()
def collecting(phase, _info):
    if phase == "start" and armed.is_set() and not landed:
        landed.append(True)
        interrupts._interrupt_main()  # (as the courier delivers one)
        for _ in range(3):  # (Python runs the handler here, inside the callback)
            pass
gc.callbacks.append(collecting)
t0 = time.monotonic()
try:
    armed.set()
    gc.collect()
    threading.Event().wait(20)
    print("lost")
except KeyboardInterrupt:
    print("raised", round(time.monotonic() - t0, 1), bool(landed), interrupts.kept())
gc.callbacks.remove(collecting)
ctl.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    words = done.stdout.split()
    assert words and words[0] == "raised", f"the interrupt was lost: {done.stdout}{done.stderr}"
    assert float(words[1]) < 10 and words[2:] == ["True", "False"], done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr

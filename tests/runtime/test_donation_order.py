"""A call that donates a value goes after the program's earlier reads of it, as under
``jax.jit``, whose dispatch order is program order: XLA holds a buffer for the calls
dispatched before the one that consumes it. Here an earlier reader may wait longer (for a
value from another island, for memory) than the donating call, which then waits for it
(``plan.py``, ``gates``)."""

from __future__ import annotations

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from tests.helpers.programs import gate

TIMEOUT = 60.0
N = 1024


def _calls(ctl, far=lambda h: h + 1, read=lambda x, r: x + 5 + r[0] * 0):
    """Two slices, one per island; on island 0 ``a`` (``x * 2``), ``read`` (of ``x`` and of
    ``far``'s result) and ``eat`` (``x + 1``, donating ``x``); ``far`` on island 1."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    return (s0, s1, pw.function(lambda x: x * 2, slice=s0, name="a"),
            pw.function(far, slice=s1, name="far"), pw.function(read, slice=s0, name="read"),
            pw.function(lambda x: x + 1, slice=s0, donate_argnums=0, name="eat"))


def _failing(h):
    """A computation whose host callback raises: it fails."""
    def check(v):
        raise ValueError("no")
    return jax.pure_callback(check, jax.ShapeDtypeStruct(h.shape, h.dtype), h)


def _held_island_one(ctl):
    """Island 1's four devices held by a gate until ``release`` is set."""
    quad = ctl.slice(4, island=1)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release, quad.mesh), slice=quad, in_specs=pw.BATCH,
                       name="gate")(np.ones(4, np.float32))
    assert entered.wait(TIMEOUT)
    return held, release


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donating_call_waits_for_an_earlier_reader_held_up_by_another_island(dispatch):
    with pw.Controller(islands=(4, 4), dispatch=dispatch) as ctl:
        s0, s1, a, far, read, eat = _calls(ctl)

        @pw.program
        def p(v, h):
            y = a(v)
            z = read(y, far(h))  # reads y, but waits for island 1, held below
            w = eat(y)           # then consumes y
            return z, w

        held, release = _held_island_one(ctl)
        n0 = ctl.trace.next_index
        z, w = p(np.ones(N, np.float32), np.ones(8, np.float32))
        assert ctl.trace.wait_for(n0 + 1, TIMEOUT)  # y is made; island 1 still held
        assert not z.done()
        release.set()
        held.result(TIMEOUT)
        assert z.result(TIMEOUT).tolist() == [7.0] * N  # (before: "Array has been deleted")
        assert w.result(TIMEOUT).tolist() == [3.0] * N


def test_a_donating_call_waits_for_an_earlier_copy_held_up_by_memory():
    with pw.Controller(islands=(4, 4), memory_budget=3_000_000) as ctl:
        s0, s1, a, far, _, eat = _calls(ctl, far=lambda x: x + 5)
        hold = pw.function(lambda: jnp.ones(600_000, jnp.float32), slice=s1)()
        hold.result(TIMEOUT)  # island 1 nearly full: the copy of y waits for memory

        @pw.program
        def p(v):
            y = a(v)
            return far(y), eat(y)  # far's copy reads y first, then eat consumes it

        n0 = ctl.trace.next_index
        z, w = p(np.ones(250_000, np.float32))
        assert ctl.trace.wait_for(n0 + 1, TIMEOUT)  # y is made; its copy waits
        assert not z.done()
        del hold  # the copy is admitted
        assert z.result(TIMEOUT)[0] == 7.0  # (before: "Array has been deleted")
        assert w.result(TIMEOUT)[0] == 3.0


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donating_call_still_runs_when_an_earlier_reader_fails(dispatch):
    with pw.Controller(islands=(4, 4), dispatch=dispatch) as ctl:
        s0, s1, a, fails, read, eat = _calls(ctl, far=_failing, read=lambda x, r: x + r[0])

        @pw.program
        def p(v, h):
            y = a(v)
            z = read(y, fails(h))  # never launches: its other input fails
            return z, eat(y)

        z, w = p(np.ones(8, np.float32), np.ones(8, np.float32))
        assert w.result(TIMEOUT).tolist() == [3.0] * 8  # as under jax.jit: not held up
        with pytest.raises(ValueError, match="no"):
            z.result(TIMEOUT)


# --- across calls: a later call that donates waits for earlier calls reading the value ------

@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donating_call_waits_for_an_earlier_call_reading_its_argument(dispatch):
    """``read`` is called before ``eat`` and reads ``y``, but waits for island 1 (held):
    under ``jax.jit`` it is dispatched first and XLA holds ``y`` for it, so ``eat``, called
    next and ready at once, must not consume ``y`` before ``read`` has launched."""
    with pw.Controller(islands=(4, 4), dispatch=dispatch) as ctl:
        s0, s1, a, far, read, eat = _calls(ctl)
        y = a(np.ones(N, np.float32))
        y.result(TIMEOUT)  # (before the hold: held devices can keep XLA's CPU threads busy)
        held, release = _held_island_one(ctl)
        z = read(y, far(np.ones(8, np.float32)))  # waits for island 1
        w = eat(y)                                # ready at once, but called after read
        assert not z.done()
        release.set()
        held.result(TIMEOUT)
        assert z.result(TIMEOUT).tolist() == [7.0] * N  # (before: "given to an earlier call")
        assert w.result(TIMEOUT).tolist() == [3.0] * N
        assert y.donated


def test_a_donating_call_waits_for_earlier_reads_on_another_island():
    """An eval on another island reads the parameters through a copy, which waits for
    memory there: the next step, which donates them, waits for the copy to start."""
    with pw.Controller(islands=(4, 4), memory_budget=3_000_000) as ctl:
        s0, s1, a, far, _, eat = _calls(ctl, far=lambda x: x + 5)
        hold = pw.function(lambda: jnp.ones(600_000, jnp.float32), slice=s1)()
        hold.result(TIMEOUT)  # island 1 nearly full: far's copy of y waits for memory
        y = a(np.ones(250_000, np.float32))
        y.result(TIMEOUT)
        z = far(y)
        w = eat(y)
        assert not z.done()
        del hold  # the copy is admitted
        assert z.result(TIMEOUT)[0] == 7.0  # (before: "given to an earlier call")
        assert w.result(TIMEOUT)[0] == 3.0


@pytest.mark.parametrize("how", ["fails", "cancelled"])
def test_a_donating_call_goes_when_the_earlier_reader_never_runs(how):
    with pw.Controller(islands=(4, 4)) as ctl:
        s0, s1, a, first, read, eat = _calls(
            ctl, far=_failing if how == "fails" else (lambda h: h + 1), read=lambda x, r: x + r[0])
        held, release = _held_island_one(ctl)
        y = a(np.ones(8, np.float32))
        z = read(y, first(np.ones(8, np.float32)))
        w = eat(y)
        if how == "cancelled":
            assert z.cancel()  # its run is dropped before it ran
        release.set()
        assert w.result(TIMEOUT).tolist() == [3.0] * 8  # not held up for ever
        with pytest.raises((ValueError, pw.CancelledError)):
            z.result(TIMEOUT)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donating_call_waits_for_an_earlier_call_reading_the_users_array(dispatch):
    """The same for a ``jax.Array`` of the user's: ``eat`` was asked to donate it, but not
    before ``read``, called first, has read it."""
    with pw.Controller(islands=(4, 4), dispatch=dispatch) as ctl:
        s0, s1, _, far, read, eat = _calls(ctl)
        y = jax.device_put(np.full(N, 2.0, np.float32), NamedSharding(s0.mesh, P()))
        held, release = _held_island_one(ctl)
        z = read(y, far(np.ones(8, np.float32)))  # waits for island 1
        w = eat(y)
        release.set()
        held.result(TIMEOUT)
        assert z.result(TIMEOUT).tolist() == [7.0] * N  # (before: "Array has been deleted")
        assert w.result(TIMEOUT).tolist() == [3.0] * N
        assert y.is_deleted()  # donated, as asked


@pytest.mark.parametrize("read_first", ["the result", "the future"])
def test_a_future_and_its_result_are_one_value_to_wait_for(read_first):
    """``y.result()`` is ``y``'s buffer: ``read`` given one and ``eat`` (donating, called
    next) given the other still go in call order (before: ``read`` failed with "Array has
    been deleted ... given to an earlier call that donates it")."""
    with pw.Controller(islands=(4, 4)) as ctl:
        s0, s1, a, far, read, eat = _calls(ctl)
        y = a(np.ones(N, np.float32))
        value = y.result(TIMEOUT)
        held, release = _held_island_one(ctl)
        first, then = (value, y) if read_first == "the result" else (y, value)
        z = read(first, far(np.ones(8, np.float32)))  # waits for island 1
        w = eat(then)
        release.set()
        held.result(TIMEOUT)
        assert z.result(TIMEOUT).tolist() == [7.0] * N
        assert w.result(TIMEOUT).tolist() == [3.0] * N


class _ActsAsIslandsGetARun(LocalBackend):
    """A local backend that lets another thread run ``action`` to its end as the program
    ``name`` is being handed to its islands (at its ``at``-th island): its ``submitted`` hook
    arms it, the islands' first reads of the clock after that fire it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.action, self.name, self.at = None, None, 0

    def submitted(self, run):
        if self.action is not None and run.name == self.name:
            self.at = 1

    def now(self):
        if self.at:
            self.at, action, self.action = 0, self.action, None
            other = threading.Thread(target=action, name="canceller")
            other.start()
            other.join(TIMEOUT)
            assert not other.is_alive()
        return super().now()


@pytest.mark.parametrize("how", ["its future", "its run", "cancel_all"])
def test_a_donating_call_goes_when_its_earlier_reader_is_cancelled_as_it_is_submitted(how):
    """``read`` (called first, waiting for island 1) is cancelled by another thread while
    ``eat``, which donates what it reads, is being handed to its island: the cancellation
    released ``eat`` before its island knew it, and ``eat`` never launched (it hung)."""
    backend = _ActsAsIslandsGetARun(islands=(2, 2))
    ctl = pw.Controller(backend=backend)
    try:
        s0, s1 = ctl.slice(1, island=0), ctl.slice(1, island=1)
        opened = threading.Event()

        def wait_open(v):
            assert opened.wait(TIMEOUT)
            return v

        slow = pw.function(lambda v: io_callback(wait_open, jax.ShapeDtypeStruct((8,),
                                                 jnp.float32), v), slice=s1, name="slow")
        read = pw.function(lambda x, r: x + 5 + r[0] * 0, slice=s0, name="read")
        eat = pw.function(lambda x: x + 1, slice=s0, donate_argnums=0, name="eat")
        y = pw.function(lambda x: x * 2, slice=s0, name="a")(np.ones(8, np.float32))
        y.result(TIMEOUT)
        baseline = ctl.memory()
        z = read(y, slow(np.ones(8, np.float32)))  # waits for island 1
        (run,) = [r for r in ctl.runs() if r.name == "read"]
        backend.name = "eat"
        backend.action = {"its future": z.cancel, "its run": run.cancel,
                          "cancel_all": ctl.cancel_all}[how]
        w = eat(y)
        opened.set()
        with pytest.raises(pw.CancelledError):
            z.result(TIMEOUT)
        if how == "cancel_all":  # (it cancelled eat too, before it ran)
            with pytest.raises(pw.CancelledError):
                w.result(TIMEOUT)
        else:
            assert w.result(TIMEOUT).tolist() == [3.0] * 8  # (it hung)
            assert y.donated
        del z, w, run
        assert ctl.wait(timeout=TIMEOUT) and ctl.runs() == []
        gc.collect()
        assert sum(ctl.memory().values()) == (sum(baseline.values()) if how == "cancel_all"
                                              else 0)  # (y only, or nothing: y was donated)
        assert eat(y if how == "cancel_all" else np.ones(8, np.float32)).result(
            TIMEOUT).tolist() == [3.0 if how == "cancel_all" else 2.0] * 8
    finally:
        ctl.close()

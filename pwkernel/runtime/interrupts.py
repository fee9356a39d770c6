"""An interrupt (Ctrl-C, a notebook's stop button) held off while the main thread is inside
the runtime.

Python raises ``KeyboardInterrupt`` in the main thread between any two bytecodes. Inside the
runtime that can stop a launch after its island's scheduler decided it, an end half reported,
a buffer half freed: the island then waits for an end nobody will report, and every later
call on its devices waits behind it. So the runtime work the main thread does (a submission
with the launches it drains and the ends it reports on the way, the ends a waiting thread
reports, a cancellation, a free) runs under ``held``: an interrupt that arrives meanwhile is
noted, and raised once that work is done and the call in hand has returned its result: at
the start of the next runtime work of the main thread (the next call, wait, cancellation),
before anything of it is done, or ``GRACE`` (50 ms) later wherever the main thread is by then,
whichever comes first. So in ``w = step(w)`` with ``donate_argnums``, the loop's usual shape,
``w`` is the new state when the interrupt is raised: raised inside the call, it dropped the
only future of a state whose old buffers the call had already donated. It is never lost: a
free run by the garbage collector (a weak reference's callback, where Python ignores an
exception) keeps it the same way, and it comes ``GRACE`` after that free too; so does one
that lands in a callback of the garbage collector (``gc.callbacks``, JAX's among them), which
Python would print and drop. A timer thread
is not started there (a callback the collector runs can land while the main thread holds
``threading``'s own locks): the free's end hands the time to ``courier``, one daemon thread
alive while a controller is open, through a ``queue.SimpleQueue`` (made to be put to from
such callbacks).

The hold needs this module's handler of ``SIGINT`` (``install``): a controller installs it
when made in the main thread, and the notebook extension before each cell (ipykernel puts
Python's default handler back for every cell). It replaces only Python's default handler; a
handler of the user's own is left alone, and the runtime then behaves as Python does.
"""

from __future__ import annotations

import _thread
import gc
import queue
import signal
import threading
import time

__all__ = ["cell_ended", "courier", "held", "held_quietly", "holds_from_entry", "install",
           "kept", "raise_kept"]

_MAIN = threading.main_thread().ident
_ident = threading.get_ident
GRACE = 0.05  # s after a hold an interrupt it kept is raised, if no runtime work came first


class _State:
    __slots__ = ("depth", "over", "pending")

    def __init__(self):
        self.depth = 0  # nested holds of the main thread
        self.pending = False  # an interrupt arrived under a hold and is not raised yet
        self.over = False  # the cell's code ended (``cell_ended``): until the next ``install``


_state = _State()
_taking = threading.Lock()  # the main thread and a GRACE timer each take a kept interrupt once


def _take(_state=_state, _taking=_taking) -> bool:
    """Clear a kept interrupt; True if there was one (it is the caller's to raise)."""
    with _taking:
        kept, _state.pending = _state.pending, False
    return kept


def kept() -> bool:
    """An interrupt arrived under a hold and is not raised yet (it is left kept)."""
    return _state.pending


def raise_kept() -> None:
    """Raise a kept interrupt now: after work whose caller has no result to take
    (``ctl.close()``), there is nothing to wait for."""
    if _ident() == _MAIN and not _state.depth and _take():
        raise KeyboardInterrupt


_PTHREAD_KILL = getattr(signal, "pthread_kill", None)  # (POSIX only)


def _interrupt_main(_kill=_PTHREAD_KILL, _sigint=signal.SIGINT, _handler=signal.getsignal,
                    _flag=_thread.interrupt_main) -> None:
    """Interrupt the main thread as Ctrl-C does: a SIGINT sent to it (POSIX), which also ends
    a wait it is blocked in (``interrupt_main`` only sets the flag it reads between bytecodes:
    ``time.sleep(10)`` or ``event.wait()`` ran to its end first). Only while Python handles
    SIGINT: where its handler is the system's default, the signal would end the process, and
    ``interrupt_main`` does nothing, as Python does with a Ctrl-C it ignores."""
    if _kill is not None and callable(_handler(_sigint)):
        _kill(_MAIN, _sigint)
    else:
        _flag()


def _raise_later(_take=_take, _timer=threading.Timer, _interrupt=_interrupt_main,
                 _grace=GRACE) -> None:
    """Interrupt the main thread ``GRACE`` from now, unless runtime work raised it first."""
    def fire():
        if _take():
            _interrupt()  # (held again if it lands in runtime work: kept anew)
    timer = _timer(_grace, fire)
    timer.daemon = True
    timer.start()


#: the times quiet holds ended with an interrupt kept (None: the courier stops)
_ended: queue.SimpleQueue = queue.SimpleQueue()


def _deliver(ended=_ended, _take=_take, _interrupt=_interrupt_main, _grace=GRACE,
             _now=time.monotonic) -> None:
    """The courier's loop: ``GRACE`` after each quiet hold that kept an interrupt, interrupt
    the main thread, unless runtime work raised it first (as ``_raise_later``'s timer)."""
    while (at := ended.get()) is not None:
        while True:  # (ends that come meanwhile kept the same interrupt: raised at the first's)
            try:
                if ended.get(timeout=max(0.0, at + _grace - _now())) is None:
                    return  # (closing: ``ctl.close()`` raises a kept interrupt itself)
            except queue.Empty:
                break
        if _take():
            _interrupt()  # (held again if it lands in runtime work: kept anew)


class _Courier:
    """The thread that raises an interrupt a quiet hold kept: started by each controller made
    (``start``), stopped when the last one closes (``stop``), so none is left behind."""

    __slots__ = ("_lock", "_thread", "_users")

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._users = 0

    def start(self) -> None:
        with self._lock:
            self._users += 1
            if self._thread is None:
                while not _ended.empty():  # (ends from while none ran: the next call
                    _ended.get_nowait()  # raises what they kept, not this thread at once)
                self._thread = threading.Thread(target=_deliver, name="pw-interrupts",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self._thread is None:
                return
            thread, self._thread = self._thread, None
            _ended.put(None)
            thread.join()


courier = _Courier()


class _Hold:
    """``with held:`` (a context manager, reusable and nestable; other threads pass through)."""

    __slots__ = ("_raise",)

    def __init__(self, raise_at_exit: bool):
        self._raise = raise_at_exit

    # (what they use is bound as defaults: a future dropped while the interpreter exits runs
    # these after the module's globals are gone)
    def __enter__(self, _ident=_ident, _main=_MAIN, _state=_state, _take=_take) -> None:
        if _ident() == _main:
            if _state.pending and not _state.depth and self._raise and _take():
                raise KeyboardInterrupt  # kept from work done before: nothing of this begun
            _state.depth += 1

    def __exit__(self, *_exc, _ident=_ident, _main=_MAIN, _state=_state,
                 _later=_raise_later, _ended=_ended, _now=time.monotonic) -> bool:
        if _ident() == _main:
            _state.depth -= 1
            if _state.pending and not _state.depth:
                if self._raise:
                    _later()  # (the call returns its result first)
                else:  # (maybe inside the garbage collector: no thread is started here)
                    _ended.put(_now())
        return False


#: code whose every bytecode is runtime work: an interrupt that lands at its entry, before its
#: ``with held_quietly:`` has begun, is kept as one inside it is (see ``holds_from_entry``);
#: so is one inside a hold's end, after its depth went back to 0 (starting the timer that
#: raises a kept one): raised there, inside the call, it lost the call's result
_from_entry = {_Hold.__enter__.__code__, _Hold.__exit__.__code__}


def holds_from_entry(fn):
    """Mark ``fn`` (a weak reference's callback that begins with ``with held_quietly:``) as
    held from its first bytecode: Python checks for a signal on entering a function, so a
    Ctrl-C could land there, before the hold, and be raised where Python ignores it, leaving
    the work undone (a dropped future's buffer never freed)."""
    _from_entry.add(fn.__code__)
    return fn


#: the main thread's runtime work: an interrupt that arrives inside is raised at its end
held = _Hold(True)
#: the same, for work Python runs where it ignores exceptions (a weak reference's callback):
#: the interrupt is raised by the next runtime work, or by the ``courier`` ``GRACE`` later
held_quietly = _Hold(False)


def _in_entry(frame) -> bool:
    """The main thread is inside a function ``holds_from_entry`` marked (or a hold's start)."""
    while frame is not None:
        if frame.f_code in _from_entry:
            return True
        frame = frame.f_back
    return False


def _in_gc_callback(frame) -> bool:
    """The main thread is inside a callback of the garbage collector (``gc.callbacks``: JAX's
    ``_xla_gc_callback``), where Python prints an exception raised and drops it."""
    codes = {getattr(getattr(cb, "__func__", cb), "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def cell_ended() -> bool:
    """The notebook cell's code has ended (IPython's ``post_execute``): take the interrupt a
    hold kept, True if there was one (the cell shows it: ``GRACE`` later the main thread is in
    ipykernel's own code, sending the cell's reply, where a ``KeyboardInterrupt`` lost the
    reply and the client waited for it, or SIGINT is ignored again and it was lost), and drop
    every interrupt until the next cell's ``install``, as ipykernel drops one between cells."""
    if _ident() != _MAIN:
        return False
    _state.over = True
    return _take()


def _handler(signum, frame) -> None:
    __tracebackhide__ = True  # (IPython shows the user's frame the interrupt came in)
    if _state.over:
        return
    if _state.depth or _in_entry(frame):
        _state.pending = True
        return
    if _in_gc_callback(frame):  # (raised there, it was lost): kept, and raised by the next
        _state.pending = True  # runtime work or the ``courier``, ``GRACE`` later
        _ended.put(time.monotonic())
        return
    _state.pending = False
    signal.default_int_handler(signum, frame)


def install() -> bool:
    """Put this module's handler in place of Python's default ``SIGINT`` handler; True when
    it is in place (it is not outside the main thread, or over a handler of the user's)."""
    if _ident() != _MAIN:
        return False
    current = signal.getsignal(signal.SIGINT)
    if current is _handler:
        _state.over = False
        return True
    if current is not signal.default_int_handler:
        return False
    _state.pending = _state.over = False  # (one kept from an earlier cell is not this one's)
    signal.signal(signal.SIGINT, _handler)
    return True

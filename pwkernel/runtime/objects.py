"""Futures (the object store, which counts and frees their buffers, is ``store.py``).

Every value a program produces is a ``Future`` for a sharded buffer: one record per logical
buffer, not per shard. Its shape, dtype and sharding are known when the program is submitted,
before anything runs. The ``ObjectStore`` tracks the bytes each live buffer holds on each device,
labelled with the program and client that own it. A buffer is freed when the last reference to
its future goes (user code and not-yet-run consumers both hold references), and also when its
program fails or is cancelled, since then nothing holds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum

import jax
import numpy as np

from . import awaiting, done_callbacks, interrupts, lending
from .arraylike import ArrayOnDemand, read_only
from .dtypes import as_dtype
from .errors import CancelledError, freed_by_close, origin, timeout_seconds
from .hooks import added, fire
from .store import BufferRecord, ObjectStore, shard_bytes

__all__ = ["BufferRecord", "Future", "FutureState", "ObjectStore", "resolved", "shard_bytes"]


class FutureState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_PENDING, _DONE = FutureState.PENDING, FutureState.DONE
_RUNNING = "running"  # a producer task's state from its launch to its end (a TaskState value)
_clock = time.perf_counter


class _Buffer:
    """The value of a future that belongs to no store (given by the user: never deleted)."""

    __slots__ = ("value", "exported", "donated")

    def __init__(self, value):
        self.value, self.exported, self.donated = value, True, False


class Waits(threading.local):
    """This thread's end (monotonic) of ``result()`` waits given no timeout: --timeout cells."""
    deadline: float | None = None


WAITS = Waits()


class Future(ArrayOnDemand):
    """A value a program will produce.

    ``shape``, ``dtype`` and ``sharding`` are known at once; ``result()`` waits for the value.
    Futures can be passed into later programs before they resolve. Anything else that needs
    the value (operators, ``jax.Array`` methods, ``jnp`` functions, ``jax.jit``) waits for it
    and is then the value's own (``runtime/arraylike.py``).

    >>> y, z = f(np.array([1.0, 2.0]))       # doctest: +SKIP
    >>> y.shape, y.dtype                       # doctest: +SKIP
    ((2,), dtype('float32'))
    >>> y.result()                             # doctest: +SKIP
    Array([3., 5.], dtype=float32)
    """

    __slots__ = ("_shape", "_dtype", "_sharding", "name", "island", "run", "producer", "_store",
                 "_buffer", "_state", "_error", "_event", "_callbacks", "_hooks", "_launch_hooks",
                 "_launched", "_lock", "t_created", "t_done", "weak_type", "order", "placement",
                 "donated", "lent", "_error_tb", "__weakref__")
    shape, dtype, sharding = read_only("shape"), read_only("dtype"), read_only("sharding")

    def __init__(self, shape, dtype, sharding=None, *, name: str = "", island: int | None = None,
                 run=None, store: ObjectStore | None = None):
        self._shape, self._dtype = tuple(shape), as_dtype(dtype)  # (read-only, as jax.Array's)
        self._sharding, self.name, self.island, self.run, self._store = (sharding, name, island,
                                                                          run, store)
        self._buffer = None  # the store's entry for the value (or a _Buffer), once done
        self._state = _PENDING
        self._error: BaseException | None = None
        self._event: threading.Event | None = None  # made only when someone waits
        self._callbacks: list[Callable[[Future], None]] | None = None  # lists made when used
        self._hooks: list[Callable[[Future], None]] | None = None
        self._launch_hooks: list[Callable[[Future], None]] | None = None
        self._launched = None  # the not-yet-ready array once its computation is launched
        self.producer = None  # the runtime task making it: its state is "running" from its
        #                       launch on its devices to its end (what running() asks)
        self._lock = threading.Lock()
        self.t_created, self.t_done = _clock(), 0.0
        self.weak_type = False  # a weakly typed value (from Python scalars), as JAX types it
        self.order = -1  # its position among its producer's outputs (which resolve in order)
        self.placement: tuple | None = None  # its part of a program's cache key, if known
        self.donated = False  # a launched computation consumed its buffer (donate_argnums)
        self.lent = False  # its launched array was lent to an operation (``lending``)

    @property
    def store(self) -> ObjectStore | None:
        """The object store (of its controller) that holds its buffer; None outside one."""
        return self._store

    # --- the concurrent.futures-like surface -----------------------------------------------
    @property
    def state(self) -> FutureState:
        return self._state

    def done(self) -> bool:
        return self._state is not _PENDING

    def running(self) -> bool:
        """True while the computation that makes this value runs: launched on its devices
        (maybe behind its running predecessor there, as JAX enqueues it) and not ended; False
        while it waits or is queued, and once it has ended (``concurrent.futures``)."""
        if self._state is not _PENDING:
            return False
        producer = self.producer
        if producer is not None:
            return producer.state == _RUNNING
        return self._launched is not None

    def cancelled(self) -> bool:
        return self._state is FutureState.CANCELLED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the future resolves; False on timeout."""
        timeout = timeout_seconds(timeout)  # (before anything: result and exception too)
        if self._state is not _PENDING:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        producer = self.producer
        if producer is not None:  # the waiting thread may see its end itself (held there)
            producer.expedite(timeout)
        with self._lock:
            if self._state is not _PENDING:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def result(self, timeout: float | None = None):
        """The value as a ``jax.Array``; raises the computation's error if it failed."""
        if timeout is None and WAITS.deadline is not None:  # (a --timeout cell's Python)
            timeout = max(0.0, WAITS.deadline - time.monotonic())
        if not self.wait(timeout):
            raise TimeoutError(
                f"future {self.name or ''} of shape {self.shape} not ready after {timeout} s; "
                "it is still queued or running (see ctl.status())."
            )
        if self._error is not None:
            raise self._error.with_traceback(self._error_tb)
        if self._store is not None and self._store.closed:
            raise freed_by_close()
        buf = self._buffer
        if self._store is None:
            return buf.value
        if buf is None:  # donated before its computation ended: the store never counted it,
            return self._launched  # and the value is the deleted array jax.jit leaves
        value = self._store.fetch(self, buf)  # (the reader's from here: a close keeps it)
        if value is None:  # a close in another thread freed it since the check above
            raise freed_by_close()
        error = self._store.failure(buf, value)
        if error is not None:
            raise error
        return value

    def array(self):
        """What a JAX operation on it computes on (``arraylike``): while its computation runs,
        the array it launched (then the user's), as JAX computes on one not ready yet; else, or
        where a failure shows only at an end (host callbacks, upstream too), ``result()``."""
        value, producer = self._launched, self.producer
        if (value is None or self._state is not _PENDING or self.donated or producer is None
                or not isinstance(value, jax.Array) or not lending.trusted(producer)):
            return self.result()
        self.lent = True  # the user's (``lending``), marked here or by its resolution
        if (held := self._buffer) is not None and self._store is not None:
            held.exported = True
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.wait(timeout):
            raise TimeoutError(f"future {self.name or ''} not ready after {timeout} s")
        if self._error is None and self._store is not None and self._buffer is not None:
            return self._store.failure(self._buffer)  # (one its end did not report)
        return self._error

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` when the future resolves: then on a thread of its own, never the
        runtime's (see ``done_callbacks``), or at once, in this thread, if it has resolved
        already. What ``fn`` raises is logged, as ``concurrent.futures`` does."""
        done_callbacks.check(fn)
        with self._lock:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        done_callbacks.call(fn, self)

    def cancel(self) -> bool:
        """Cancel the program this future belongs to (its work not yet started)."""
        if self.done():
            return False
        if self.run is not None:
            with interrupts.held:
                self.run.cancel()
        return self.cancelled()

    def __await__(self):
        # (woken by the runtime, never queued behind a user's done-callback, which may itself
        # wait for this coroutine: a deadlock; an awaiter that gives up takes its hook back)
        return awaiting.waiter(self).__await__()

    def block_until_ready(self):
        """Wait for the value's computation to end (raising its error if it failed); returns
        the future itself, as ``jax.Array.block_until_ready`` returns the array. (A simulated
        future, which has no value, waits too.)"""
        error = self.exception()
        if error is not None:
            raise error.with_traceback(self._error_tb) if error is self._error else error
        return self

    def __repr__(self) -> str:
        return (f"Future(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"state={self._state.value})")

    @classmethod
    def resolved(cls, value, sharding=None) -> Future:
        """A future that is already done, holding ``value`` (which stays the caller's: no
        store counts or frees it)."""
        dtype = getattr(value, "dtype", None)  # (not np.asarray(value) for every value: a
        if dtype is None:                      # device array would be copied to the host)
            dtype = np.asarray(value).dtype
        fut: Future = cls(np.shape(value), dtype, sharding)
        fut.set_result(value)
        return fut

    @classmethod
    def output(cls, shape: tuple, dtype: np.dtype, sharding, name: str, island, run, store,
                producer, weak: bool, order: int, placement: tuple, t_created: float,
                lock=None) -> Future:
        """A program output's future from its plan's fields (``__init__`` without its checks;
        ``t_created``: once for a run's outputs). ``lock``: the one it shares with its
        producer's other outputs, which launch and resolve together (None: its own)."""
        fut: Future = cls.__new__(cls)
        fut._shape, fut._dtype, fut._sharding, fut.name, fut.island = (shape, dtype, sharding,
                                                                         name, island)
        fut.run, fut._store, fut.producer, fut.weak_type = run, store, producer, weak
        fut.order, fut.placement, fut.donated, fut.lent = order, placement, False, False
        fut._buffer = fut._error = fut._event = fut._callbacks = fut._hooks = None
        fut._launch_hooks = fut._launched = None
        fut._state = _PENDING
        fut._lock = threading.Lock() if lock is None else lock
        fut.t_created, fut.t_done = t_created, 0.0
        return fut

    # --- runtime side ----------------------------------------------------------------------
    # (the runtime's hooks: None, one callable, or a list of them; dropped once fired)
    def hook(self, fn: Callable[[Future], None]) -> None:
        """Like add_done_callback, but for the runtime: hooks are dropped once fired."""
        with self._lock:
            if self._state is _PENDING:
                self._hooks = added(self._hooks, fn)
                return
        fn(self)

    def unhook(self, fn: Callable[[Future], None]) -> None:
        """Drop ``fn``, a hook not fired yet (what an ``await`` that gave up added)."""
        with self._lock:
            hooks = self._hooks
            if hooks is fn:
                self._hooks = None
            elif type(hooks) is list and fn in hooks:
                hooks.remove(fn)

    def on_launch(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` once the value's computation is launched (or the future resolved):
        consumers may then be launched behind it."""
        with self._lock:
            if self._launched is None and self._state is _PENDING:
                self._launch_hooks = added(self._launch_hooks, fn)
                return
        fn(self)

    def watch(self, on_launch: Callable[[Future], None],
               on_end: Callable[[Future], None]) -> None:
        """``on_launch(on_launch)`` and ``hook(on_end)``, under one lock (how the dispatcher
        watches an argument of a run)."""
        with self._lock:
            if self._state is _PENDING:
                self._hooks = added(self._hooks, on_end)
                if self._launched is None:
                    self._launch_hooks = added(self._launch_hooks, on_launch)
                    return
                on_end = None
        on_launch(self)
        if on_end is not None:
            on_end(self)

    def set_launched(self, value) -> None:
        """Its computation is launched: ``value`` exists (maybe still computing)."""
        self.set_launched_many((self,), (value,))

    @staticmethod
    def set_launched_many(futures: Sequence[Future | None], values: Sequence) -> None:
        """``set_launched`` for a node's outputs at once (``None``: an output no future
        shows), in order; their hooks fire once all are set."""
        fired = None
        lock = None  # the lock held now (a node's outputs share theirs: taken once)
        try:
            for f, value in zip(futures, values, strict=True):
                if f is None:
                    continue
                fut: Future = f
                if fut._lock is not lock:
                    if lock is not None:
                        lock.release()
                    lock = fut._lock
                    lock.acquire()
                if fut._state is not _PENDING:
                    continue
                fut._launched = value
                hooks = fut._launch_hooks
                if hooks is not None:
                    fut._launch_hooks = None
                    if fired is None:
                        fired = [(hooks, fut)]
                    else:
                        fired.append((hooks, fut))
        finally:
            if lock is not None:
                lock.release()
        if fired is not None:
            for hooks, fut in fired:
                fire(hooks, fut)

    @staticmethod
    def consumed_many(futures: Sequence[Future | None]) -> None:
        """A launch was given these futures' buffers (donated; ``None``: not a future). Under
        a memory budget, the bytes reserved for them are given back once, now or (one not
        yet resolved) when it resolves (``set_results``): XLA reuses them for the outputs."""
        given = []
        lock = None  # (a node's outputs share their lock: taken once; ``set_launched_many``)
        try:
            for f in futures:
                if f is None:
                    continue
                fut: Future = f
                if fut._lock is not lock:
                    if lock is not None:
                        lock.release()
                    lock = fut._lock
                    lock.acquire()
                fut.donated = True  # (read by its resolution under this lock: one of the two
                if fut._buffer is not None:  # gives its bytes back)
                    given.append((fut._store, fut._buffer))
        finally:
            if lock is not None:
                lock.release()
        for store, buf in given:
            _consumed(store, buf)

    @staticmethod
    def first_error(leaves) -> BaseException | None:
        """The first error among the futures of ``leaves`` (others skipped); no waiting."""
        for leaf in leaves:
            if isinstance(leaf, Future):
                fut: Future = leaf
                if fut._error is not None:
                    return fut._error
        return None

    def peek(self):
        """The value (possibly not ready yet) without marking it exported, for consumers."""
        buf = self._buffer
        return self._launched if buf is None else buf.value

    def set_result(self, value, t_done: float = 0.0, reserved: bool = False,
                    nbytes: dict[int, int] | None = None) -> None:
        store = self._store
        self._buffer = _Buffer(value) if store is None else store.add(self, value, reserved,
                                                                        nbytes)
        if self.lent and store is not None:  # (its launched array was lent: the user's)
            self._buffer.exported = True
        if self.donated:  # (consumed before it resolved)
            _consumed(store, self._buffer)
        self._resolve(_DONE, None, t_done)

    @staticmethod
    def set_results(futures: Sequence[Future], values: Sequence,
                    nbytes: Sequence[dict[int, int] | None] | None = None,
                    t_done: float = 0.0, reserved: bool = False) -> None:
        """``set_result`` for many futures at once (a node's outputs), with their ``values``
        and ``nbytes`` side by side (each its bytes per device; None: from its sharding).
        Their store counts them all under one lock; then they resolve, in order, and what
        waits on them is woken once all have."""
        if not futures:
            return
        first: Future = futures[0]
        store = first._store
        for f in futures:
            fut: Future = f
            if fut._store is not store:
                raise ValueError("Future.set_results takes futures of one object store (a "
                                 "node's outputs); resolve futures of others one by one.")
        held = None if store is None else store.add_many(futures, values, nbytes, reserved,
                                                          skip_donated=True)
        fired = given = None
        lock = None  # the lock held now (a node's outputs share theirs: taken once)
        try:
            for i, f in enumerate(futures):
                fut: Future = f
                value = values[i]
                buf = _Buffer(value) if held is None else held[i]
                if fut._lock is not lock:
                    if lock is not None:
                        lock.release()
                    lock = fut._lock
                    lock.acquire()
                fut._buffer = buf
                if fut.lent and held is not None and buf is not None:  # (``lending``)
                    buf.exported = True
                if fut.donated and buf is not None:  # consumed before: ``consumed_many``
                    given = [buf] if given is None else given + [buf]  # saw no buffer
                if fut._state is not _PENDING:  # (``_resolve``, inlined: this runs per output)
                    continue
                # (one donated already, with no store entry, keeps the consumed array)
                fut._state, fut.t_done, fut._launched = _DONE, t_done, (
                    None if buf is not None else value)
                event = fut._event
                launch_hooks, hooks, callbacks = fut._launch_hooks, fut._hooks, fut._callbacks
                if launch_hooks is None and hooks is None and callbacks is None:
                    if event is None:
                        continue
                else:
                    fut._launch_hooks = fut._hooks = fut._callbacks = None
                if fired is None:
                    fired = [(fut._resolved, event, launch_hooks, hooks, callbacks)]
                else:
                    fired.append((fut._resolved, event, launch_hooks, hooks, callbacks))
        finally:
            if lock is not None:
                lock.release()
        if given is not None:
            for buf in given:
                _consumed(store, buf)
        if fired is not None:
            for wake, *waiting in fired:
                wake(*waiting)

    def set_exception(self, error: BaseException, t_done: float = 0.0) -> None:
        state = FutureState.CANCELLED if isinstance(error, CancelledError) else FutureState.FAILED
        self._resolve(state, error, t_done)

    @property
    def error(self) -> BaseException | None:
        """The error it resolved with; None while pending or once resolved with a value."""
        return self._error

    def _resolve(self, state: FutureState, error, t_done: float) -> bool:
        with self._lock:
            if self._state is not _PENDING:
                return False
            self._state, self._error, self.t_done = state, error, t_done
            self._error_tb = None if error is None else origin(error.__traceback__, __name__)
            self._launched = None
            launch_hooks, hooks, callbacks = self._launch_hooks, self._hooks, self._callbacks
            self._launch_hooks = self._hooks = self._callbacks = None
            event = self._event
        self._resolved(event, launch_hooks, hooks, callbacks)
        return True

    def _resolved(self, event, launch_hooks, hooks, callbacks) -> None:
        """What waits on a future that just resolved: its waiters, hooks and callbacks."""
        if event is not None:
            event.set()
        if launch_hooks is not None:
            fire(launch_hooks, self)
        if hooks is not None:
            fire(hooks, self)
        if callbacks:  # the user's: on their own thread, never this one (``done_callbacks``)
            done_callbacks.runner.submit(callbacks, self)


def _consumed(store: ObjectStore | None, buf) -> None:
    """A launch consumed ``buf`` (a future's store entry, or ``_Buffer``): its reserved bytes
    go back first (``ObjectStore.give_back``), then it holds none (``memory()``)."""
    if store is not None:
        store.give_back(buf)
    buf.donated = True


resolved = Future.resolved  # a future that is already done (program inputs given as arrays)

"""Futures (the object store, which counts and frees their buffers, is ``store.py``).

Every value a program produces is a ``Future`` for a sharded buffer: one record per logical
buffer, not per shard. Its shape, dtype and sharding are known when the program is submitted,
before anything runs. The ``ObjectStore`` tracks the bytes each live buffer holds on each device,
labelled with the program and client that own it. A buffer is freed when the last reference to
its future goes (user code and not-yet-run consumers both hold references), and also when its
program fails or is cancelled, since then nothing holds it.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from itertools import chain, compress, repeat, starmap
from typing import Any, NamedTuple

import numpy as np

from .batch import exhaust, not_none
from .errors import CancelledError, ControllerClosedError
from .store import BufferRecord, ObjectStore, shard_bytes
from .values import OnValue

__all__ = ["BufferRecord", "Future", "FutureState", "ObjectStore", "resolved", "shard_bytes"]


class FutureState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_PENDING, _DONE = FutureState.PENDING, FutureState.DONE
_RUNNING = "running"  # a producer task's state from its launch to its end (a TaskState value)
_clock = time.perf_counter
#: a program output's fields, in the order ``Future.outputs`` sets them: its plan's, its
#: run's, then the start of every future's life
_FIELDS = ("shape", "dtype", "sharding", "island", "name", "weak_type", "order", "placement",
           "run", "_store", "producer", "t_created", "_lock",
           "_buffer", "_error", "_event", "_callbacks", "_hooks", "_launch_hooks", "_launched",
           "_state", "t_done", "donated")
_START = (None,) * 7 + (_PENDING, 0.0, False)
(_store_of, _lock_of, _state_of, _error_of, _buffer_of, _launch_hooks_of, _producer_of,
 _t_done_of, _launched_of, _value_of) = map(operator.attrgetter, (
    "_store", "_lock", "_state", "_error", "_buffer", "_launch_hooks", "producer", "t_done",
    "_launched", "value"))
_waiting = operator.attrgetter("_event", "_launch_hooks", "_hooks", "_callbacks")  # _resolved's
_acquire, _release = type(threading.Lock()).acquire, type(threading.Lock()).release
_DTYPES: dict[Any, np.dtype] = {}  # np.dtype() of each dtype given: a lookup is 10x cheaper


def _dtype(dtype) -> np.dtype:
    out = np.dtype(dtype)
    if out.metadata is None and out.fields is None:  # (equal dtypes that differ in those)
        try:
            _DTYPES[dtype] = out
        except TypeError:
            pass
    return out


def _added(hooks, fn):
    """``hooks`` (None, a callable or a list of them) with ``fn`` after them: one hook, the
    common case, costs no list."""
    if hooks is None:
        return fn
    if type(hooks) is list:
        hooks.append(fn)
        return hooks
    return [hooks, fn]


def _fire(hooks, fut) -> None:
    if type(hooks) is list:
        for fn in hooks:
            fn(fut)
    else:
        hooks(fut)


class _Buffer:
    """The value of a future that belongs to no store (given by the user: never deleted)."""

    __slots__ = ("value", "exported", "donated")

    def __init__(self, value):
        self.value, self.exported, self.donated = value, True, False


class Columns(NamedTuple):
    """``Future.columns``: per future (in order) its store, whether it is pending, its error,
    its value as a consumer reads it (``peek``: maybe still computing, or None), when it
    resolved, and the task making it (None: none)."""

    stores: list
    pending: list[bool]
    errors: list
    values: list
    t_done: list[float]
    producers: list


class Future(OnValue):
    """A value a program will produce.

    ``shape``, ``dtype`` and ``sharding`` are known at once; ``result()`` waits for the value.
    Futures can be passed into later programs before they resolve.

    >>> y, z = f(np.array([1.0, 2.0]))       # doctest: +SKIP
    >>> y.shape, y.dtype                       # doctest: +SKIP
    ((2,), dtype('float32'))
    >>> y.result()                             # doctest: +SKIP
    Array([3., 5.], dtype=float32)
    """

    __slots__ = ("shape", "dtype", "sharding", "name", "island", "run", "producer", "_store",
                 "_buffer", "_state", "_error", "_event", "_callbacks", "_hooks", "_launch_hooks",
                 "_launched", "_lock", "t_created", "t_done", "weak_type", "order", "placement",
                 "donated", "__weakref__")

    def __init__(self, shape, dtype, sharding=None, *, name: str = "", island: int | None = None,
                 run=None, store: ObjectStore | None = None):
        self.shape = shape if type(shape) is tuple else tuple(shape)
        try:
            self.dtype = _DTYPES[dtype]
        except (KeyError, TypeError):  # (TypeError: an unhashable dtype spec)
            self.dtype = _dtype(dtype)
        self.sharding, self.name, self.island, self.run, self._store = (sharding, name, island,
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
        self.t_created = _clock()
        self.t_done = 0.0
        self.weak_type = False  # a weakly typed value (from Python scalars), as JAX types it
        self.order = -1  # its position among its producer's outputs (which resolve in order)
        self.placement: tuple | None = None  # its part of a program's cache key, if known
        self.donated = False  # a launched computation consumed its buffer (donate_argnums)

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
        (possibly behind its running predecessor there, as JAX enqueues it) and not ended.
        False while it waits for its inputs or is queued, and once it has ended, as in
        ``concurrent.futures``."""
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
        if self._state is not _PENDING:
            return True
        producer = self.producer
        if producer is not None:  # the waiting thread may see its end itself
            producer.expedite(timeout)
        with self._lock:
            if self._state is not _PENDING:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def result(self, timeout: float | None = None):
        """The value as a ``jax.Array``; raises the computation's error if it failed."""
        if not self.wait(timeout):
            raise TimeoutError(
                f"future {self.name or ''} of shape {self.shape} not ready after {timeout} s; "
                "it is still queued or running (see ctl.status())."
            )
        if self._error is not None:
            raise self._error
        if self._store is not None and self._store.closed:
            raise ControllerClosedError(
                "this future belongs to a closed controller and its buffer was freed; "
                "keep the value (fut.result()) before ctl.close(), or rerun the program."
            )
        buf = self._buffer
        if self._store is None:
            return buf.value
        return self._store.fetch(self, buf)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.wait(timeout):
            raise TimeoutError(f"future {self.name or ''} not ready after {timeout} s")
        return self._error

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` when the future resolves (at once if it already has)."""
        with self._lock:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def cancel(self) -> bool:
        """Cancel the program this future belongs to (its work not yet started)."""
        if self.done():
            return False
        if self.run is not None:
            self.run.cancel()
        return self.cancelled()

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
    def outputs(cls, templates: Sequence[tuple], producers: Iterable, run, store,
                t_created: float) -> list[Future]:
        """A run's output futures, one per template: ``(shape, dtype, sharding, island, name,
        weak_type, order, placement)`` from its plan (a plan's ``Output`` from its shape on),
        made by ``producers`` (the run's tasks, in the same order) at ``t_created``. What
        ``__init__`` makes, without its per-value checks, every field set in one C-level pass
        (a state of many leaves: no Python work per leaf)."""
        n = len(templates)
        futs = list(map(cls.__new__, repeat(cls, n)))
        per_run = zip(repeat(run, n), repeat(store, n), producers, repeat(t_created, n),
                      starmap(threading.Lock, repeat((), n)), strict=True)
        rows = map(operator.add, map(operator.add, templates, per_run), repeat(_START, n))
        exhaust(map(setattr, chain.from_iterable(map(repeat, futs, repeat(len(_FIELDS), n))),
                     _FIELDS * n, chain.from_iterable(rows)))
        return futs

    # --- runtime side ----------------------------------------------------------------------
    # (the runtime's hooks: None, one callable, or a list of them; dropped once fired)
    def hook(self, fn: Callable[[Future], None]) -> None:
        """Like add_done_callback, but for the runtime: hooks are dropped once fired."""
        with self._lock:
            if self._state is _PENDING:
                self._hooks = _added(self._hooks, fn)
                return
        fn(self)

    def on_launch(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` once the value's computation is launched (or the future resolved):
        consumers may then be launched behind it."""
        with self._lock:
            if self._launched is None and self._state is _PENDING:
                self._launch_hooks = _added(self._launch_hooks, fn)
                return
        fn(self)

    def watch(self, on_launch: Callable[[Future], None],
               on_end: Callable[[Future], None]) -> None:
        """``on_launch(on_launch)`` and ``hook(on_end)``, under one lock (how the dispatcher
        watches an argument of a run)."""
        with self._lock:
            if self._state is _PENDING:
                self._hooks = _added(self._hooks, on_end)
                if self._launched is None:
                    self._launch_hooks = _added(self._launch_hooks, on_launch)
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
        shows), in order: under all their locks (taken in output order: no other code holds
        two) they take their values together, then their launch hooks fire, in order."""
        if len(futures) != len(values):
            raise ValueError(f"set_launched_many got {len(futures)} futures and {len(values)} "
                             "values; give one value per output.")
        if None in futures:
            keep = list(map(operator.is_not, futures, repeat(None)))
            futures, values = list(compress(futures, keep)), list(compress(values, keep))
            if not futures:
                return
        locks = list(map(_lock_of, futures))
        exhaust(map(_acquire, locks))
        try:
            pending = list(map(operator.is_, map(_state_of, futures), repeat(_PENDING)))
            if not all(pending):
                futures, values = list(compress(futures, pending)), list(compress(values,
                                                                                  pending))
            hooks = list(map(_launch_hooks_of, futures))
            exhaust(map(setattr, futures, repeat("_launched"), values))
            if any(hooks):
                exhaust(map(setattr, futures, repeat("_launch_hooks"), repeat(None,
                                                                               len(futures))))
        finally:
            exhaust(map(_release, locks))
        for f, fire in compress(zip(futures, hooks, strict=True), hooks):
            _fire(fire, f)

    @staticmethod
    def consumed_many(futures: Sequence[Future | None]) -> None:
        """A launched computation was given these futures' buffers to reuse (donated): the
        store has nothing left to delete when they go (``None``: not a future)."""
        if None in futures:
            futures = list(compress(futures, map(operator.is_not, futures, repeat(None))))
        exhaust(map(setattr, futures, repeat("donated"), repeat(True, len(futures))))
        held = list(filter(not_none, map(_buffer_of, futures)))  # (a store entry, or _Buffer)
        exhaust(map(setattr, held, repeat("donated"), repeat(True, len(held))))

    @staticmethod
    def columns(futures: Sequence[Future]) -> Columns:
        """What a run reads of the futures it is given, one column each, in C-level passes
        (a state of many leaves: no Python work per leaf); see ``Columns``."""
        n = len(futures)
        held = list(map(_buffer_of, futures))
        if None not in held:  # (all resolved with a value)
            values = list(map(_value_of, held))
        elif held.count(None) == n:  # (none resolved with a value)
            values = list(map(_launched_of, futures))
        else:
            values = list(map(Future.peek, futures))
        return Columns(list(map(_store_of, futures)),
                       list(map(operator.is_, map(_state_of, futures), repeat(_PENDING, n))),
                       list(map(_error_of, futures)), values, list(map(_t_done_of, futures)),
                       list(map(_producer_of, futures)))

    @staticmethod
    def producers_of(futures: Iterable[Future], running: bool = True) -> Iterator:
        """The tasks making ``futures`` (those made by none skipped), in order, with repeats;
        with ``running``, only those of futures still pending. One C-level pass."""
        if running:
            futures = list(futures)
            futures = compress(futures, map(operator.is_, map(_state_of, futures),
                                            repeat(_PENDING)))
        return filter(not_none, map(_producer_of, futures))

    @staticmethod
    def first_error(leaves) -> BaseException | None:
        """The error of the first future among ``leaves`` that failed (other leaves are
        skipped), without waiting for any."""
        leaves = list(leaves)
        errors = map(_error_of, compress(leaves, map(isinstance, leaves, repeat(Future))))
        return next(filter(not_none, errors), None)

    def peek(self):
        """The value (possibly not ready yet) without marking it exported, for consumers."""
        buf = self._buffer
        return self._launched if buf is None else buf.value

    def set_result(self, value, t_done: float = 0.0, reserved: bool = False,
                    nbytes: dict[int, int] | None = None) -> None:
        store = self._store
        self._buffer = _Buffer(value) if store is None else store.add(self, value, reserved,
                                                                        nbytes)
        self._resolve(_DONE, None, t_done)

    @staticmethod
    def set_results(made: Sequence[tuple[Future, Any, dict[int, int] | None]],
                     t_done: float = 0.0, reserved: bool = False) -> None:
        """``set_result`` for many futures at once (a node's outputs): ``made`` holds
        ``(future, value, nbytes)`` (nbytes: its bytes per device; None: from its sharding).
        Their store counts them all under one lock; then each resolves, in order."""
        if made:
            futs, values, nbytes = zip(*made, strict=True)
            Future.set_values(futs, values, nbytes, t_done, reserved)

    @staticmethod
    def set_values(futures: Sequence[Future | None], values: Sequence,
                   nbytes: Sequence[dict[int, int] | None], t_done: float = 0.0,
                   reserved: bool = False) -> None:
        """``set_results`` in columns: a node's output futures (``None``: an output no
        future shows), their values and their bytes per device. The per-future work is done
        in C-level passes (a state of many leaves: no Python work per leaf): the store counts
        them in one batch, then under all their locks (taken in output order: no other code
        holds two) they resolve together, and what waits on each is woken, in order."""
        if len(futures) == 1:  # (one output: a batch costs more than it saves)
            one: Future = futures[0]
            if one is not None:  # (set_result, inline)
                store = one._store
                one._buffer = _Buffer(values[0]) if store is None else store.add(
                    one, values[0], reserved, nbytes[0])
                one._resolve(_DONE, None, t_done)
            return
        if None in futures:
            keep = list(map(operator.is_not, futures, repeat(None)))
            futures, values = list(compress(futures, keep)), list(compress(values, keep))
            nbytes = list(compress(nbytes, keep))
        if not futures:
            return
        first: Future = futures[0]
        store = first._store
        if any(map(operator.is_not, map(_store_of, futures), repeat(store))):
            raise ValueError("Future.set_results takes futures of one object store (a "
                             "node's outputs); resolve futures of others one by one.")
        held = list(map(_Buffer, values)) if store is None else store.add_values(
            futures, values, nbytes, reserved)
        exhaust(map(setattr, futures, repeat("_buffer"), held))
        locks = list(map(_lock_of, futures))
        exhaust(map(_acquire, locks))
        try:
            if any(map(operator.is_not, map(_state_of, futures), repeat(_PENDING))):
                woken = None  # (one resolved already: each on its own, below)
            else:
                woken = list(map(_waiting, futures))
                for name, value in (("_state", _DONE), ("t_done", t_done), ("_launched", None),
                                    ("_launch_hooks", None), ("_hooks", None),
                                    ("_callbacks", None)):
                    exhaust(map(setattr, futures, repeat(name), repeat(value, len(futures))))
        finally:
            exhaust(map(_release, locks))
        if woken is None:
            for f in futures:
                fut: Future = f
                fut._resolve(_DONE, None, t_done)
            return
        for f, waiting in compress(zip(futures, woken, strict=True), map(any, woken)):
            fut: Future = f
            fut._resolved(*waiting)

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
            self._launched = None
            launch_hooks, hooks, callbacks = self._launch_hooks, self._hooks, self._callbacks
            self._launch_hooks = self._hooks = self._callbacks = None
            event = self._event
        if event is not None or launch_hooks is not None or hooks is not None or callbacks:
            self._resolved(event, launch_hooks, hooks, callbacks)
        return True

    def _resolved(self, event, launch_hooks, hooks, callbacks) -> None:
        """What waits on a future that just resolved: its waiters, hooks and callbacks."""
        if event is not None:
            event.set()
        if launch_hooks is not None:
            _fire(launch_hooks, self)
        if hooks is not None:
            _fire(hooks, self)
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:  # a user's callback must not break the runtime
                    import logging
                    logging.getLogger("pwkernel").exception("future done-callback raised")


resolved = Future.resolved  # a future that is already done (program inputs given as arrays)

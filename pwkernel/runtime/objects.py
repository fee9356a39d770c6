"""Futures and the object store.

Every value a program produces is a ``Future`` for a sharded buffer: one record per logical
buffer, not per shard. Its shape, dtype and sharding are known when the program is submitted,
before anything runs. The ``ObjectStore`` tracks the bytes each live buffer holds on each device,
labelled with the program and client that own it. A buffer is freed when the last reference to
its future goes (user code and not-yet-run consumers both hold references), and also when its
program fails or is cancelled, since then nothing holds it.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from .errors import CancelledError, ControllerClosedError


class FutureState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_PENDING, _DONE = FutureState.PENDING, FutureState.DONE
_RUNNING = "running"  # a producer task's state from its launch to its end (a TaskState value)
_clock = time.perf_counter
_DTYPES: dict[Any, np.dtype] = {}  # np.dtype() of each dtype given: a lookup is 10x cheaper


def _dtype(dtype) -> np.dtype:
    out = np.dtype(dtype)
    if out.metadata is None and out.fields is None:  # (equal dtypes that differ in those)
        try:
            _DTYPES[dtype] = out
        except TypeError:
            pass
    return out


def shard_bytes(shape: tuple[int, ...], dtype, sharding) -> dict[int, int]:
    """Bytes a buffer of ``shape``/``dtype`` laid out by ``sharding`` holds on each device."""
    per = int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * np.dtype(dtype).itemsize
    return {d.id: per for d in sharding.device_set}


def _on_value(op: Callable) -> Callable:
    """A method of ``Future`` that applies ``op`` to the value (waiting for it), as a
    ``jax.Array`` would do it."""
    def method(self, *args):
        return op(self.result(), *args)
    method.__name__ = getattr(op, "__name__", "method")
    return method


class _Held(weakref.ref):
    """The store's entry for one live buffer, in one object (one is made per value a program
    returns): a weak reference to the future (its callback frees the buffer), the value, whether
    the user took it (``exported``: never deleted then), its ``BufferRecord``, and ``freeing``
    (set once, under the store's lock, by whoever frees it)."""

    __slots__ = ("key", "value", "exported", "record", "freeing")


class _Buffer:
    """The value of a future that belongs to no store (given by the user: never deleted)."""

    __slots__ = ("value", "exported")

    def __init__(self, value):
        self.value, self.exported = value, True


class Future:
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
                 "_launched", "_lock", "t_created", "t_done", "weak_type", "__weakref__")

    def __init__(self, shape, dtype, sharding=None, *, name: str = "", island: int | None = None,
                 run=None, store: ObjectStore | None = None):
        self.shape = shape if type(shape) is tuple else tuple(shape)
        try:
            self.dtype = _DTYPES[dtype]
        except (KeyError, TypeError):  # (TypeError: an unhashable dtype spec)
            self.dtype = _dtype(dtype)
        self.sharding, self.name, self.island, self.run, self._store = (sharding, name, island,
                                                                          run, store)
        self._buffer: _Held | _Buffer | None = None
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

    def __await__(self):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(fut: Future) -> None:
            def settle() -> None:
                if waiter.cancelled():
                    return
                try:
                    waiter.set_result(fut.result(0))
                except BaseException as e:  # noqa: BLE001 - hand the error to the awaiter
                    waiter.set_exception(e)
            loop.call_soon_threadsafe(settle)

        self.add_done_callback(wake)
        return waiter.__await__()

    # --- values on demand: where Python needs the value, wait for it (as jax.Array does) ---
    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self.result())
        return out.astype(dtype) if dtype is not None else out

    def __jax_array__(self):
        return self.result()

    # (each of these: the value's own, once it is there)
    item = _on_value(lambda v, *args: v.item(*args))
    tolist = _on_value(lambda v: v.tolist())
    __float__, __int__, __complex__, __bool__ = map(_on_value, (float, int, complex, bool))
    __index__ = _on_value(operator.index)
    __lt__, __le__, __gt__, __ge__ = map(_on_value, (operator.lt, operator.le, operator.gt,
                                                     operator.ge))

    def __format__(self, spec: str) -> str:
        return format(self.result(), spec) if spec else repr(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d (scalar) Future")
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

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
        fut = cls(np.shape(value), dtype, sharding)
        fut._set_result(value)
        return fut

    # --- runtime side ----------------------------------------------------------------------
    def _hook(self, fn: Callable[[Future], None]) -> None:
        """Like add_done_callback, but for the runtime: hooks are dropped once fired."""
        with self._lock:
            if not self.done():
                if self._hooks is None:
                    self._hooks = []
                self._hooks.append(fn)
                return
        fn(self)

    def _on_launch(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` once the value's computation is launched (or the future resolved):
        consumers may then be launched behind it."""
        with self._lock:
            if self._launched is None and self._state is _PENDING:
                if self._launch_hooks is None:
                    self._launch_hooks = []
                self._launch_hooks.append(fn)
                return
        fn(self)

    def _set_launched(self, value) -> None:
        with self._lock:
            if self._state is not _PENDING:
                return
            self._launched = value
            hooks, self._launch_hooks = self._launch_hooks, None
        if hooks:
            for fn in hooks:
                fn(self)

    def _peek(self):
        """The value (possibly not ready yet) without marking it exported, for consumers."""
        buf = self._buffer
        return self._launched if buf is None else buf.value

    def _set_result(self, value, t_done: float = 0.0, reserved: bool = False,
                    nbytes: dict[int, int] | None = None) -> None:
        store = self._store
        self._buffer = _Buffer(value) if store is None else store.add(self, value, reserved,
                                                                        nbytes)
        self._resolve(_DONE, None, t_done)

    @staticmethod
    def _set_results(futures: Sequence[Future], values: Sequence, t_done: float = 0.0,
                     reserved: bool = False,
                     nbytes: Sequence[dict[int, int] | None] | None = None) -> None:
        """``_set_result`` for many futures at once (a node's outputs): ``futures[i]`` gets
        ``values[i]`` (``nbytes[i]`` its bytes per device, computed from its sharding when
        None). Their store counts them all under one lock; then each resolves, in order."""
        if not futures:
            return
        first: Future = futures[0]
        store = first._store
        for f in futures:
            fut: Future = f
            if fut._store is not store:
                raise ValueError("Future._set_results takes futures of one object store (a "
                                 "node's outputs); resolve futures of others one by one.")
        held = None if store is None else store.add_many(futures, values, reserved, nbytes)
        for i, f in enumerate(futures):
            fut: Future = f
            fut._buffer = _Buffer(values[i]) if held is None else held[i]
            fut._resolve(_DONE, None, t_done)

    def _set_exception(self, error: BaseException, t_done: float = 0.0) -> None:
        state = FutureState.CANCELLED if isinstance(error, CancelledError) else FutureState.FAILED
        self._resolve(state, error, t_done)

    def _resolve(self, state: FutureState, error, t_done: float) -> bool:
        with self._lock:
            if self._state is not _PENDING:
                return False
            self._state, self._error, self.t_done = state, error, t_done
            self._launched = None
            launch_hooks, hooks, callbacks = self._launch_hooks, self._hooks, self._callbacks
            self._launch_hooks = self._hooks = self._callbacks = None
            event = self._event
        if event is not None:
            event.set()
        if launch_hooks:
            for fn in launch_hooks:
                fn(self)
        if hooks:
            for fn in hooks:
                fn(self)
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:  # a user's callback must not break the runtime
                    import logging
                    logging.getLogger("pwkernel").exception("future done-callback raised")
        return True


resolved = Future.resolved  # a future that is already done (program inputs given as arrays)


class BufferRecord(NamedTuple):
    """The store's entry for one live buffer: bytes per device and its ownership labels (a
    named tuple: one is made per value a program returns)."""

    nbytes: dict[int, int]
    program: str
    program_id: int
    client: str
    island: int | None = None
    reserved: bool = False  # admitted by the island's scheduler against its memory budget


def _record(fields: tuple) -> BufferRecord:
    """A ``BufferRecord`` from its six fields, without the named tuple's Python ``__new__``."""
    return tuple.__new__(BufferRecord, fields)


class ObjectStore:
    """Tracks the device memory held by live futures, per device, with ownership labels.

    ``on_free(record)`` is called (from whichever thread dropped the last reference) when a
    buffer is freed, so the schedulers can admit work that was waiting for memory.
    ``fetch(value, sharding)``: the value as a local ``jax.Array`` (the executor's; a value
    that is already one is handed out as it is, and then never deleted by the store).

    One ``_Held`` per live buffer, in one dict; a buffer counts in ``memory()`` until
    ``on_free`` has returned. A free walks nothing of the buffer (its size costs nothing here):
    it deletes the array, and XLA returns the memory after the computations still reading it.
    """

    def __init__(self, on_free: Callable[[BufferRecord], None] = lambda r: None,
                 fetch: Callable[[Any, Any], Any] | None = None):
        self._fetch = fetch
        self._held: dict[int, _Held] = {}  # key -> entry, until its memory is given back
        self._lock = threading.RLock()  # a GC inside a locked section may free on this thread
        self._keys = itertools.count()
        self._on_free = on_free
        self._on_drop = self._free  # the weak references' callback, bound once
        self.closed = False

    def _entry(self, fut: Future, value, reserved: bool, nbytes: dict[int, int] | None
               ) -> _Held:
        held = _Held(fut, self._on_drop)
        held.value, held.exported, held.freeing = value, False, False
        if nbytes is None:
            nbytes = shard_bytes(fut.shape, fut.dtype, fut.sharding) if fut.sharding else {}
        run = fut.run
        held.record = _record((nbytes, "", -1, "default", fut.island, reserved)) if run is None \
            else _record((nbytes, run.name, run.id, run.client, fut.island, reserved))
        return held

    def add(self, fut: Future, value, reserved: bool = False,
            nbytes: dict[int, int] | None = None) -> _Held:
        """Count ``value``, the value of ``fut``, until ``fut`` goes (or is freed)."""
        held = self._entry(fut, value, reserved, nbytes)
        with self._lock:
            held.key = key = next(self._keys)
            self._held[key] = held
        return held

    def add_many(self, futures: Sequence[Future], values: Sequence, reserved: bool = False,
                 nbytes: Sequence[dict[int, int] | None] | None = None) -> list[_Held]:
        """``add`` for many futures at once (one lock for all): ``values[i]`` of
        ``futures[i]``, ``nbytes[i]`` its bytes per device (None: from its sharding)."""
        if nbytes is None:
            nbytes = itertools.repeat(None, len(futures))
        entry = self._entry  # (zip: a value and an nbytes per future, or a ValueError)
        made = [entry(f, v, reserved, n) for f, v, n in zip(futures, values, nbytes, strict=True)]
        held, keys = self._held, self._keys
        with self._lock:
            for h in made:
                h.key = key = next(keys)
                held[key] = h
        return made

    def fetch(self, fut: Future, held: _Held | _Buffer):
        """The value of ``fut`` for the user (``Future.result()``)."""
        value = held.value
        if self._fetch is not None:
            local = self._fetch(value, fut.sharding)
            if local is not value:
                return local  # a copy: the store may still free the original
        held.exported = True
        return value

    def _free(self, held: _Held) -> None:
        with self._lock:
            if held.freeing:
                return  # freed already (or being freed by another thread)
            held.freeing = True
        value, held.value = held.value, None
        if not held.exported:
            delete = getattr(value, "delete", None)
            if delete is not None:
                try:
                    delete()
                except Exception:  # already deleted or donated: nothing left to free
                    pass
        try:
            self._on_free(held.record)
        finally:  # counted until the scheduler has its memory back: memory() == 0 says so
            with self._lock:
                self._held.pop(held.key, None)

    def memory(self) -> dict[int, int]:
        """Bytes held by live buffers on each device (devices holding nothing are omitted)."""
        out: dict[int, int] = {}
        with self._lock:
            for held in self._held.values():
                for d, n in held.record.nbytes.items():
                    out[d] = out.get(d, 0) + n
        return out

    def records(self) -> list[BufferRecord]:
        with self._lock:
            return [held.record for held in self._held.values()]

    def live(self) -> list[tuple[BufferRecord, Future | None]]:
        """Each live buffer's record with its future (None once it is being freed). The
        caller holds those futures: it should drop the list outside its own locks."""
        with self._lock:
            return [(held.record, held()) for held in self._held.values() if not held.freeing]

    def close(self) -> None:
        """Free every buffer; futures of this store refuse to hand out values from now on."""
        self.closed = True
        with self._lock:
            todo = [held for held in self._held.values() if not held.freeing]
        for held in todo:
            self._free(held)

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
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from .errors import CancelledError, ControllerClosedError


class FutureState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


def shard_bytes(shape: tuple[int, ...], dtype, sharding) -> dict[int, int]:
    """Bytes a buffer of ``shape``/``dtype`` laid out by ``sharding`` holds on each device."""
    per = int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * np.dtype(dtype).itemsize
    return {d.id: per for d in sharding.device_set}


class _Ref(weakref.ref):
    """The store's weak reference to a future, with the key and buffer it stands for (one
    object per live buffer: the store's bookkeeping allocates little)."""

    __slots__ = ("key", "buf")


@dataclass(slots=True)
class _Buffer:
    """What the store keeps for a live value: the array, and whether the user took it."""

    key: int
    value: Any = None
    exported: bool = False


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
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding
        self.name = name
        self.island = island
        self.run = run
        self._store = store
        self._buffer: _Buffer | None = None
        self._state = FutureState.PENDING
        self._error: BaseException | None = None
        self._event: threading.Event | None = None  # made only when someone waits
        self._callbacks: list[Callable[[Future], None]] | None = None  # lists made when used
        self._hooks: list[Callable[[Future], None]] | None = None
        self._launch_hooks: list[Callable[[Future], None]] | None = None
        self._launched = None  # the not-yet-ready array once its computation is launched
        self.producer = None   # the runtime task that makes this value
        self._lock = threading.Lock()
        self.t_created = time.perf_counter()
        self.t_done = 0.0
        self.weak_type = False  # a weakly typed value (from Python scalars), as JAX types it

    @property
    def store(self) -> ObjectStore | None:
        """The object store (of its controller) that holds its buffer; None outside one."""
        return self._store

    # --- the concurrent.futures-like surface -----------------------------------------------
    @property
    def state(self) -> FutureState:
        return self._state

    def done(self) -> bool:
        return self._state is not FutureState.PENDING

    def running(self) -> bool:
        return self._state is FutureState.PENDING

    def cancelled(self) -> bool:
        return self._state is FutureState.CANCELLED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the future resolves; False on timeout."""
        if self._state is not FutureState.PENDING:
            return True
        producer = self.producer
        if producer is not None:  # the waiting thread may see its end itself
            producer.expedite(timeout)
        with self._lock:
            if self._state is not FutureState.PENDING:
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

    def item(self, *args):
        return self.result().item(*args)

    def tolist(self):
        return self.result().tolist()

    def __float__(self) -> float:
        return float(self.result())

    def __int__(self) -> int:
        return int(self.result())

    def __index__(self) -> int:
        return self.result().__index__()

    def __complex__(self) -> complex:
        return complex(self.result())

    def __bool__(self) -> bool:
        return bool(self.result())

    def __format__(self, spec: str) -> str:
        return format(self.result(), spec) if spec else repr(self)

    def __lt__(self, other):
        return self.result() < other

    def __le__(self, other):
        return self.result() <= other

    def __gt__(self, other):
        return self.result() > other

    def __ge__(self, other):
        return self.result() >= other

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
            if self._launched is None and self._state is FutureState.PENDING:
                if self._launch_hooks is None:
                    self._launch_hooks = []
                self._launch_hooks.append(fn)
                return
        fn(self)

    def _set_launched(self, value) -> None:
        with self._lock:
            if self._state is not FutureState.PENDING:
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
        if self._store is not None:
            self._buffer = self._store.add(self, value, reserved, nbytes)
        else:
            self._buffer = _Buffer(-1, value, exported=True)
        self._resolve(FutureState.DONE, None, t_done)

    def _set_exception(self, error: BaseException, t_done: float = 0.0) -> None:
        state = FutureState.CANCELLED if isinstance(error, CancelledError) else FutureState.FAILED
        self._resolve(state, error, t_done)

    # the runtime side's public names, for the runtime's other modules (tasks, dispatcher)
    hook, on_launch, set_launched, peek = _hook, _on_launch, _set_launched, _peek
    set_result, set_exception = _set_result, _set_exception

    @property
    def error(self) -> BaseException | None:
        """The error it resolved with; None while pending or once resolved with a value."""
        return self._error

    def _resolve(self, state: FutureState, error, t_done: float) -> bool:
        with self._lock:
            if self._state is not FutureState.PENDING:
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


def resolved(value, sharding=None) -> Future:
    """A future that is already done (program inputs given as arrays)."""
    fut = Future(np.shape(value), getattr(value, "dtype", np.asarray(value).dtype), sharding)
    fut._set_result(value)
    return fut


class BufferRecord(NamedTuple):
    """The store's entry for one live buffer: bytes per device and its ownership labels (a
    named tuple: one is made per value a program returns)."""

    nbytes: dict[int, int]
    program: str
    program_id: int
    client: str
    island: int | None = None
    reserved: bool = False  # admitted by the island's scheduler against its memory budget


class ObjectStore:
    """Tracks the device memory held by live futures, per device, with ownership labels.

    ``on_free(record)`` is called (from whichever thread dropped the last reference) when a
    buffer is freed, so the schedulers can admit work that was waiting for memory.
    ``fetch(value, sharding)``: the value as a local ``jax.Array`` (the executor's; a value
    that is already one is handed out as it is, and then never deleted by the store).
    """

    def __init__(self, on_free: Callable[[BufferRecord], None] = lambda r: None,
                 fetch: Callable[[Any, Any], Any] | None = None):
        self._fetch = fetch
        self._records: dict[int, BufferRecord] = {}
        self._lock = threading.RLock()
        self._keys = itertools.count()
        self._on_free = on_free
        self._watch: dict[int, _Ref] = {}  # key -> the future's weak reference (and buffer)
        self._on_drop = self._dropped  # bound once, not per buffer
        self.closed = False

    def add(self, fut: Future, value, reserved: bool = False,
            nbytes: dict[int, int] | None = None) -> _Buffer:
        key = next(self._keys)
        buf = _Buffer(key, value)
        run = fut.run
        if nbytes is None:
            nbytes = shard_bytes(fut.shape, fut.dtype, fut.sharding) if fut.sharding else {}
        if run is None:
            record = BufferRecord(nbytes, "", -1, "default", fut.island, reserved)
        else:
            record = BufferRecord(nbytes, run.name, run.id, run.client, fut.island, reserved)
        ref = _Ref(fut, self._on_drop)
        ref.key, ref.buf = key, buf
        with self._lock:
            self._records[key] = record
            self._watch[key] = ref
        return buf

    def _dropped(self, ref: _Ref) -> None:
        """The last reference to a future went (a weakref callback)."""
        self._free(ref.key)

    def fetch(self, fut: Future, buf: _Buffer):
        """The value of ``fut`` for the user (``Future.result()``)."""
        value = buf.value
        if self._fetch is not None:
            local = self._fetch(value, fut.sharding)
            if local is not value:
                return local  # a copy: the store may still free the original
        buf.exported = True
        return value

    def _free(self, key: int) -> None:
        with self._lock:
            record = self._records.get(key)
            ref = self._watch.pop(key, None)
        buf = None if ref is None else ref.buf
        if record is None or buf is None:
            return  # freed already (or being freed by another thread)
        if not buf.exported and hasattr(buf.value, "delete"):
            try:
                buf.value.delete()
            except Exception:  # already deleted or donated: nothing left to free
                pass
        buf.value = None
        try:
            self._on_free(record)
        finally:  # counted until the scheduler has its memory back: memory() == 0 says so
            with self._lock:
                self._records.pop(key, None)

    def memory(self) -> dict[int, int]:
        """Bytes held by live buffers on each device (devices holding nothing are omitted)."""
        out: dict[int, int] = {}
        with self._lock:
            for rec in self._records.values():
                for d, n in rec.nbytes.items():
                    out[d] = out.get(d, 0) + n
        return out

    def records(self) -> list[BufferRecord]:
        with self._lock:
            return list(self._records.values())

    def live(self) -> list[tuple[BufferRecord, Future | None]]:
        """Each live buffer's record with its future (None once it is being freed). The
        caller holds those futures: it should drop the list outside its own locks."""
        with self._lock:
            return [(self._records[k], ref()) for k, ref in self._watch.items()
                    if k in self._records]

    def close(self) -> None:
        """Free every buffer; futures of this store refuse to hand out values from now on."""
        self.closed = True
        with self._lock:
            keys = list(self._watch)
        for key in keys:
            self._free(key)

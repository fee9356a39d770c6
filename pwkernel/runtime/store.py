"""The object store: the device memory held by live futures, per device, with ownership
labels, and the freeing of a buffer when its future goes.

One entry per live buffer (``_Held``, a weak reference to the future that carries the value,
its bytes and its labels; its ``BufferRecord`` is made when asked for); ``add_many`` counts a
node's outputs under one lock. A free takes no lock (one atomic claim) and walks nothing of the
buffer: it deletes the array (XLA gives the memory back once the computations still reading it
have run), so its host cost does not grow with the buffer's size.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from .dtypes import itemsize
from .interrupts import held as interrupts_held
from .interrupts import held_quietly, holds_from_entry


class Future(Protocol):
    """What the store reads of a ``runtime.objects.Future`` (which imports this module)."""

    shape: tuple[int, ...]
    dtype: Any
    sharding: Any
    island: int | None
    run: Any
    donated: bool


def shard_bytes(shape: tuple[int, ...], dtype, sharding) -> dict[int, int]:
    """Bytes a buffer of ``shape``/``dtype`` laid out by ``sharding`` holds on each device."""
    per = int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * itemsize(dtype)
    return {d.id: per for d in sharding.device_set}


_ARRAYS: set[type] = set()  # the concrete jax.Array types seen (a type test is cheaper)


def _asked(value) -> bool:
    """Whether a value's launch was asked through it: a live array (not one given to a
    donating launch since, or a host value, such as a ``float0`` gradient, which no launch
    computed)."""
    return (type(value) in _ARRAYS or _is_array(value)) and not value.is_deleted()


def _is_array(value) -> bool:
    if isinstance(value, jax.Array):
        _ARRAYS.add(type(value))
        return True
    return False


class _Held(weakref.ref):
    """The store's entry for one live buffer, in one object (one is made per value a program
    returns): a weak reference to the future (its callback frees the buffer), the value, whether
    the user took it (``exported``: never deleted then), whether a launched computation consumed
    it (``donated``: a ``jax.Array`` has nothing left to delete then), its bytes per device
    and its labels (its ``BufferRecord``'s other fields, one tuple shared by a node's
    outputs: the record is made when asked for), and
    ``claim`` (a one-item list: whoever pops the item frees the buffer, one atomic step, so
    the future's going and ``close()`` never free it twice; empty once it is being freed).
    ``reserve``: the same for the bytes a memory budget counts (None: nobody is told of
    frees, or they were never reserved): whoever pops it gives them back, its free or the
    launch that consumes (donates) it, whichever comes first, so never both. ``unchecked``:
    a one-item list shared by the outputs of one launch (``add_many``), emptied once one of
    them is seen to hold no error (``failure``): they share the launch's fate, so the others
    need not ask."""

    __slots__ = ("key", "value", "exported", "donated", "nbytes", "labels", "claim", "reserve",
                 "unchecked")

    @property
    def record(self) -> BufferRecord:
        record = BufferRecord(self.nbytes, *self.labels)
        return record if self.reserve is None or self.reserve else record._replace(
            reserved=False)  # (given back already: a launch consumed it)


class BufferRecord(NamedTuple):
    """What the store records of one live buffer: bytes per device and its ownership labels
    (a named tuple, made when asked for: ``records()``, ``live()``, ``on_free``)."""

    nbytes: dict[int, int]
    program: str
    program_id: int
    client: str
    island: int | None = None
    reserved: bool = False  # admitted by the island's scheduler against its memory budget


class ObjectStore:
    """Tracks the device memory held by live futures, per device, with ownership labels.

    ``on_free(record)`` is called (from whichever thread dropped the last reference) when a
    buffer is freed, so the schedulers can admit work that was waiting for memory (None: no
    one needs telling, and no record is made).
    ``fetch(value, sharding)``: the value as a local ``jax.Array`` (the executor's; a value
    that is already one is handed out as it is, and then never deleted by the store).

    One ``_Held`` per live buffer, in one dict; a buffer counts in ``memory()`` until
    ``on_free`` has returned. A free walks nothing of the buffer (its size costs nothing here):
    it deletes the array, and XLA returns the memory after the computations still reading it.
    """

    def __init__(self, on_free: Callable[[BufferRecord], None] | None = None,
                 fetch: Callable[[Any, Any], Any] | None = None,
                 failure: Callable[[Any], BaseException | None] | None = None):
        self._fetch = fetch
        self._failure = failure
        self._held: dict[int, _Held] = {}  # key -> entry, until its memory is given back
        # Reentrant: a garbage collection inside a locked section may free on this thread
        # (so readers iterate over a copy of the entries).
        self._lock = threading.RLock()
        self._on_free = on_free
        self._on_drop = self._dropped  # the weak references' callback, bound once
        self.closed = False

    def add(self, fut: Future, value, reserved: bool = False,
            nbytes: dict[int, int] | None = None) -> _Held:
        """Count ``value``, the value of ``fut``, until ``fut`` goes (or is freed).
        ``nbytes``: its bytes per device (None: from its sharding)."""
        return self.add_many((fut,), (value,), (nbytes,), reserved)[0]

    def add_many(self, futures: Sequence[Future], values: Sequence,
                 nbytes: Sequence[dict[int, int] | None] | None = None,
                 reserved: bool = False, skip_donated: bool = False) -> list[_Held | None]:
        """``add`` for many values at once (a node's outputs: one launch made them all), under
        one lock: ``futures``
        with their ``values`` and ``nbytes`` (in order, as sequences side by side: no tuple
        per value; None: every size from its sharding); the entries come back in that
        order. ``skip_donated``: a ``jax.Array`` a later launch consumed already (its future
        ``donated``) gets no entry (None): that buffer is the consumer's now, nothing is left
        to count or delete (a training step's state, donated into the next step before its
        own step has ended, the usual case, costs the store nothing); bytes ``reserved``
        under a memory budget are given back now (``on_free``), once. A backend's handle is
        entered all the same: deleting it is what frees the island's copy."""
        out, on_drop, last, island, labels = [], self._on_drop, _Held, _Held, ()
        unchecked = [True]  # (one launch's outputs: see ``failure``)
        told = reserved and self._on_free is not None  # (its entries get a ``reserve``)
        given = None  # the skipped ones' reserved bytes, given back below
        for i, fut in enumerate(futures):
            value = values[i]
            size = None if nbytes is None else nbytes[i]
            if size is None:
                size = shard_bytes(fut.shape, fut.dtype, fut.sharding) if fut.sharding else {}
            run = fut.run
            if run is not last or fut.island != island:  # (a node's outputs share them)
                last, island = run, fut.island
                labels = ("", -1, "default", island, reserved) if run is None else (
                    run.name, run.id, run.client, island, reserved)
            if skip_donated and fut.donated and (type(value) in _ARRAYS or _is_array(value)):
                out.append(None)
                if told:
                    given = [] if given is None else given
                    given.append(BufferRecord(size, *labels))
                continue
            held = _Held(fut, on_drop)
            held.value, held.exported, held.claim = value, False, [True]
            held.donated, held.reserve = fut.donated, [True] if told else None
            held.nbytes, held.labels, held.unchecked = size, labels, unchecked
            out.append(held)
        entries = self._held
        with self._lock:  # (an entry's key is its id: unique while it is in the dict)
            for held in out:
                if held is not None:
                    held.key = key = id(held)
                    entries[key] = held
        if given:
            for record in given:
                self._on_free(record)
        return out

    def give_back(self, held) -> None:
        """A launch consumed (donated) the buffer of ``held`` (an entry of this store; a
        value no store counts is left alone): its reserved bytes are given back now
        (``on_free``), as XLA reuses them for the launch's outputs, unless its free, or an
        earlier call, did already. The entry stays, counted, until its future goes."""
        reserve = held.reserve if type(held) is _Held else None
        if reserve is None:
            return
        try:
            reserve.pop()
        except IndexError:
            return  # given back already
        self._on_free(BufferRecord(held.nbytes, *held.labels))

    def _tell_freed(self, held: _Held) -> None:
        """``on_free`` for a buffer being freed: with its reserved bytes, unless a launch
        that consumed it gave them back already (then its record says none are reserved)."""
        reserve = held.reserve
        if reserve is not None:
            try:
                reserve.pop()
            except IndexError:
                pass  # (the record made below says reserved=False)
            else:
                self._on_free(BufferRecord(held.nbytes, *held.labels))
                return
        self._on_free(held.record)

    def fetch(self, fut: Future, held: _Held):
        """The value of ``fut`` for the user (``Future.result()``); None if it was freed (by
        ``close()`` in another thread). Marked the user's, then read again: a free that took
        the value before that sees the mark and deletes nothing, and one that took it after is
        seen here (a free takes the value, then reads the mark)."""
        value = held.value
        if self._fetch is not None and value is not None:
            local = self._fetch(value, fut.sharding)
            if local is not value:
                return local  # a copy: the store may still free the original
        held.exported = True
        return value if held.value is value else None

    def failure(self, held: _Held, value=None) -> BaseException | None:
        """The error a value holds that its computation's end did not report (the backend's
        ``failure``: a local launch that failed while it ran and was seen ready at once);
        None when there is none, or the backend keeps no such errors.

        Asked once per launch: a launch's outputs hold its one error or none (XLA fails them
        all together), so once one of them, alive, holds none, its siblings are not asked
        (asking waits on the value: the GIL is let go and taken back, per output, and a
        training step's state has dozens, all read when a loop waits for its step).
        ``value``: the one ``fetch`` handed out (default: the one held)."""
        value = held.value if value is None else value
        if self._failure is None or value is None or not held.unchecked:
            return None
        error = self._failure(value)
        if error is None and _asked(value):
            held.unchecked.clear()
        return error

    @holds_from_entry
    def _dropped(self, held: _Held, _quietly=held_quietly, _exiting=sys.is_finalizing) -> None:
        """A future went: free its buffer (run wherever Python collects it, so an interrupt
        waits for the free's end and is raised by the runtime's next call, or 50 ms after the
        free if none came first: ``interrupts``). Not while the interpreter exits: the process
        gives its memory back, and this module's globals may be gone already (what it uses
        here is bound as defaults)."""
        if _exiting():
            return
        with _quietly:
            self._free(held)

    def _free(self, held: _Held) -> None:
        try:
            held.claim.pop()
        except IndexError:
            return  # freed already (or being freed by another thread)
        value, held.value = held.value, None
        if not held.exported and not (held.donated and (type(value) in _ARRAYS
                                                        or _is_array(value))):
            delete = getattr(value, "delete", None)
            if delete is not None:
                try:
                    delete()
                except Exception:  # already deleted or donated: nothing left to free
                    pass
        try:
            if self._on_free is not None:
                self._tell_freed(held)
        finally:  # counted until the scheduler has its memory back: memory() == 0 says so
            self._held.pop(held.key, None)  # (one dict operation: atomic; readers copy)

    def forget(self, island: int) -> int:
        """Stop counting the buffers that lived on ``island``, lost with it (its process died
        and a new one took its place): their memory is given back at once, while their
        futures stay, and say the value is lost when read. Returns how many were counted."""
        with self._lock:
            todo = [held for held in list(self._held.values())
                    if held.claim and held.labels[3] == island]
        count = 0
        with interrupts_held:
            for held in todo:
                try:
                    held.claim.pop()  # (its future's own free, later, does nothing)
                except IndexError:
                    continue
                count += 1
                try:
                    if self._on_free is not None:
                        self._tell_freed(held)
                finally:
                    self._held.pop(held.key, None)
        return count

    def memory(self, counted: dict[int, tuple] | None = None) -> dict[int, int]:
        """Bytes held by live buffers on each device (devices holding nothing are omitted).
        A buffer a launch consumed (donated) holds none: XLA reuses it for the outputs, which
        count, though its entry stays until its future goes. ``counted``: a dict filled with
        ``id(future): (future, nbytes)`` for each buffer counted (``ctl.memory()`` takes back
        one that a launch consumed before it was marked so: ``Dispatcher.memory``)."""
        out: dict[int, int] = {}
        with self._lock:
            for held in list(self._held.values()):
                if held.donated:
                    continue
                for d, n in held.nbytes.items():
                    out[d] = out.get(d, 0) + n
                if counted is not None and (fut := held()) is not None:
                    counted[id(fut)] = (fut, held.nbytes)
        return out

    def records(self) -> list[BufferRecord]:
        with self._lock:
            return [held.record for held in list(self._held.values())]

    def live(self) -> list[tuple[BufferRecord, Future | None]]:
        """Each live buffer's record with its future (None once it is being freed). The
        caller holds those futures: it should drop the list outside its own locks."""
        with self._lock:
            return [(held.record, held()) for held in list(self._held.values()) if held.claim]

    def close(self) -> None:
        """Free every buffer; futures of this store refuse to hand out values from now on."""
        self.closed = True
        with self._lock:
            todo = [held for held in list(self._held.values()) if held.claim]
        with interrupts_held:
            for held in todo:
                self._free(held)

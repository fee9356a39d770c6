"""The controller's side of one Ray island: the messages it sends and the ends it sees.

- A launch (in the order the island's gang scheduler decided) becomes an item of the island's
  next *message* (``actor.submit``), sent by the island's launcher thread. While a program is
  submitted the island pauses its launches (``pause``), so with parallel dispatch an island
  receives all of a program's nodes (computations and the transfers into and out of it) in one
  message, ahead of the data, and waits on its inputs itself; with sequential dispatch (the
  baseline) a node is sent once its inputs exist, so each node is its own message.
- A watcher thread collects the actor's completion records (``poll``) and reports each item's
  end in launch order (actor times mapped onto the controller's clock).
- Values are ``RemoteBuffer`` handles (island, generation, buffer id); they are fetched from
  the island only when the user asks (``fetch``).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import queue
import threading
import time

import numpy as np
import ray

from ...runtime.errors import CancelledError, IslandLostError, deleted_input, donated_and_read_in
from ...runtime.tasks import Task
from .cluster import IslandHost
from .hostvalues import from_host, to_host
from .ops import jax_settings

_now = time.perf_counter
_WAIT_INPUTS = 60.0  # seconds of silence from an actor, while closing, before giving up
_POLL = 1.0  # seconds one poll for completion records waits on the actor
_FREE_DELAY = 0.02  # seconds buffer frees wait to be sent together (or with work)


class RemoteBuffer:
    """A buffer in an island actor's device memory. ``delete`` (called when the last future
    goes) frees it there, later, from the island's launcher thread."""

    __slots__ = ("host", "generation", "bid", "donated", "_local", "__weakref__")

    def __init__(self, host: IslandHost, bid: int):
        self.host, self.generation, self.bid = host, host.generation, bid
        self.donated: str | None = None  # the computation it was given to (donate_argnums)
        self._local = None

    @property
    def alive(self) -> bool:
        return self.generation == self.host.generation and not self.host.lost

    def lost_error(self) -> IslandLostError:
        return IslandLostError(
            f"island {self.host.island} was lost (its Ray actor died) and buffer {self.bid} "
            f"with it; {self.host.lost_advice()}, then rerun the program that made this "
            "value.")

    def fetch(self, sharding):
        """The value as a local ``jax.Array`` laid out like the future (once, then cached)."""
        if self._local is None:
            if not (self.host.reachable() and self.alive):
                raise self.lost_error()
            if self.donated is not None:
                raise deleted_input(f"this value was given to {self.donated}, which "
                                    "donates it and now owns its buffer")
            try:
                value = ray.get(self.host.actor.fetch.remote(self.bid))
            except ray.exceptions.RayActorError:
                self.host.mark_lost()
                raise self.lost_error() from None
            self._local = from_host(value, sharding)
        return self._local

    def delete(self) -> None:
        self.host.free(self.generation, self.bid)

    def __repr__(self) -> str:
        return f"RemoteBuffer(island={self.host.island}, id={self.bid})"


def layout(sharding, island) -> tuple:
    """How ``sharding`` (over the controller's stand-in devices) maps onto the actor's."""
    mesh = sharding.mesh
    index = {d.id: i for i, d in enumerate(island.devices)}
    positions = tuple(index[d.id] for d in mesh.devices.flat)
    return positions, tuple(mesh.devices.shape), tuple(mesh.axis_names), sharding.spec


def _short(struct) -> str:
    """``float32[4,2]``, as JAX writes an array's type."""
    try:
        name = np.dtype(struct.dtype).name
    except TypeError:  # (a typed key's dtype)
        name = str(struct.dtype)
    return f"{name}[{','.join(map(str, struct.shape))}]"


def remote_error(record: dict, island: int) -> BaseException:
    """The exception an island's failed completion record stands for: the same type as the
    island raised (an exception class of Python, JAX or pwkernel, made from its message,
    noted with the island), else a ``RuntimeError`` that names the type in its text."""
    path, message = record.get("type"), record.get("message")
    cls = None
    if path and message is not None:
        module, _, qualname = path.partition(":")
        if module.split(".")[0] in ("builtins", "jax", "jaxlib", "pwkernel"):
            try:
                cls = importlib.import_module(module)
                for part in qualname.split("."):
                    cls = getattr(cls, part)
            except (ImportError, AttributeError):
                cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            error = cls(message)
        except Exception:  # noqa: BLE001 - a constructor that wants more: plain text then
            error = None
        if error is not None and str(error) == message:
            error.add_note(f"(raised on Ray island {island})")
            return error
    return RuntimeError(f"on island {island}: {record['error']}")


def _unreachable(host: IslandHost, error: Exception) -> None:
    """A Ray call to ``host``'s actor raised ``error`` where Ray raises only its own errors
    for an actor it knows (it says "it's from a different cluster": the user's ``ray.init``
    after a ``ray.shutdown()``): the island is lost to this controller."""
    logging.getLogger("pwkernel").warning("island %s: Ray cannot reach its actor, so the "
                                          "island is lost: %s", host.island, error)
    host.mark_lost()


def host_lost(host: IslandHost) -> IslandLostError:
    return IslandLostError(f"island {host.island} was lost (its Ray actor died) while this "
                           f"computation needed it; {host.lost_advice()}.")


def unusable(task: Task) -> BaseException | None:
    """The error of a launch given a buffer an earlier launch donated, or one that donates an
    input it also reads; else None, and its donated inputs are marked (``RemoteBuffer``)."""
    node = task.node
    donated = node.exe.donated
    try:
        inputs = task.inputs()
    except Exception:  # noqa: BLE001 - (not there yet: the island finds out)
        return None
    for i, value in enumerate(inputs):
        if isinstance(value, RemoteBuffer) and value.donated is not None:
            return deleted_input(
                f"input {i} of {node.name} was given to an earlier call that donates it "
                f"({value.donated}), which now owns its buffer", _short(node.exe.structs[i]))
    error = donated_and_read_in(node.name, inputs, donated, RemoteBuffer,
                                names=lambda: node.exe.input_names)
    if error is not None:
        return error
    for i in donated:
        if isinstance(inputs[i], RemoteBuffer):
            inputs[i].donated = node.name
    return None


class RaySite:
    """One island's launcher thread (messages to the actor, in decision order) and watcher
    thread (completion records, in launch order). ``exported(task, host)`` gives a
    computation's serialized executable (see ``RayBackend``)."""

    def __init__(self, island, host: IslandHost, exported):
        self.island = island
        self.host = host
        self._exported = exported
        self._closing = False
        self._pending: list = []  # items of the next message, in order
        self._unsent: set[int] = set()  # buffer ids that items not yet sent make
        self._held = 0
        self._pending_lock = threading.Lock()
        self._launches: queue.SimpleQueue = queue.SimpleQueue()  # lists of items, or None
        self._completions: queue.SimpleQueue = queue.SimpleQueue()
        self._records: dict[int, dict] = {}
        self._rids = itertools.count()
        self._send_lock = threading.Lock()
        self._seq, self._seq_generation = 0, host.generation
        name = f"pw-ray-island{island.id}"
        self._launcher = threading.Thread(target=self._launch_loop, name=f"{name}-launch",
                                          daemon=True)
        self._watcher = threading.Thread(target=self._watch_loop, name=f"{name}-watch",
                                         daemon=True)
        host.wake = self.poke
        self._launcher.start()
        self._watcher.start()

    # --- the next message -------------------------------------------------------------------
    def enqueue(self, op, task: Task | None, handles: list, extra=None, error=None) -> None:
        """Add an item to the island's next message: ``op`` (an operation without its record
        id, or "compute" for ``task``'s computation), or ``error`` to fail ``task`` in order."""
        with self._pending_lock:
            self._pending.append((op, task, handles, extra, error))
            for h in handles:
                self._unsent.add(h.bid)
            if not self._held:
                self._launches.put(self._pending)
                self._pending = []

    def pause(self) -> None:
        """Keep launches back (in order) until as many ``resume`` calls: one message."""
        with self._pending_lock:
            self._held += 1

    def resume(self) -> None:
        with self._pending_lock:
            self._held -= 1
            if not self._held and self._pending:
                self._launches.put(self._pending)
                self._pending = []

    def poke(self) -> None:
        """Wake the launcher to send pending buffer frees."""
        self._launches.put([])

    def launch(self, task: Task) -> None:
        """A computation the scheduler launched: an item of the next message. Its outputs get
        their ids now, so consumers can name them before the message leaves. Its donated
        inputs are marked now, in decision order (what reads one later fails), and the
        launching thread's JAX settings go with it."""
        error = unusable(task)
        if error is not None:  # nothing donated: the inputs stay valid
            self.enqueue(None, task, [], error=error)
            return
        handles = [RemoteBuffer(self.host, self.host.new_id()) for _ in task.node.outputs]
        self.enqueue(("compute", jax_settings()), task, handles)
        task.t_launch = _now()
        task.launched(handles)

    # --- sending messages ------------------------------------------------------------------
    def _launch_loop(self) -> None:
        stop = False
        while not stop:
            items = self._launches.get()
            if items is None:
                break
            if not items:  # frees are pending: let more gather, or ride along with work
                try:
                    items = self._launches.get(timeout=_FREE_DELAY)
                except queue.Empty:
                    items = []
                if items is None:
                    items, stop = [], True
            while not stop:  # what queued meanwhile goes in the same message
                try:
                    more = self._launches.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                items = items + more
            try:
                self._send_items(items)
            except BaseException:  # noqa: BLE001 - keep launching; the items already failed
                logging.getLogger("pwkernel").exception("ray launcher failed on a message")
            items = more = None  # an idle launcher keeps no task or value alive

    def _send_items(self, items: list) -> None:
        ops, entries = [], []
        for op, task, handles, extra, error in items:
            rid = next(self._rids)
            if error is None:
                try:
                    ops.append(self._compute_op(task, rid, handles, op[1])
                               if op[0] == "compute" else (op[0], rid, *op[1:]))
                except BaseException as e:  # noqa: BLE001 - a failed launch fails its futures
                    error = e
            entries.append((task, rid, handles, error, extra))
        with self._pending_lock:  # their frees may ride in this message, after them
            for entry in entries:
                for h in entry[2]:
                    self._unsent.discard(h.bid)
        sent = self._send(ops)
        for entry in entries:
            self._completions.put((*entry, sent))

    def _send(self, ops: list, always: bool = False):
        """One message to the island's current actor, with the buffer frees pending now;
        returns ``(actor, seq)``, or None when nothing was sent (the island was lost)."""
        host = self.host
        with self._send_lock:  # frees taken here: a later message never overtakes them
            frees = host.take_frees()
            if frees and self._unsent:  # a free never overtakes the item making its buffer
                with self._pending_lock:  # (held back by a submission on another thread)
                    later = [b for b in frees if b in self._unsent]
                if later:
                    host.keep_frees(later)
                    kept = set(later)
                    frees = [b for b in frees if b not in kept]
            if frees:
                ops = [*ops, ("free", frees)]
            actor = host.actor
            if actor is None or host.lost or not (ops or always) or not host.reachable():
                return None
            if host.generation != self._seq_generation:  # a new actor counts from 0
                self._seq, self._seq_generation = 0, host.generation
            try:
                actor.submit.remote(self._seq, ops)
            except Exception as e:  # noqa: BLE001 - Ray cannot reach the actor (a handle of
                # a cluster this process left): the island is lost to it, its items fail
                _unreachable(host, e)
                return None
            self._seq += 1
            host.last_message = (actor, self._seq - 1)  # (a pool's release waits for it)
            return host.last_message

    def sync(self) -> tuple | None:
        """Send pending frees now; returns ``(actor, seq)`` of that message, or None."""
        return self._send([], always=True)

    def _compute_op(self, task: Task, rid: int, handles: list, settings: tuple) -> tuple:
        host = self.host
        if self._closing:
            raise CancelledError(f"{task.node.name}: the controller closed before it ran")
        error = task.input_error()
        if error is not None:
            raise error
        if host.lost or host.actor is None:
            raise host_lost(host)
        refs = []
        for value in task.inputs():
            if isinstance(value, RemoteBuffer):
                if value.host is not host:
                    raise RuntimeError(f"{task.node.name}: an input is on island "
                                       f"{value.host.island}, not {host.island} (a missing "
                                       "transfer; please report this)")
                if not value.alive:
                    raise value.lost_error()
                refs.append(value.bid)
            else:
                refs.append(to_host(value))
        exe = task.node.exe
        key, blob = self._exported(task.node, host)
        host.sent.add(key)
        return ("run", rid, key, blob, [layout(s, self.island) for s in exe.in_shardings],
                [layout(s, self.island) for s in exe.out_shardings], refs,
                [h.bid for h in handles], task.node.name, task.run.client, settings,
                tuple(exe.donated))

    # --- seeing work end -----------------------------------------------------------------
    def _watch_loop(self) -> None:
        while (entry := self._completions.get()) is not None:
            task, rid, handles, error, src_host, sent = entry
            try:
                record = None
                if error is None:
                    try:
                        record, error = self._record(rid, sent)
                    except Exception as e:  # noqa: BLE001 - its future fails with what went
                        error = e  # wrong, never waits for an end nobody reports
                if task is not None:  # None: the first half of a transfer, watched only to
                    self._ended(task, record, handles, error, src_host)  # notice a loss
            except BaseException:  # noqa: BLE001 - keep watching; the task already failed
                logging.getLogger("pwkernel").exception("ray watcher failed on a record")
            # Drop this entry's references now, not when the next one arrives: an idle
            # watcher must not keep a finished node's buffers alive.
            entry = task = handles = error = src_host = record = None

    def _record(self, rid: int, sent) -> tuple[dict | None, BaseException | None]:
        """``(record, error)`` of item ``rid``: poll the actor until its record arrives."""
        host = self.host
        quiet = 0.0
        while rid not in self._records:
            if (sent is None or sent[0] is not host.actor or host.lost
                    or not host.reachable()):
                return None, self._let_go() or host_lost(host)
            t = _now()
            try:
                records = ray.get(sent[0].poll.remote(_POLL))
            except ray.exceptions.RayActorError:
                host.mark_lost()
                return None, host_lost(host)
            except ray.exceptions.RayError as e:  # its own error where it has one (a
                if self._let_go():
                    return None, self._let_go()
                cause = getattr(e, "cause", None)  # pool's TenantRefused), not Ray's wrapper
                if isinstance(cause, Exception):
                    cause.add_note(f"(raised on Ray island {host.island})")
                    return None, cause
                return None, RuntimeError(f"island {host.island}: {e}")
            except Exception as e:  # noqa: BLE001 - Ray cannot reach the actor (see _send)
                _unreachable(host, e)
                return None, host_lost(host)
            for r in records:
                self._records[r["rid"]] = r
            quiet = 0.0 if records else quiet + _now() - t
            if self._closing and quiet > _WAIT_INPUTS:
                return None, CancelledError(f"island {host.island} reported nothing for "
                                            f"{_WAIT_INPUTS:.0f} s while the controller closed")
        record = self._records.pop(rid)
        if not record["ok"]:
            return record, remote_error(record, host.island)
        return record, None

    def _let_go(self) -> CancelledError | None:
        """While closing, once the controller let go of the island (a pool's tenant left it
        first, and the island dropped what it had not run): the error of what was not seen
        to end, as ``ctl.close()`` cancels what has not run. Else None."""
        if self._closing and self.host.actor is None:
            return CancelledError(f"stopped by ctl.close(): island {self.host.island} dropped "
                                  "this controller's work when it left")
        return None

    def _ended(self, task: Task, record, handles, error, src_host: IslandHost | None) -> None:
        """Report that ``task``'s item completed (the runtime reports its end after its
        inputs' ends, so an upstream error wins: ``runtime/ends.py``)."""
        to_local = self.host.to_local
        t_end = _now() if record is None else to_local(record["t_end"])
        t_start = t_end if record is None else to_local(record["t_start"])
        if record is not None and src_host is not None and "t_src" in record:
            t_start = min(t_start, src_host.to_local(record["t_src"]))
        task.completed(t_end, error, handles or None, t_start=t_start)

    def status(self) -> dict:
        host = self.host
        return {"actor": None if host.actor is None else host.info.get("actor"),
                "lost": host.lost, "generation": host.generation}

    def stop_sending(self) -> None:
        """Send what is pending (its computations fail as cancelled) and stop the launcher."""
        if not self._closing:
            self._closing = True
            self._launches.put(None)
        self._launcher.join()

    def close(self) -> None:
        """Stop sending, then see every item sent end (or fail, once the island is let go)."""
        self.stop_sending()
        self._completions.put(None)
        self._watcher.join()

"""Dispatch onto Ray island actors: the same tasks, scheduler and futures as the local backend.

What changes from ``runtime.dispatch``:

- A launch becomes an item of the island's next *message* (``actor.submit``); each island has a
  launcher thread that sends the messages in the order its ``GangScheduler`` decided. While a
  program is submitted every island holds its message back, so with parallel dispatch an island
  receives all of a program's nodes (computations and the transfers into and out of it) in one
  message, ahead of the data, and waits on its inputs itself; with sequential dispatch (the
  baseline) a node is sent once its inputs exist, so each node is its own message.
- A watcher thread per island collects the actor's completion records (``poll``) and sees the
  items end in launch order: it reports ``Finished``, resolves futures and records the trace
  (actor times mapped onto the controller's clock).
- Values are ``RemoteBuffer`` handles (island, generation, buffer id); ``RayFuture.result()``
  fetches the value from the island only when asked.
- Transfers: host values are uploaded (``put``), transfers inside an island reshard there, and
  between islands the source actor pushes the value to the destination actor (``send`` ->
  ``deliver``), which waits for it (``recv``): bytes go island to island, never through the
  controller.
- An actor that dies fails what depended on it with ``IslandLostError``, and the other islands
  are told to stop waiting for values from it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time

import jax
import numpy as np
import ray

from ...runtime.dispatch import Dispatcher, IslandExecutor, Task, TaskState, _soon
from ...runtime.errors import (
    CancelledError,
    ControllerClosedError,
    IslandLostError,
)
from ...runtime.graph import ComputeNode
from ...runtime.objects import Future
from .cluster import IslandHost

_now = time.perf_counter
_WAIT_INPUTS = 60.0  # seconds a finished node waits for its producers' own reports
_POLL = 1.0  # seconds one poll for completion records waits on the actor
_FREE_DELAY = 0.02  # seconds buffer frees wait to be sent together (or with work)


class RemoteBuffer:
    """A buffer in an island actor's device memory. ``delete`` (called by the object store when
    the last future goes) frees it there, later, from the island's launcher thread."""

    __slots__ = ("host", "generation", "bid", "_local", "__weakref__")

    def __init__(self, host: IslandHost, bid: int):
        self.host, self.generation, self.bid = host, host.generation, bid
        self._local = None

    @property
    def alive(self) -> bool:
        return self.generation == self.host.generation and not self.host.lost

    def lost_error(self) -> IslandLostError:
        return IslandLostError(
            f"island {self.host.island} was lost (its Ray actor died) and buffer {self.bid} "
            f"with it; ctl.reattach({self.host.island}) starts a new actor, then rerun the "
            "program that made this value.")

    def fetch(self, sharding):
        """The value as a local ``jax.Array`` laid out like the future (once, then cached)."""
        if self._local is None:
            if not self.alive:
                raise self.lost_error()
            try:
                value = ray.get(self.host.actor.fetch.remote(self.bid))
            except ray.exceptions.RayActorError:
                self.host.mark_lost()
                raise self.lost_error() from None
            self._local = jax.device_put(value, sharding) if sharding is not None else value
        return self._local

    def delete(self) -> None:
        self.host.free(self.generation, self.bid)

    def __repr__(self) -> str:
        return f"RemoteBuffer(island={self.host.island}, id={self.bid})"


class RayFuture(Future):
    """A future whose value lives on an island actor until ``result()`` asks for it."""

    __slots__ = ()

    def result(self, timeout: float | None = None):
        """The value as a local ``jax.Array`` (fetched from the island on first call)."""
        if not self.wait(timeout):
            raise TimeoutError(
                f"future {self.name or ''} of shape {self.shape} not ready after {timeout} s; "
                "it is still queued or running (see ctl.status()).")
        if self._error is not None:
            raise self._error
        if self._store is not None and self._store.closed:
            raise ControllerClosedError(
                "this future belongs to a closed controller and its buffer was freed; "
                "keep the value (fut.result()) before ctl.close(), or rerun the program.")
        value = self._buffer.value
        if isinstance(value, RemoteBuffer):
            return value.fetch(self.sharding)
        self._buffer.exported = True
        return value


def layout(sharding, island) -> tuple:
    """How ``sharding`` (over the controller's stand-in devices) maps onto the actor's."""
    mesh = sharding.mesh
    index = {d.id: i for i, d in enumerate(island.devices)}
    positions = tuple(index[d.id] for d in mesh.devices.flat)
    return positions, tuple(mesh.devices.shape), tuple(mesh.axis_names), sharding.spec


class RayIslandExecutor(IslandExecutor):
    """One island's gang scheduler, launcher thread (messages to the actor, in decision order)
    and watcher thread (completion records, in launch order).

    What the scheduler launches, and the transfers into (or out of) the island, become items
    of the island's next message. While a program is being submitted the island holds its
    message back (``hold``), so a program's nodes on this island travel together."""

    program_ahead = True  # a program's nodes queue behind each other: one message for them

    def __init__(self, island, host: IslandHost, dispatcher: RayDispatcher, policy,
                 memory_budget):
        super().__init__(island, dispatcher, policy, memory_budget)
        self.host = host
        self._pending: list = []  # items of the next message, in order
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
            if not self._held:
                self._launches.put(self._pending)
                self._pending = []

    def hold(self) -> None:
        with self._pending_lock:
            self._held += 1

    def release(self) -> None:
        with self._pending_lock:
            self._held -= 1
            if not self._held and self._pending:
                self._launches.put(self._pending)
                self._pending = []

    def poke(self) -> None:
        """Wake the launcher to send pending buffer frees."""
        self._launches.put([])

    # --- scheduling: a launch becomes an item, in the order decisions were made ------------
    def _accept(self, task: Task) -> bool:
        # Under the island's lock: items keep the gang order. The outputs get their ids now,
        # so consumers can name them before the message leaves.
        task.handles = [RemoteBuffer(self.host, self.host.new_id()) for _ in task.outputs]
        self.enqueue("compute", task, task.handles)
        return True

    def _launch(self, task: Task) -> None:
        task.t_launch = _now()
        for fut, handle in zip(task.outputs, task.handles, strict=True):
            fut._set_launched(handle)

    def _spawn(self, task: Task) -> None:
        _soon(self._launch, task)  # nothing runs here: the island runs it

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
                    ops.append(self._compute_op(task, rid) if op == "compute"
                               else (op[0], rid, *op[1:]))
                except BaseException as e:  # noqa: BLE001 - a failed launch fails its futures
                    error = e
            entries.append((task, rid, handles, error, extra))
        sent = self._send(ops)
        for entry in entries:
            self._completions.put((*entry, sent))

    def _send(self, ops: list, always: bool = False):
        """One message to the island's current actor, with the buffer frees pending now;
        returns ``(actor, seq)``, or None when nothing was sent (the island was lost)."""
        host = self.host
        with self._send_lock:  # frees taken here: a later message never overtakes them
            frees = host.take_frees()
            if frees:
                ops = [*ops, ("free", frees)]
            actor = host.actor
            if actor is None or host.lost or not (ops or always):
                return None
            if host.generation != self._seq_generation:  # a new actor counts from 0
                self._seq, self._seq_generation = 0, host.generation
            actor.submit.remote(self._seq, ops)
            self._seq += 1
            return actor, self._seq - 1

    def sync(self) -> tuple | None:
        """Send pending frees now; returns ``(actor, seq)`` of that message, or None."""
        return self._send([], always=True)

    def _compute_op(self, task: Task, rid: int) -> tuple:
        host = self.host
        if self._closing:
            raise CancelledError(f"{task.node.name}: the controller closed before it ran")
        for fut in task.inputs:
            if fut._error is not None:
                raise fut._error
        if host.lost or host.actor is None:
            raise host_lost(host)
        exe = task.exe
        refs = []
        for fut in task.inputs:
            value = fut._peek()
            if isinstance(value, RemoteBuffer):
                if value.host is not host:
                    raise RuntimeError(f"{task.node.name}: an input is on island "
                                       f"{value.host.island}, not {host.island} (a missing "
                                       "transfer; please report this)")
                if not value.alive:
                    raise value.lost_error()
                refs.append(value.bid)
            else:
                refs.append(np.asarray(value))
        key, blob = self.dispatcher.exported(task.node, exe, host)
        host.sent.add(key)
        return ("run", rid, key, blob, [layout(s, self.island) for s in exe.in_shardings],
                [layout(s, self.island) for s in exe.out_shardings], refs,
                [h.bid for h in task.handles])

    # --- seeing work end -----------------------------------------------------------------
    def _watch_loop(self) -> None:
        while (entry := self._completions.get()) is not None:
            task, rid, handles, error, extra, sent = entry
            try:
                record = None
                if error is None:
                    record, error = self._record(rid, sent)
                if task is None:
                    pass  # the first half of a transfer: watched only to notice a lost island
                elif task.is_compute:
                    self._finish(task, record, handles, error)
                else:
                    self.dispatcher._finish_transfer(self, task, record, handles, error, extra)
            except BaseException:  # noqa: BLE001 - keep watching; the task already failed
                logging.getLogger("pwkernel").exception("ray watcher failed on a record")
            # Drop this entry's references now, not when the next one arrives: an idle
            # watcher must not keep a finished node's buffers alive.
            entry = task = handles = error = extra = record = None

    def _record(self, rid: int, sent) -> tuple[dict | None, BaseException | None]:
        """``(record, error)`` of item ``rid``: poll the actor until its record arrives."""
        host = self.host
        quiet = 0.0
        while rid not in self._records:
            if sent is None or sent[0] is not host.actor or host.lost:
                return None, host_lost(host)
            t = _now()
            try:
                records = ray.get(sent[0].poll.remote(_POLL))
            except ray.exceptions.RayActorError:
                host.mark_lost()
                return None, host_lost(host)
            except ray.exceptions.RayError as e:
                return None, RuntimeError(f"island {host.island}: {e}")
            for r in records:
                self._records[r["rid"]] = r
            quiet = 0.0 if records else quiet + _now() - t
            if self._closing and quiet > _WAIT_INPUTS:
                return None, CancelledError(f"island {host.island} reported nothing for "
                                            f"{_WAIT_INPUTS:.0f} s while the controller closed")
        record = self._records.pop(rid)
        if not record["ok"]:
            return record, RuntimeError(f"on island {host.island}: {record['error']}")
        return record, None

    def _finish(self, task: Task, record, handles, error) -> None:
        for fut in task.inputs:  # producers report first: an upstream error wins
            fut.wait(_WAIT_INPUTS)
        fut = None  # hold no input past the task's end: it may be freed then
        t_end = _now() if record is None else self.host.to_local(record["t_end"])
        t_start = t_end if record is None else self.host.to_local(record["t_start"])
        self._ended(task, handles, t_start, t_end, error)

    def status(self) -> dict:
        out = super().status()
        out |= {"actor": None if self.host.actor is None else self.host.actor._actor_id.hex(),
                "lost": self.host.lost, "generation": self.host.generation}
        return out

    def shutdown(self) -> None:
        self._closing = True
        self._launches.put(None)
        self._launcher.join()
        self._completions.put(None)
        self._watcher.join()
        super().shutdown()


def host_lost(host: IslandHost) -> IslandLostError:
    return IslandLostError(f"island {host.island} was lost (its Ray actor died) while this "
                           f"computation needed it; ctl.reattach({host.island}) starts a new "
                           "one.")


class RayDispatcher(Dispatcher):
    """``Dispatcher`` whose islands are Ray actors (see the module docstring)."""

    future_class = RayFuture

    def __init__(self, store, trace, transfers, mode, hosts: dict[int, IslandHost]):
        super().__init__(store, trace, transfers, mode)
        self.hosts = hosts
        for host in hosts.values():
            host.on_lost = self._island_lost
        self._exports: dict[int, tuple] = {}  # id(executable) -> (executable, key, bytes)
        self._export_lock = threading.Lock()

    def exported(self, node: ComputeNode, exe, host: IslandHost) -> tuple[str, bytes | None]:
        """The serialized ``jax.export`` of a node's executable, and its cache key; the bytes
        are sent only to an island that has not compiled it yet."""
        with self._export_lock:
            entry = self._exports.get(id(exe))
            if entry is None:
                in_tree, in_avals = node.signature
                fn = node.fn.fn

                def flat(*leaves):
                    return tuple(jax.tree_util.tree_leaves(
                        fn(*jax.tree_util.tree_unflatten(in_tree, leaves))))

                jitted = jax.jit(flat, in_shardings=exe.in_shardings,
                                 out_shardings=exe.out_shardings)
                structs = [jax.ShapeDtypeStruct(s, d, sharding=sh)
                           for (s, d), sh in zip(in_avals, exe.in_shardings, strict=True)]
                platform = "cuda" if host.platform == "gpu" else "cpu"
                # Traced again here: under the slice's mesh, as when it was compiled (a
                # %%pathways cell's P(...) and out_sharding= refer to it).
                with jax.set_mesh(node.fn.slice.mesh):
                    blob = bytes(jax.export.export(jitted, platforms=[platform])(*structs)
                                 .serialize())
                entry = self._exports[id(exe)] = (exe, f"{node.name}-{id(exe):x}", blob)
        _, key, blob = entry
        return key, (None if key in host.sent else blob)

    def submit(self, graph, leaves, client, mode=None):
        """Parallel dispatch: every island holds its message until the whole program has been
        prepared, so each island gets the program's nodes in one message."""
        islands = list(self.islands.values())
        for isl in islands:
            isl.hold()
        try:
            return super().submit(graph, leaves, client, mode)
        finally:
            for isl in islands:
                isl.release()

    def _island_lost(self, host: IslandHost) -> None:
        """Tell the other islands: a ``recv`` from the lost one fails instead of waiting."""
        for other in self.hosts.values():
            if other is not host and other.actor is not None and not other.lost:
                other.actor.source_lost.remote(host.island, host.generation)

    # --- transfers ----------------------------------------------------------------------
    def _transfer(self, task: Task, admitted: bool = False) -> None:
        with task._lock:
            if task.state is not (TaskState.RUNNING if admitted else TaskState.WAITING):
                return
            task.state = TaskState.RUNNING
        self.began()
        task.t_submit = task.t_launch = _now()
        node, src = task.node, task.inputs[0]
        executor: RayIslandExecutor = self.islands[node.dst]
        dst = self.hosts[node.dst]
        try:
            if src._error is not None:
                raise src._error
            if dst.lost or dst.actor is None:
                raise host_lost(dst)
            value = src._peek()
            lay = layout(task.outputs[0].sharding, executor.island)
            handle = RemoteBuffer(dst, dst.new_id())
            if isinstance(value, RemoteBuffer):
                if not value.alive:
                    raise value.lost_error()
                if value.host is dst:  # inside the island: reshard there
                    executor.enqueue(("reshard", value.bid, handle.bid, lay), task, [handle])
                else:  # island to island: the source pushes the value to the destination
                    self.islands[value.host.island].enqueue(
                        ("send", value.bid, dst.island, handle.bid), None, [])
                    executor.enqueue(("recv", handle.bid, lay, value.host.island,
                                      value.host.generation), task, [handle], value.host)
            else:  # a host value (program argument, constant, a fetched result)
                executor.enqueue(("put", handle.bid, np.asarray(value), lay), task, [handle])
        except BaseException as e:  # noqa: BLE001 - failed in order, by the island's watcher
            executor.enqueue(None, task, [], error=e)
            return
        task.outputs[0]._set_launched(handle)

    def _finish_transfer(self, executor: RayIslandExecutor, task: Task, record, handles,
                         error, src_host: IslandHost | None) -> None:
        task.inputs[0].wait(_WAIT_INPUTS)
        t_end = _now() if record is None else executor.host.to_local(record["t_end"])
        t_start = t_end if record is None else executor.host.to_local(record["t_start"])
        if record is not None and src_host is not None and "t_src" in record:
            t_start = min(t_start, src_host.to_local(record["t_src"]))
        self._landed(task, handles, t_start, t_end, error)

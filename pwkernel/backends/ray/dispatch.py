"""Dispatch onto Ray island actors: the same tasks, scheduler and futures as the local backend.

What changes from ``runtime.dispatch``:

- A launch is one actor method call. Each island has a launcher thread that makes the calls in
  the order its ``GangScheduler`` decided (Ray runs an actor's calls in submission order), and a
  watcher thread that ``ray.get``s the completion records in launch order and reports
  ``Finished``, resolves futures and records the trace (actor times mapped onto the controller's
  clock).
- Values are ``RemoteBuffer`` handles (island, generation, buffer id); ``RayFuture.result()``
  fetches the value from the island only when asked.
- Transfers: host values are uploaded (``put``), transfers inside an island reshard there, and
  transfers between islands pass the ObjectRef of the source's ``send`` straight into the
  destination's ``receive``: bytes go island to island, never through the controller.
- An actor that dies fails what depended on it with ``IslandLostError``.
"""

from __future__ import annotations

import queue
import threading
import time

import jax
import numpy as np
import ray

from ...runtime.dispatch import Dispatcher, IslandExecutor, Task, TaskState
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
                self.host.lost = True
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


def _island_of_error(error: BaseException, hosts) -> IslandHost | None:
    """Which island's actor a Ray error is about (by actor id), if any."""
    aid = getattr(error, "actor_id", None)
    for host in hosts:
        actor = host.actor
        if aid is not None and actor is not None and actor._actor_id.hex() == aid:
            return host
    return None


class RayIslandExecutor(IslandExecutor):
    """One island's gang scheduler, launcher thread (actor calls in decision order) and
    watcher thread (completion records, in launch order)."""

    def __init__(self, island, host: IslandHost, dispatcher: RayDispatcher, policy,
                 memory_budget):
        super().__init__(island, dispatcher, policy, memory_budget)
        self.host = host
        self._launches: queue.SimpleQueue = queue.SimpleQueue()
        self._completions: queue.SimpleQueue = queue.SimpleQueue()
        name = f"pw-ray-island{island.id}"
        self._launcher = threading.Thread(target=self._launch_loop, name=f"{name}-launch",
                                          daemon=True)
        self._watcher = threading.Thread(target=self._watch_loop, name=f"{name}-watch",
                                         daemon=True)
        host.wake = self.poke
        self._launcher.start()
        self._watcher.start()

    # --- scheduling: decisions go to the launcher queue in the order they were made -------
    def _accept(self, task: Task) -> bool:
        self._launches.put(task)  # under the island's lock: the actor sees the gang order
        return False

    def poke(self) -> None:
        """Wake the launcher to send pending buffer frees."""
        self._launches.put(False)

    # --- launching ---------------------------------------------------------------------------
    def _launch_loop(self) -> None:
        while (task := self._launches.get()) is not None:
            self.host.flush()
            if task is False:
                continue
            try:
                self._launch(task)
            except BaseException as e:  # noqa: BLE001 - a failed launch fails its futures
                self._completions.put((task, None, [], e))

    def _launch(self, task: Task) -> None:
        host = self.host
        task.t_launch = _now()
        if self._closing:
            raise CancelledError(f"{task.node.name}: the controller closed before it ran")
        for fut in task.inputs:
            if fut._error is not None:
                raise fut._error
        if host.lost or host.actor is None:
            raise IslandLostError(f"island {host.island} was lost (its Ray actor died); "
                                  f"ctl.reattach({host.island}) starts a new one.")
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
        handles = [RemoteBuffer(host, host.new_id()) for _ in task.outputs]
        ref = host.actor.run.remote(
            key, blob, [layout(s, self.island) for s in exe.in_shardings],
            [layout(s, self.island) for s in exe.out_shardings], refs, [h.bid for h in handles])
        host.sent.add(key)
        self._completions.put((task, ref, handles, None))
        for fut, handle in zip(task.outputs, handles, strict=True):
            fut._set_launched(handle)

    # --- seeing work end -----------------------------------------------------------------
    def _watch_loop(self) -> None:
        while (item := self._completions.get()) is not None:
            task, ref, handles, error = item
            try:
                if task.is_compute:
                    self._finish(task, ref, handles, error)
                else:
                    self.dispatcher._finish_transfer(self, task, ref, handles, error)
            except BaseException:  # noqa: BLE001 - keep watching; the task already failed
                import logging

                logging.getLogger("pwkernel").exception("ray watcher failed on a record")
            # Drop this record's references now, not when the next one arrives: an idle
            # watcher must not keep a finished node's buffers alive.
            item = task = ref = handles = error = None

    def result_of(self, ref, handles, error):
        """``(record, error)`` of a launch: ``ray.get`` the record, name a lost island."""
        if error is not None or ref is None:
            return None, error
        try:
            record = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            host = _island_of_error(e, self.dispatcher.hosts.values()) or self.host
            host.lost = True
            return None, IslandLostError(
                f"island {host.island} was lost (its Ray actor died) while this computation "
                f"needed it; ctl.reattach({host.island}) starts a new one.")
        except ray.exceptions.RayError as e:
            return None, RuntimeError(f"island {self.host.island}: {e}")
        if not record["ok"]:
            return record, RuntimeError(f"on island {self.host.island}: {record['error']}")
        return record, None

    def _finish(self, task: Task, ref, handles, error) -> None:
        record, error = self.result_of(ref, handles, error)
        for fut in task.inputs:  # producers report first: an upstream error wins
            fut.wait(_WAIT_INPUTS)
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


class RayDispatcher(Dispatcher):
    """``Dispatcher`` whose islands are Ray actors (see the module docstring)."""

    future_class = RayFuture

    def __init__(self, store, trace, transfers, mode, hosts: dict[int, IslandHost]):
        super().__init__(store, trace, transfers, mode)
        self.hosts = hosts
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
                blob = bytes(jax.export.export(jitted, platforms=[platform])(*structs)
                             .serialize())
                entry = self._exports[id(exe)] = (exe, f"{node.name}-{id(exe):x}", blob)
        _, key, blob = entry
        return key, (None if key in host.sent else blob)

    # --- transfers ----------------------------------------------------------------------
    def _transfer(self, task: Task) -> None:
        with task._lock:
            if task.state is not TaskState.WAITING:
                return
            task.state = TaskState.RUNNING
        task.t_submit = task.t_launch = _now()
        node, src = task.node, task.inputs[0]
        executor: RayIslandExecutor = self.islands[node.dst]
        dst = self.hosts[node.dst]
        handles, ref, error, src_host = [], None, None, None
        try:
            if src._error is not None:
                raise src._error
            if dst.lost or dst.actor is None:
                raise IslandLostError(f"island {dst.island} was lost (its Ray actor died); "
                                      f"ctl.reattach({dst.island}) starts a new one.")
            value = src._peek()
            lay = layout(task.outputs[0].sharding, executor.island)
            handle = RemoteBuffer(dst, dst.new_id())
            if isinstance(value, RemoteBuffer):
                if not value.alive:
                    raise value.lost_error()
                src_host = value.host
                if src_host is dst:  # inside the island: reshard there
                    ref = dst.actor.reshard.remote(value.bid, handle.bid, lay)
                else:  # island to island: the ObjectRef goes straight to the destination
                    sent = src_host.actor.send.remote(value.bid)
                    ref = dst.actor.receive.remote(sent, handle.bid, lay)
            else:  # a host value (program argument, constant, a fetched result)
                ref = dst.actor.put.remote(handle.bid, np.asarray(value), lay)
            handles = [handle]
        except BaseException as e:  # noqa: BLE001
            error = e
        executor._completions.put((task, (ref, src_host), handles, error))
        if error is None:
            task.outputs[0]._set_launched(handles[0])

    def _finish_transfer(self, executor: RayIslandExecutor, task: Task, refs, handles,
                         error) -> None:
        ref, src_host = refs if refs is not None else (None, None)
        record, error = executor.result_of(ref, handles, error)
        src = task.inputs[0]
        src.wait(_WAIT_INPUTS)
        t_end = _now() if record is None else executor.host.to_local(record["t_end"])
        t_start = t_end if record is None else executor.host.to_local(record["t_start"])
        if record is not None and src_host is not None and "t_src" in record:
            t_start = min(t_start, src_host.to_local(record["t_src"]))
        self._landed(task, handles, t_start, t_end, error)


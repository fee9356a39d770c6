"""The island process: one Ray actor per island, owning that island's JAX devices and buffers.

The actor knows nothing of programs, futures or scheduling. The controller sends it messages
(``submit``), each a list of operations in the order the island's gang scheduler chose: with
parallel dispatch, one message carries every node a program has on this island. An executor
thread takes the messages in sequence order and issues their operations one after another; a
node whose input comes from another island waits here for it (``recv``), so the island, not the
controller, waits on the data. Computations are enqueued on the devices without waiting for them
(JAX's asynchronous dispatch); a completion thread sees them end, in issue order, pushes values
to the islands that asked for them (``send``: straight to the destination actor's ``deliver``,
never through the controller) and keeps a completion record for each operation, which the
controller collects with ``poll``.

Buffers stay in the island's device memory under integer ids the controller assigns (so it can
name an output before it exists); values leave the island only when asked (``fetch``, ``send``).
Completion records carry times on this process's clock (``time.perf_counter``); the controller
maps them onto its own with the offset it measured at start (``clock``).

A layout (how a buffer is laid out on the island) is ``(positions, mesh_shape, axis_names,
spec)``: ``positions`` are indices into this island's devices, in mesh order.

Operations (``rid``: the record id the controller waits for):

- ``("run", rid, key, blob, in_layouts, out_layouts, inputs, outputs)``: a computation; inputs
  are buffer ids or host arrays, outputs the ids its results get; ``blob`` is the serialized
  ``jax.export`` artifact the first time ``key`` is sent, else None.
- ``("put", rid, bid, value, layout)``: a host value arrives (a program argument or constant).
- ``("reshard", rid, src, bid, layout)``: a transfer inside the island (the paper's ICI).
- ``("send", rid, src, island, bid)``: the first half of a transfer to another island (its
  actor handle comes once, from ``peers``, not in every message).
- ``("recv", rid, bid, layout, island, generation)``: the second half; waits for the value.
- ``("free", bids)``: drop buffers (no record).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

_now = time.perf_counter
MAX_CONCURRENCY = 16  # actor threads: submit, poll, deliver and fetch calls run side by side
_LINGER = 0.002  # s a poll may wait after a record for the rest of its burst


class IslandActor:
    """One island: ``devices`` JAX devices of this process (virtual CPU devices or GPUs).

    Created by the controller as ``ray.remote(IslandActor).options(max_concurrency=16)``.
    """

    def __init__(self, island: int, devices: int, platform: str):
        self.island = island
        if platform == "cpu":
            os.environ["JAX_PLATFORMS"] = "cpu"
        import jax  # imported here: the device count must be set before JAX initializes

        if platform == "cpu":
            jax.config.update("jax_num_cpu_devices", devices)
        self._jax = jax
        pool = jax.devices()
        if len(pool) < devices:
            raise RuntimeError(f"island {island} needs {devices} {platform} devices but its "
                               f"process sees {len(pool)} ({pool[0].platform}).")
        self.devices = pool[:devices]
        self._buffers: dict[int, Any] = {}
        self._executables: dict[str, Any] = {}
        self._meshes: dict[tuple, Any] = {}
        self._cv = threading.Condition()
        self._messages: dict[int, list] = {}  # sequence number -> operations, not yet issued
        self._next = 0         # sequence number of the next message to issue
        self._incoming: dict[int, tuple] = {}  # bid -> (value, error, t_src), delivered early
        self._lost: set[tuple[int, int]] = set()  # (island, generation) that will send nothing
        self._records: list[dict] = []
        self._peers: dict[int, Any] = {}  # island -> its actor handle
        self._stats = {"messages": 0, "ops": 0}
        self._issued: queue.SimpleQueue = queue.SimpleQueue()
        self._running = 0  # issued items whose record is not made yet
        self._last_end: dict[int, float] = {}  # device position -> when its last work ended
        threading.Thread(target=self._execute, name="island-executor", daemon=True).start()
        threading.Thread(target=self._complete, name="island-completer", daemon=True).start()

    # --- set-up and introspection ----------------------------------------------------------
    def info(self) -> dict:
        import socket

        import ray

        return {"island": self.island, "platform": self.devices[0].platform,
                "devices": [str(d) for d in self.devices], "pid": os.getpid(),
                "host": socket.gethostname(),
                "actor": ray.get_runtime_context().get_actor_id()}

    def peers(self, handles: dict) -> None:
        """The other islands' actors (at start, and when one is replaced)."""
        self._peers.update(handles)

    def clock(self) -> float:
        """This process's clock, for the controller's offset measurement."""
        return _now()

    def buffers(self, after: int = -1) -> dict[int, int]:
        """Live buffer ids and their bytes (on all devices together), once message ``after``
        has been issued (so the frees it carries are done)."""
        with self._cv:
            self._cv.wait_for(lambda: self._next > after)
            return {bid: int(a.nbytes) for bid, a in self._buffers.items()}

    def executables(self) -> list[str]:
        return sorted(self._executables)

    def stats(self) -> dict[str, int]:
        """Messages with work received so far, and the operations in them (frees not counted)."""
        with self._cv:
            return dict(self._stats)

    # --- messages in, records out ------------------------------------------------------------
    def submit(self, seq: int, ops: list) -> None:
        """Queue message ``seq`` (messages are issued in sequence order, whatever order Ray
        runs these calls in)."""
        work = sum(op[0] != "free" for op in ops)
        with self._cv:
            self._messages[seq] = ops
            if work:
                self._stats["messages"] += 1
                self._stats["ops"] += work
            self._cv.notify_all()

    def poll(self, timeout: float) -> list[dict]:
        """The completion records made since the last poll (waits up to ``timeout`` for one)."""
        with self._cv:
            if self._cv.wait_for(lambda: self._records, timeout):
                # While issued work is still running, its records follow within moments:
                # wait a little for them, so one poll takes the burst (fewer round trips on
                # the controller's and this process's cores); an idle island answers at once.
                deadline = _now() + _LINGER
                while self._running and (left := deadline - _now()) > 0:
                    if not self._cv.wait_for(self._more_records(len(self._records)), left):
                        break
            out, self._records = self._records, []
            return out

    def _more_records(self, n: int):
        return lambda: len(self._records) > n

    def deliver(self, bid: int, value, error: str | None, t_src: float) -> None:
        """Another island's ``send`` arrives (called by that island's actor)."""
        with self._cv:
            self._incoming[bid] = (value, error, t_src)
            self._cv.notify_all()

    def source_lost(self, island: int, generation: int) -> None:
        """The controller saw ``island``'s actor die: a ``recv`` from it fails, not waits."""
        with self._cv:
            self._lost.add((island, generation))
            self._cv.notify_all()

    def fetch(self, bid: int):
        """A buffer's value as a host array (the controller asked for ``fut.result()``)."""
        import numpy as np

        return np.asarray(self._arg(bid, None))

    # --- layouts ---------------------------------------------------------------------------
    def _sharding(self, layout):
        import numpy as np
        from jax.sharding import Mesh, NamedSharding

        positions, shape, names, spec = layout
        key = (positions, shape, names)
        mesh = self._meshes.get(key)
        if mesh is None:
            grid = np.array([self.devices[p] for p in positions], dtype=object).reshape(shape)
            mesh = self._meshes[key] = Mesh(grid, names)
        return NamedSharding(mesh, spec)

    def _arg(self, ref, layout):
        """An input: a buffer id of this island, or a host array to place."""
        if isinstance(ref, int):
            if ref not in self._buffers:
                raise KeyError(f"buffer {ref} is not on island {self.island} (its producer "
                               "failed, or it was freed)")
            return self._buffers[ref]
        return self._jax.device_put(ref, self._sharding(layout))

    def _compiled(self, key: str, blob: bytes | None, in_layouts, out_layouts):
        exe = self._executables.get(key)
        if exe is not None:
            return exe
        if blob is None:
            raise KeyError(f"executable {key} was never sent to island {self.island}")
        jax = self._jax
        exported = jax.export.deserialize(bytearray(blob))
        in_sh = tuple(self._sharding(lay) for lay in in_layouts)
        out_sh = tuple(self._sharding(lay) for lay in out_layouts)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                   for a, sh in zip(exported.in_avals, in_sh, strict=True)]
        jitted = jax.jit(exported.call, in_shardings=in_sh, out_shardings=out_sh)
        exe = self._executables[key] = jitted.lower(*structs).compile()
        return exe

    # --- the executor: issues operations in message order --------------------------------
    def _execute(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._next in self._messages)
                ops = self._messages.pop(self._next)
            for op in ops:
                t_launch = _now()
                try:
                    item = self._issue(op, t_launch)
                except Exception as e:  # noqa: BLE001 - the record carries it to the controller
                    item = ("error", op[1], f"{type(e).__name__}: {e}", t_launch, (), None)
                if item is not None:
                    with self._cv:
                        self._running += 1
                    self._issued.put(item)
            with self._cv:
                self._next += 1
                self._cv.notify_all()

    def _issue(self, op: tuple, t_launch: float) -> tuple | None:
        """Start one operation; returns what the completion thread waits for."""
        kind = op[0]
        if kind == "run":
            _, rid, key, blob, in_layouts, out_layouts, inputs, outputs = op
            exe = self._compiled(key, blob, in_layouts, out_layouts)
            args = [self._arg(r, lay) for r, lay in zip(inputs, in_layouts, strict=True)]
            outs = exe(*args)
            for bid, out in zip(outputs, outs, strict=True):
                self._buffers[bid] = out
            devices = {p for lay in (*in_layouts, *out_layouts) for p in lay[0]}
            return ("done", rid, outs, t_launch, devices, None)
        if kind == "put":
            _, rid, bid, value, layout = op
            out = self._buffers[bid] = self._arg(value, layout)
            return ("done", rid, out, t_launch, (), None)
        if kind == "reshard":
            _, rid, src, bid, layout = op
            # a copy, never an alias of the source (overlapping slices share devices)
            out = self._jax.device_put(self._arg(src, None), self._sharding(layout),
                                       may_alias=False)
            self._buffers[bid] = out
            return ("done", rid, out, t_launch, (), None)
        if kind == "send":
            _, rid, src, island, bid = op
            return ("send", rid, self._buffers.get(src), t_launch, (self._peers[island], bid),
                    None)
        if kind == "recv":
            _, rid, bid, layout, island, generation = op
            with self._cv:  # the island waits here for its input
                self._cv.wait_for(lambda: bid in self._incoming
                                  or (island, generation) in self._lost)
                arrived = self._incoming.pop(bid, None)
            if arrived is None:
                raise RuntimeError(f"island {island} was lost before it sent buffer {bid}")
            value, error, t_src = arrived
            if error is not None:
                raise RuntimeError(error)
            out = self._buffers[bid] = self._arg(value, layout)
            return ("done", rid, out, t_launch, (), t_src)
        if kind == "free":
            for bid in op[1]:
                self._buffers.pop(bid, None)  # freed when the last computation using it ends
            return None
        raise ValueError(f"island {self.island}: unknown operation {kind!r}")

    # --- the completion thread: sees issued work end, in issue order --------------------------
    def _complete(self) -> None:
        while True:
            kind, rid, value, t_launch, extra, t_src = self._issued.get()
            record: dict = {"rid": rid, "ok": True}
            try:
                if kind == "error":
                    raise _Failed(value)
                if kind == "send":
                    self._send(value, *extra, t_launch)
                else:
                    self._jax.block_until_ready(value)
            except Exception as e:  # noqa: BLE001
                record |= {"ok": False, "error": str(e) if isinstance(e, _Failed)
                           else f"{type(e).__name__}: {e}"}
            t_end = _now()
            # A computation starts when it was issued, or when its devices finished the work
            # issued before it, whichever is later.
            devices = extra if kind == "done" else ()
            t_start = max([t_launch, *(self._last_end.get(p, 0.0) for p in devices)])
            for p in devices:
                self._last_end[p] = t_end
            record |= {"t_start": min(t_start, t_end), "t_end": t_end}
            if t_src is not None:
                record["t_src"] = t_src
            value = None  # drop the arrays: a freed buffer goes once its last user ended
            with self._cv:
                self._records.append(record)
                self._running -= 1
                self._cv.notify_all()

    def _send(self, array, actor, bid: int, t_launch: float) -> None:
        import numpy as np

        if array is None:
            actor.deliver.remote(bid, None, f"the value to send (island {self.island}) was "
                                 "never made: its producer failed", t_launch)
            raise RuntimeError("nothing to send: the producer failed")
        try:
            value = np.asarray(array)
        except Exception as e:  # noqa: BLE001 - the receiver fails with the same error
            actor.deliver.remote(bid, None, f"{type(e).__name__}: {e}", t_launch)
            raise
        actor.deliver.remote(bid, value, None, t_launch)


class _Failed(Exception):
    """An operation that failed when it was issued (its message is already formatted)."""

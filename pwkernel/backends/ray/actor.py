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
spec)``: ``positions`` are indices into this island's devices, in mesh order. What an
operation does is ``ops.py``'s, shared with the pool's island actor (``tenancy.py``).

Operations (``rid``: the record id the controller waits for):

- ``("run", rid, key, blob, in_layouts, out_layouts, inputs, outputs, name, client)``: a
  computation; inputs are buffer ids or host arrays, outputs the ids its results get; ``blob``
  is the serialized ``jax.export`` artifact the first time ``key`` is sent, else None; ``name``
  and ``client`` (the node's and its client's names) are for the pool's launch log.
- ``("put", rid, bid, value, layout)``: a host value arrives (a program argument or constant).
- ``("reshard", rid, src, bid, layout)``: a transfer inside the island (the paper's ICI).
- ``("send", rid, src, island, bid)``: the first half of a transfer to another island (its
  actor handle comes once, from ``peers``, not in every message); to a pool's island, the
  destination tenant's secret follows (``tenancy.py``).
- ``("recv", rid, bid, layout, island, generation)``: the second half; waits for the value.
- ``("free", bids)``: drop buffers (no record); a str among them names an executable
  (``key`` above) the controller let go.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from .hostvalues import to_host
from .ops import IslandDevices, now

_now = now
MAX_CONCURRENCY = 16  # actor threads: submit, poll, deliver and fetch calls run side by side
_LINGER = 0.002  # s a poll may wait after a record for the rest of its burst


def linger(cv: threading.Condition, records: list, running) -> None:
    """Under ``cv``, with a record taken: while issued work is still running (``running()``),
    its records follow within moments, so wait a little for them and let one poll take the
    burst (fewer round trips on the controller's and this process's cores); an idle island
    answers at once."""
    deadline = _now() + _LINGER
    while running() and (left := deadline - _now()) > 0:
        n = len(records)
        if not cv.wait_for(lambda n=n: len(records) > n, left):
            break


class IslandActor:
    """One island: ``devices`` JAX devices of this process (virtual CPU devices or GPUs).

    Created by the controller as ``ray.remote(IslandActor).options(max_concurrency=16)``.
    """

    def __init__(self, island: int, devices: int, platform: str):
        self.island = island
        self.ops = IslandDevices(island, devices, platform)
        self.devices = self.ops.devices
        self._buffers: dict[int, Any] = {}
        self._executables: dict[str, Any] = {}
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
        threading.Thread(target=self._execute, name="island-executor", daemon=True).start()
        threading.Thread(target=self._complete, name="island-completer", daemon=True).start()

    # --- set-up and introspection ----------------------------------------------------------
    def info(self) -> dict:
        return self.ops.info()

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
                linger(self._cv, self._records, lambda: self._running)
            out, self._records = self._records, []
            return out

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
        return to_host(self.ops.arg(self._buffers, bid, None))

    # --- the executor: issues operations in message order --------------------------------
    def _execute(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._next in self._messages)
                ops = self._messages.pop(self._next)
            for op in ops:
                t_launch = _now()
                try:
                    item = self.ops.issue(op, t_launch, self._buffers, self._executables,
                                          self._arrived, self._deliverer)
                except Exception as e:  # noqa: BLE001 - the record carries it to the controller
                    item = self.ops.failed(op, e, t_launch)
                if item is not None:
                    with self._cv:
                        self._running += 1
                    self._issued.put(item)
            ops = op = item = None  # an idle executor keeps no value of its last message
            with self._cv:
                self._next += 1
                self._cv.notify_all()

    def _arrived(self, bid: int, island: int, generation: int) -> tuple | None:
        with self._cv:  # the island waits here for its input
            self._cv.wait_for(lambda: bid in self._incoming
                              or (island, generation) in self._lost)
            return self._incoming.pop(bid, None)

    def _deliverer(self, op: tuple):
        return self._peers[op[3]].deliver.remote

    # --- the completion thread: sees issued work end, in issue order --------------------------
    def _complete(self) -> None:
        while True:
            item = self._issued.get()
            record = self.ops.complete(item)
            item = None  # drop the arrays: a freed buffer goes once its last user ended
            with self._cv:
                self._records.append(record)
                self._running -= 1
                self._cv.notify_all()

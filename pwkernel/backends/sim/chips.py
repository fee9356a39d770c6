"""The chips' work queues: who may start when.

Every chip runs the computations queued on it one at a time, in queue order. A computation
that needs all its chips together (a gang: always under the gang scheduler, and any
computation with a collective) starts only when it is at the head of every one of its chips'
queues; ``task.blockers`` counts what it still waits for.

- ``GangQueues`` (``gang=True``): computations are queued on all their chips at once, in the
  island scheduler's launch order. Then "at the head of every queue" means "the last
  computation queued before it on each of its chips has ended", so a computation waits only
  for those predecessors: one NumPy lookup per computation, whatever the number of chips.
- ``OwnQueues`` (``gang=False``): each host queues a computation on its own chips when it
  receives it, so chips may hold computations in different orders. Real per-chip queues;
  a computation without collectives runs one shard per chip, as each chip reaches it.

Both give ``queues(stuck)``: each chip's queue of computations that never ended, in order,
for the deadlock finder.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .tasks import SimTask


class GangQueues:
    def __init__(self, n_chips: int):
        self._last = np.full(n_chips, -1, dtype=np.int64)  # the last task queued per chip
        self._tasks: dict[int, SimTask] = {}  # queued and not yet ended
        self._order = 0

    def enqueue(self, task: SimTask) -> None:
        """Queue ``task`` on all its chips (launch order)."""
        idx = task.devset.idx
        task.blockers = 0
        for p in np.unique(self._last[idx]).tolist():
            pred = self._tasks.get(p)  # None: no task yet, or it ended
            if pred is not None:
                pred.next.append(task)
                task.blockers += 1
        self._last[idx] = task.id
        self._tasks[task.id] = task
        task.order = self._order
        self._order += 1

    def ended(self, task: SimTask, chips=()) -> list[SimTask]:
        """``task`` ended (on all its chips): the computations that no longer wait for it."""
        free = []
        for s in task.next:
            s.blockers -= 1
            if s.blockers == 0:
                free.append(s)
        task.next = []
        self._tasks.pop(task.id, None)
        return free

    def queues(self, stuck: list[SimTask], n_chips: int) -> list[deque]:
        out = [deque() for _ in range(n_chips)]
        for t in sorted((t for t in stuck if t.order is not None), key=lambda t: t.order):
            for d in t.node.devices:
                out[d].append(t)
        return out


class OwnQueues:
    def __init__(self, n_chips: int):
        self._queues = [deque() for _ in range(n_chips)]

    def enqueue(self, task: SimTask, chips: list[int]) -> None:
        """Queue ``task`` on ``chips`` (one host's share of its chips)."""
        if task.order is None:
            task.order = 0
            task.blockers = len(task.node.devices)
        for d in chips:
            queue = self._queues[d]
            queue.append(task)
            if len(queue) == 1:
                task.at_head.append(d)
                task.blockers -= 1

    def ended(self, task: SimTask, chips) -> list[SimTask]:
        """``task`` ended on ``chips``: the computations that moved to the head of a queue."""
        moved = []
        for d in chips:
            queue = self._queues[d]
            queue.popleft()
            if queue:
                nxt = queue[0]
                nxt.at_head.append(d)
                nxt.blockers -= 1
                moved.append(nxt)
        return moved

    def queues(self, stuck: list[SimTask], n_chips: int) -> list[deque]:
        return self._queues

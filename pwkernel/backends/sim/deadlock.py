"""Finding why a simulation froze: the circle of chips that wait on each other.

When the clock has nothing left to do but computations remain, every chip with work queued is
stuck on the computation at the head of its queue. That computation waits either for another
chip to reach it (a gang: its collective needs all its chips at once) or for an input that a
computation elsewhere has not produced. Following "chip d waits for chip e" from any stuck chip
must come back to a chip already seen: that circle is the deadlock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .tasks import SimTask


@dataclass(frozen=True, slots=True)
class Wait:
    """Chip ``device`` is stuck in ``computation`` (of ``program``, submitted by ``client``)
    and waits for chip ``waits_for``; ``reason``: ``"join"`` (the other chip has not reached
    this computation) or ``"input"`` (an input of it, ``input``, is not there)."""

    device: int
    computation: str
    program: str
    client: str
    waits_for: int
    reason: str
    input: str | None = None

    def describe(self) -> str:
        what = (f"waits for chip {self.waits_for} to join it" if self.reason == "join" else
                f"waits for its input {self.input!r}, held up on chip {self.waits_for}")
        return (f"chip {self.device} is in {self.computation!r} (program {self.program!r}, "
                f"client {self.client!r}) and {what}")


@dataclass(frozen=True, slots=True)
class Deadlock:
    """The circle of waits, and the virtual time at which the simulation froze."""

    time: float
    cycle: tuple[Wait, ...]
    stuck: int  # computations that never ran

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(w.device for w in self.cycle)

    @property
    def computations(self) -> tuple[tuple[str, str], ...]:
        """(program, computation) for each chip of the circle."""
        return tuple((w.program, w.computation) for w in self.cycle)

    def message(self) -> str:
        if not self.cycle:
            return (f"the simulation stalled at t={self.time:.9g} s with {self.stuck} "
                    "computations left and no circle of waits; this is a simulator bug.")
        lines = "; ".join(w.describe() for w in self.cycle)
        return (f"deadlock at t={self.time:.9g} s: {lines}. {self.stuck} computations can never "
                "run. Without a gang scheduler each chip ran work in the order its host "
                "received it, and these chips received these computations in different "
                "orders. Maybe you want gang=True: one scheduler per island puts every "
                "computation of the island in one order on all its chips.")


def find_deadlock(stuck: Sequence[SimTask], queues: Sequence[deque], time: float) -> Deadlock:
    """The circle of waits among the chips' queue heads (``stuck``: tasks that never ended)."""
    edges: dict[int, Wait] = {}
    for task in stuck:
        for d in task.node.devices:
            if queues[d] and queues[d][0] is task and d not in edges:
                wait = _wait(d, task, queues)
                if wait is not None:
                    edges[d] = wait
    for first in sorted(edges):
        seen: dict[int, int] = {}
        path: list[Wait] = []
        d = first
        while d in edges and d not in seen:
            seen[d] = len(path)
            path.append(edges[d])
            d = edges[d].waits_for
        if d in seen:
            return Deadlock(time, tuple(path[seen[d]:]), len(stuck))
    return Deadlock(time, (), len(stuck))


def _wait(d: int, task: SimTask, queues: Sequence[deque]) -> Wait | None:
    node, run = task.node, task.run
    if task.rendezvous:
        for e in node.devices:
            if not queues[e] or queues[e][0] is not task:
                return Wait(d, node.name, run.name, run.client, e, "join")
    blocker = _missing_input(task)
    if blocker is None:
        return None
    # where the blocking computation is itself stuck at the head of a queue, or else the chip
    # on which it is queued behind something else
    devices = blocker.node.devices
    holder = next((e for e in devices if queues[e] and queues[e][0] is blocker),
                  next((e for e in devices if blocker in queues[e]), devices[0]))
    return Wait(d, node.name, run.name, run.client, holder, "input", blocker.node.name)


def _missing_input(task: SimTask) -> SimTask | None:
    """The first computation, through transfers, that ``task`` needs and that has not ended."""
    todo = [p for p in task.producers if not p.done]
    while todo:
        p = todo.pop(0)
        if p.is_compute:
            return p
        todo.extend(q for q in p.producers if not q.done)
    return None

"""Checks the gang scheduler's order where it is decided: in its launch decisions.

Trace timestamps cannot show an ordering bug (an event's ``t_start`` is computed as the latest
of its launch, its inputs' ends and its devices' last end, so spans never overlap by
construction), so these checks read the scheduler's own decisions instead. ``LaunchLog``
records, per scheduler, every ``handle()`` call's events and decisions, in the order the
scheduler saw them; ``violations`` replays them and reports every computation launched onto a
device while a computation that is not its ancestor was still running there (between
``Ended`` events), which is exactly what gang scheduling forbids. Pure Python: no JAX.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pwkernel.runtime.scheduler import (
    Ended,
    GangScheduler,
    Launch,
    Ready,
    Submit,
    SubmitProgram,
)


@dataclass
class LaunchLog:
    """Every ``GangScheduler.handle`` call, per scheduler, while installed."""

    calls: dict[int, list[tuple[tuple, list]]] = field(default_factory=dict)
    schedulers: dict[int, GangScheduler] = field(default_factory=dict)  # each one that handled
    on_launch: Callable[[int], None] | None = None  # called with each launched task
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, monkeypatch) -> LaunchLog:
        original = GangScheduler.handle

        def handle(scheduler, *events):
            decisions = original(scheduler, *events)
            # handle() runs under its island's lock: appending here keeps the island's order
            with self._lock:
                self.calls.setdefault(id(scheduler), []).append((events, list(decisions)))
                self.schedulers[id(scheduler)] = scheduler
            if self.on_launch is not None:
                for d in decisions:
                    if isinstance(d, Launch):
                        self.on_launch(d.task)
            return decisions

        monkeypatch.setattr(GangScheduler, "handle", handle)
        return self

    def record(self, scheduler: GangScheduler, *events) -> list:
        """For tests that drive a scheduler directly: ``handle`` it, logged."""
        decisions = scheduler.handle(*events)
        self.calls.setdefault(id(scheduler), []).append((events, list(decisions)))
        return decisions

    def launches(self) -> int:
        return sum(isinstance(d, Launch) for calls in self.calls.values()
                   for _, decisions in calls for d in decisions)

    def violations(self) -> list[str]:
        out: list[str] = []
        for calls in self.calls.values():
            out += _replay(calls)
        return out


def _replay(calls) -> list[str]:
    devices: dict[int, frozenset[int]] = {}
    after: dict[int, tuple[int, ...]] = {}
    copies: set[int] = set()
    running: dict[int, set[int]] = {}  # device -> computations launched and not finished
    out: list[str] = []

    def ancestors(task: int) -> set[int]:
        seen, todo = set(), list(after.get(task, ()))
        while todo:
            a = todo.pop()
            if a not in seen:
                seen.add(a)
                todo.extend(after.get(a, ()))
        return seen

    for events, decisions in calls:
        for ev in events:
            if isinstance(ev, Submit):
                devices[ev.task], after[ev.task] = frozenset(ev.devices), tuple(ev.after)
                if ev.copy:
                    copies.add(ev.task)
            elif isinstance(ev, SubmitProgram):  # a run's computations: ids are base + index
                for spec in ev.nodes:
                    t = ev.base + spec.index
                    devices[t] = frozenset(spec.devices)
                    after[t] = tuple(ev.base + a for a in spec.after)
            elif isinstance(ev, Ready) and ev.after:
                after[ev.task] = tuple(ev.after)
            elif isinstance(ev, Ended):
                for d in devices.get(ev.task, ()):
                    running.get(d, set()).discard(ev.task)
        for decision in decisions:
            t = decision.task
            if not isinstance(decision, Launch) or t in copies:
                continue  # a copy needs memory only, never a device to itself
            mine = ancestors(t)
            for d in sorted(devices[t]):
                others = running.setdefault(d, set()) - mine
                if others:
                    out.append(f"task {t} was launched on busy device {d} while "
                               f"{sorted(others)} (not its ancestors) were running there")
                running[d].add(t)
    return out

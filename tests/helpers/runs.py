"""Runs driven by hand, for unit tests of a task's life (tests/runtime, tests/backends/local).

A ``ProgramRun`` talks to its owner only through ``owner.RunOwner``; ``Owner`` here implements
that port and writes down what the run asked, so a test can feed a run events (a launch, a
completion) and read what followed, with no dispatcher, scheduler or backend in between. The
plans are real: traced from ``pw.program``s on real (virtual CPU) devices, their computations
compiled and callable.
"""

from __future__ import annotations

import threading

import numpy as np

import pwkernel as pw
from pwkernel.runtime.objects import Future
from pwkernel.runtime.plan import Plan, build
from pwkernel.runtime.tasks import ClientSpec, ProgramRun


class _Off:
    enabled = False


class Owner:
    """A ``RunOwner`` that records what its runs ask (``calls``: (name, *args) in order)."""

    virtual = False
    memory_budget = None
    trace = _Off()

    def __init__(self):
        self.calls: list[tuple] = []
        self.threads: dict[str, int] = {}  # task name -> the thread its end was reported in
        self.ended_runs: list[ProgramRun] = []
        self.clock = 100.0

    def now(self) -> float:
        return self.clock

    def arrived(self, run, *slots) -> None:
        self.calls.append(("arrived", *slots))

    def start_copy(self, task) -> None:
        self.calls.append(("start_copy", task.node.name))

    def computation_ended(self, task, seconds: float) -> None:
        self.threads[task.node.name] = threading.get_ident()
        self.calls.append(("computation_ended", task.node.name))

    def release_memory(self, island, devices, nbytes) -> None:
        self.calls.append(("release_memory", island))

    def drop_queued(self, island, tasks) -> list:
        self.calls.append(("drop_queued", *[t.node.name for t in tasks]))
        return [t for t in tasks if t.drop()]

    def work_began(self) -> None:
        self.calls.append(("work_began",))

    def work_ended(self) -> None:
        self.calls.append(("work_ended",))

    def check_memory_when_idle(self) -> None:
        pass

    def run_ended(self, run) -> None:
        self.ended_runs.append(run)

    def expedite(self, task, timeout) -> None:
        self.calls.append(("expedite", task.node.name))

    def settle(self, predicate, timeout) -> bool:
        return predicate()

    def ended(self) -> list[str]:
        """The computations whose ends were reported, in order."""
        return [c[1] for c in self.calls if c[0] == "computation_ended"]


def chain_plan(ctl: pw.Controller, island: int = 0, devices: int = 1) -> Plan:
    """``b(a(x))`` on one slice: its plan's nodes are [copy of x onto the slice, a, b]."""
    s = ctl.slice(devices, island=island)
    a = pw.function(lambda x: x * 2, slice=s, name="a")
    b = pw.function(lambda x: x + 1, slice=s, name="b")

    @pw.program
    def chain(x):
        return b(a(x))

    return build(chain.trace(np.ones(4, np.float32)))


def pair_plan(ctl: pw.Controller, first, second, island: int = 0) -> Plan:
    """``(first(x), second(x))`` on one slice, as ``pw.function``s named "first" and "second":
    two computations on one device set that do not read each other."""
    s = ctl.slice(1, island=island)
    f = pw.function(first, slice=s, name="first")
    g = pw.function(second, slice=s, name="second")

    @pw.program
    def pair(x):
        return f(x), g(x)

    return build(pair.trace(np.ones(4, np.float32)))


def start(plan: Plan, owner: Owner | None = None, parallel: bool = True,
          x=None) -> ProgramRun:
    """A run of ``plan`` with its inputs there (``x``, default ones) and a ``Future`` for each
    of its outputs, as the dispatcher leaves one after submission (no task launched yet)."""
    run = ProgramRun(owner or Owner(), plan, ClientSpec("tester"), parallel)
    for slot in plan.inputs:
        run.values[slot] = np.ones(4, np.float32) if x is None else x
        run.t_done[slot] = 0.0
    for out in plan.made:
        run.futures[out.slot] = Future(out.shape, out.dtype, name=out.name)
    return run


def by_name(run: ProgramRun) -> dict:
    return {t.node.name: t for t in run.tasks}

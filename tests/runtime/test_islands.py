"""One island's queue, fed events by hand (``runtime/islands.py``): what it launches, in which
order, what it drops, and what it asks a task's run for. Its executor here only writes down
the launches it is handed; the tasks' runs have ``tests.helpers.runs.Owner`` as their owner."""

from __future__ import annotations

import numpy as np
import pytest

from pwkernel.runtime import scheduler as sch
from pwkernel.runtime.errors import MemoryBudgetError
from pwkernel.runtime.islands import IslandQueue
from pwkernel.runtime.objects import Future
from pwkernel.runtime.tasks import TaskState
from tests.helpers.runs import Owner, by_name, chain_plan, start


class Launches:
    """An executor that launches nothing: it writes down what it was handed, in order."""

    program_ahead = False

    def __init__(self):
        self.handed: list[list[str]] = []

    def now(self) -> float:
        return 0.0

    def launch(self, island: int, tasks) -> None:
        self.handed.append([t.node.name for t in tasks])


@pytest.fixture
def island(ctl):
    return ctl.executor.islands[0]


def submit(queue: IslandQueue, task, memory: int = 0, copy: bool = False) -> None:
    node = task.node
    assert task.enqueue()
    queue.submit(task, sch.Submit(task=task.id, devices=node.devices, memory=memory, ready=True,
                                  group=task.run.id, copy=copy))


def test_launches_leave_in_decision_order_and_join_their_device_sets_line(ctl, island):
    executor = Launches()
    queue = IslandQueue(island, executor, "fifo", None)
    run = start(chain_plan(ctl))
    t = by_name(run)
    submit(queue, t["a"])
    submit(queue, t["b"])  # same devices: waits for a's end
    assert executor.handed == [["a"]]
    assert t["a"].state is TaskState.RUNNING and t["b"].state is TaskState.QUEUED
    queue.ended(t["a"], 1.0)
    assert executor.handed == [["a"], ["b"]]
    line = queue.ends.line(t["a"].node.devices)
    assert t["a"].line is t["b"].line is line and len(line) == 2  # in launch order
    assert queue.ends.unreported() == 2


def test_a_paused_queue_decides_but_launches_nothing_until_resumed(ctl, island):
    executor = Launches()
    queue = IslandQueue(island, executor, "fifo", None)
    run = start(chain_plan(ctl))
    queue.pause()
    submit(queue, by_name(run)["a"])
    assert executor.handed == [] and by_name(run)["a"].state is TaskState.RUNNING
    queue.resume()
    assert executor.handed == [["a"]]


def test_cancel_drops_only_what_has_not_launched(ctl, island):
    queue = IslandQueue(island, Launches(), "fifo", None)
    run = start(chain_plan(ctl))
    t = by_name(run)
    submit(queue, t["a"])
    submit(queue, t["b"])
    assert queue.cancel(t["a"], t["b"]) == [t["b"]]
    assert t["b"].state is TaskState.CANCELLED and t["a"].state is TaskState.RUNNING


def test_a_computation_over_the_budget_is_rejected_and_its_run_told(ctl, island):
    queue = IslandQueue(island, Launches(), "fifo", 1000)
    owner = Owner()
    run = start(chain_plan(ctl), owner)
    b = by_name(run)["b"]
    fut = run.futures[b.node.outputs[0]] = Future((4,), np.float32)
    submit(queue, b, memory=10_000)
    assert b.state is TaskState.CANCELLED
    assert isinstance(fut.exception(0), MemoryBudgetError)


def test_an_admitted_copy_is_started_by_its_runs_owner(ctl, island):
    queue = IslandQueue(island, Launches(), "fifo", 1000)
    owner = Owner()
    run = start(chain_plan(ctl), owner)
    copy = run.tasks[0]
    submit(queue, copy, memory=100, copy=True)
    assert copy.state is TaskState.RUNNING and copy.line is None
    assert ("start_copy", copy.node.name) in owner.calls


class EndsAtOnce(Launches):
    """Launches what it is handed and sees each end at once, in the launching thread (as the
    local backend does when a launch's outputs are ready when its call returns)."""

    def __init__(self):
        super().__init__()
        self.queue: IslandQueue | None = None

    def launch(self, island: int, tasks) -> None:
        super().launch(island, tasks)
        for task in tasks:
            self.queue.ended(task, 1.0)


def test_ends_seen_at_once_while_draining_reach_the_scheduler_together(ctl, island):
    executor = EndsAtOnce()
    queue = executor.queue = IslandQueue(island, executor, "fifo", None)
    handled: list[list[str]] = []
    handle = queue.scheduler.handle

    def counting(*events):
        handled.append([type(e).__name__ for e in events])
        return handle(*events)

    queue.scheduler.handle = counting
    plan = chain_plan(ctl)
    t = by_name(start(plan))
    other = by_name(start(plan))["a"]  # another run's, on the same device: waits
    queue.pause()
    submit(queue, t["a"])
    assert t["b"].enqueue()
    queue.submit(t["b"], sch.Submit(task=t["b"].id, devices=t["b"].node.devices, ready=True,
                                    after=(t["a"].id,), group=t["b"].run.id))  # behind a
    submit(queue, other)
    queue.resume()
    assert executor.handed == [["a", "b"], ["a"]]  # the gang order is the scheduler's
    # a's and b's ends, seen while their batch launched, in one step; then other's alone
    assert handled[-2:] == [["Ended", "Ended"], ["Ended"]]
    assert queue.scheduler.running == () and queue.scheduler.queued == ()

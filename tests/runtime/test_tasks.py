"""A task's life, fed events by hand: moves, completions, the order ends are reported in
(``runtime/tasks.py``, ``runtime/ends.py``). No dispatcher, scheduler or backend: the run's
owner is ``tests.helpers.runs.Owner``, which records what the run asks of it."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.ends import Line
from pwkernel.runtime.objects import Future
from pwkernel.runtime.plan import build
from pwkernel.runtime.slots import ArgumentGroup
from pwkernel.runtime.tasks import TaskState
from tests.helpers.runs import Owner, by_name, chain_plan, start


@pytest.fixture
def plan(ctl):
    return chain_plan(ctl)


def launch(task, line: Line | None, t: float = 1.0) -> None:
    """What an island queue does when its scheduler launches ``task``."""
    task.queued(0.0)
    task.launch(line)
    task.t_launch = t


def outputs(task):
    """The task's outputs, computed for real."""
    return task.node.call(*task.inputs())


def test_the_moves_are_the_table(plan):
    run = start(plan)
    copy, a, _ = run.tasks
    assert a.state is TaskState.WAITING
    assert not a.move(TaskState.ENDED)  # only a running task ends
    assert a.enqueue() and a.state is TaskState.QUEUED
    assert not a.enqueue()  # once
    assert copy.start_copy(admitted=False) and copy.state is TaskState.RUNNING
    assert not copy.drop()  # a started copy is not cancelled
    assert a.drop() and a.state is TaskState.CANCELLED
    assert TaskState.DONE is TaskState.ENDED  # the old name still reads


def run_copy(run) -> None:
    copy = run.tasks[0]
    assert copy.start_copy(admitted=False)
    copy.completed(0.5, None, [run.values[copy.node.inputs[0]]])


def test_a_completion_ends_the_task_at_once_when_nothing_is_before_it(plan):
    owner = Owner()
    run = start(plan, owner)
    run_copy(run)
    t = by_name(run)
    line = Line({})
    launch(t["a"], line)
    t["a"].completed(3.0, None, outputs(t["a"]))
    assert t["a"].state is TaskState.ENDED and owner.ended() == ["a"]
    assert run.values[t["a"].node.outputs[0]] is not None  # b reads it
    assert run.values[t["a"].node.inputs[0]] is None  # a was its last reader: freed


def test_ends_are_reported_in_launch_order_on_a_device_set(plan):
    """b completes first, but a was launched before it on the same devices: b's end waits
    for a's, and a's report reports both, in order."""
    owner = Owner()
    run = start(plan, owner)
    run_copy(run)
    t = by_name(run)
    line = Line({})
    a, b = t["a"], t["b"]
    launch(a, line, 1.0)
    launch(b, line, 1.5)
    outs_a = outputs(a)
    run.launched(a, outs_a)
    b.completed(2.0, None, outputs(b))
    assert b.state is TaskState.RUNNING and owner.ended() == []
    assert b.has_outputs  # parked, its outputs published: its readers need not wait
    a.completed(4.0)
    assert owner.ended() == ["a", "b"]
    assert a.state is b.state is TaskState.ENDED
    assert run.done() and owner.ended_runs == [run]


def test_a_completion_waits_for_its_inputs_ends_and_an_upstream_error_wins(plan):
    """b (on other devices) completes before its input's maker a ends: it is parked, and a's
    end reports it, with a's error and a span starting at a's end."""
    owner = Owner()
    run = start(plan, owner)
    run_copy(run)
    t = by_name(run)
    a, b = t["a"], t["b"]
    out = b.node.outputs[0]
    fut = run.futures[out] = Future((4,), np.float32, name="b")
    launch(a, Line({}), 1.0)
    launch(b, Line({}), 1.2)
    run.launched(a, outputs(a))
    b.completed(2.0, None, outputs(b))
    assert b.state is TaskState.RUNNING and owner.ended() == []
    error = ValueError("a failed")
    a.completed(5.0, error)
    assert owner.ended() == ["a", "b"]
    assert fut.exception(0) is error
    assert fut.t_done == 5.0  # not before its input ended


def test_a_span_starts_after_the_previous_end_on_its_devices(plan):
    owner = Owner()
    run = start(plan, owner)
    run_copy(run)
    t = by_name(run)
    last_end = {d: 7.0 for d in t["a"].node.devices}  # other work there ended at 7
    launch(t["a"], Line(last_end), 1.0)
    out = t["a"].node.outputs[0]
    run.refs[out] += 1  # (keep it readable: b never runs here)
    t["a"].completed(3.0, None, outputs(t["a"]))
    assert run.t_done[out] == 7.0  # its end is not before its start
    assert all(v == 7.0 for v in last_end.values())


def test_a_failure_spreads_to_what_has_not_started_and_the_run_ends(plan):
    owner = Owner()
    run = start(plan, owner)
    copy, a, b = run.tasks
    futs = {s: run.futures.setdefault(s, Future((4,), np.float32)) for s in b.node.outputs}
    a.enqueue()
    error = RuntimeError("copy failed")
    copy.start_copy(admitted=False)
    copy.completed(1.0, error)
    assert a.state is b.state is TaskState.CANCELLED
    assert ("drop_queued", "a") in owner.calls  # a was queued: taken out of its scheduler
    assert all(f.exception(0) is error for f in futs.values())
    assert run.done() and owner.ended_runs == [run] and run.values is None


def test_cancel_drops_every_node_not_launched(plan):
    owner = Owner()
    run = start(plan, owner)
    copy, a, b = run.tasks
    copy.start_copy(admitted=False)
    assert run.cancel() == 2
    assert a.state is b.state is TaskState.CANCELLED
    assert not run.done()  # the copy still runs
    copy.completed(1.0, None, [run.values[copy.node.inputs[0]]])
    assert run.done() and run.wait(0)


def test_expedite_asks_the_owner_only_for_running_work(plan):
    owner = Owner()
    run = start(plan, owner)
    a = by_name(run)["a"]
    a.expedite()
    assert ("expedite", "a") not in owner.calls
    launch(a, Line({}))
    a.expedite()
    assert ("expedite", "a") in owner.calls


def test_only_tasks_py_changes_a_tasks_state():
    """Other modules ask a task for a move (``enqueue``, ``launch``, ``drop``...): an
    assignment to ``x.state`` on anything but ``self`` is a task's state set elsewhere."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "pwkernel"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and sub.attr == "state" and not (
                            isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert not found, f"a task's state set outside runtime/tasks.py: {found}"


def test_the_dispatcher_and_the_test_owner_implement_the_port():
    """``RunOwner`` is all a run asks of its owner: the dispatcher implements each of its
    methods, and so does the double these tests feed runs with."""
    from pwkernel.runtime.dispatcher import Dispatcher
    from pwkernel.runtime.owner import RunOwner

    methods = {n for n, v in vars(RunOwner).items() if callable(v) and not n.startswith("_")}
    assert {"arrived", "computation_ended", "run_ended", "start_copy"} <= methods
    for cls in (Dispatcher, Owner):  # (a dispatcher's ``now`` is its executor's, per instance)
        assert not [n for n in methods - {"now"} if not callable(getattr(cls, n, None))], cls
    assert set(RunOwner.__annotations__) == {"virtual", "memory_budget", "launch_holds_inputs",
                                             "trace"}


def sum_plan(ctl, n: int):
    """``sum(xs)`` of ``n`` arguments on one device: a plan with ``n`` argument slots."""
    f = pw.function(lambda xs: sum(xs), slice=ctl.slice(1, island=0), name="sum")

    @pw.program
    def total(xs):
        return f(xs)

    return build(total.trace([np.ones(4, np.float32)] * n))


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("first", ["launch", "end"])
def test_argument_futures_are_counted_once_whichever_hook_runs_first(ctl, first, n):
    """Pending arguments are watched twice (their launch, their end), and the two hooks may
    run in different threads: the end's can come first. Each value is counted as arrived
    exactly once either way (once lost, its reader never became ready)."""
    owner = Owner()
    plan = sum_plan(ctl, n)
    run = start(plan, owner)
    group = None
    for slot in plan.inputs:  # given as futures still computing
        run.values[slot] = run.t_done[slot] = None
        fut = Future((4,), np.float32)
        fut.set_result(np.ones(4, np.float32), 1.0)
        group = group or ArgumentGroup(fut)
        group.slots.append(slot)
        group.futures.append(fut)
    hooks = [run.inputs_arrived, run.inputs_ended]
    for hook in hooks if first == "launch" else hooks[::-1]:
        hook(group)
    arrived = [s for c in owner.calls if c[0] == "arrived" for s in c[1:]]
    assert sorted(arrived) == sorted(plan.inputs)
    assert all(run.t_done[s] == 1.0 for s in plan.inputs)


def test_a_step_keeps_no_earlier_steps_task_alive(ctl):
    # A task finds who makes its inputs once (``slots.makers``) and forgets it at its end:
    # else each step's producer would hold the one before it, and a training loop would keep
    # every step it ever ran.
    import gc

    from pwkernel.runtime.tasks import Task

    s = ctl.slice(4, island=0)
    step = pw.function(lambda xs: [x * 0.5 + 1 for x in xs], slice=s, donate_argnums=0,
                       name="halve")

    def alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is Task and o.run.name == "halve")

    state = step([np.ones(4, np.float32) for _ in range(3)])
    for _ in range(8):  # each submitted while the one before may still run
        state = step(state)
    assert state[0].result().tolist() == [1.998046875] * 4
    # (a value is ready before its run has ended; and once ended, no thread that reported
    # an end may still hold its task: a watcher left it to a helper that went on reporting)
    assert ctl.wait(timeout=60)
    assert alive() == 1  # the last step's, which its outputs name as their producer

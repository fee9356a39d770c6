"""The local executor, handed tasks by hand (``backends/local/executor.py``): it launches them
on this process's devices and reports only that each completed (``Task.completed``); the
runtime reports the ends in order. The tasks' runs have ``tests.helpers.runs.Owner`` as their owner,
so what the executor's reports led to can be read back."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from pwkernel.runtime.ends import Line
from pwkernel.runtime.objects import Future
from pwkernel.runtime.tasks import TaskState
from tests.helpers.runs import Owner, by_name, chain_plan, pair_plan, start


def launch_on(ex, line: Line, *tasks) -> None:
    """What an island queue does: each task launched on ``line``, handed over in order."""
    for task in tasks:
        task.queued(0.0)
        task.launch(line)
    ex.launch(tasks[0].node.island, list(tasks))


def copy_in(ex, run) -> None:
    copy = run.tasks[0]
    assert copy.start_copy(admitted=False)
    ex.transfer(copy)


def future_of(run, task) -> Future:
    out = task.node.outputs[0]
    fut = run.futures[out] = Future((4,), np.float32, name=task.node.name)
    return fut


def test_ends_of_small_computations_are_seen_in_the_launching_thread(ctl):
    """The fast path: outputs ready right after the call, nothing before them watched."""
    ex, me, here = ctl.executor, threading.get_ident(), 0
    for _ in range(20):
        owner = Owner()
        run = start(chain_plan(ctl), owner)
        fut = future_of(run, run.tasks[-1])
        copy_in(ex, run)
        t = by_name(run)
        launch_on(ex, Line({}), t["a"], t["b"])
        assert fut.wait(60) and fut.result().tolist() == [3.0] * 4
        here += owner.threads["b"] == me
    assert here  # (most are, on an idle machine; none means the fast path is gone)


def gate(opened: threading.Event):
    def wait(x):
        assert opened.wait(60), "the gate was never opened"
        return x

    return lambda x: jax.pure_callback(wait, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_an_end_waits_for_the_launch_before_it_on_its_devices(ctl):
    """``first`` (a host callback, so launched on a worker) blocks; ``second``, launched after
    it on the same devices, completes at once: its outputs are published, its end waits."""
    opened = threading.Event()
    owner = Owner()
    run = start(pair_plan(ctl, gate(opened), lambda x: x + 1), owner)
    t = by_name(run)
    first, second = future_of(run, t["first"]), future_of(run, t["second"])
    copy_in(ctl.executor, run)
    assert run.tasks[0].inputs_ended() is not None
    launch_on(ctl.executor, Line({}), t["first"], t["second"])
    assert not second.wait(0)  # it must not end before first
    assert t["second"].state is TaskState.RUNNING and owner.ended() == []
    opened.set()
    assert first.wait(60) and second.wait(60)
    assert owner.ended() == ["first", "second"]
    assert first.t_done <= second.t_done


def test_a_host_callbacks_exception_fails_the_task(ctl):
    def boom(x):
        raise ValueError("from the callback")

    owner = Owner()
    run = start(pair_plan(ctl, lambda x: jax.pure_callback(
        boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x), lambda x: x), owner)
    t = by_name(run)
    bad, good = future_of(run, t["first"]), future_of(run, t["second"])
    copy_in(ctl.executor, run)
    launch_on(ctl.executor, Line({}), t["first"], t["second"])
    assert bad.wait(60) and good.wait(60)
    with pytest.raises(ValueError, match="from the callback"):
        bad.result()
    assert good.result().tolist() == [1.0] * 4


def test_a_transfer_reports_its_copy(ctl):
    owner = Owner()
    run = start(chain_plan(ctl), owner, x=np.arange(4, dtype=np.float32))
    copy = run.tasks[0]
    [out] = copy.node.outputs  # (not a program output: it has no future, only its slot)
    run.refs[out] += 1  # (keep it readable: a never runs here)
    copy_in(ctl.executor, run)
    assert run.slots_ended([out], timeout=60) is not None
    assert np.asarray(run.values[out]).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert copy.has_ended and copy.line is None

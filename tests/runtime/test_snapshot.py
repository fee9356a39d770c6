"""``ctl.snapshot()``: the runtime's read side, frozen records of a live controller."""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.snapshot import NodeView, RunView, SliceView, Snapshot
from pwkernel.runtime.tasks import TaskState
from tests.helpers.programs import gate


def test_a_running_program_with_its_nodes_slices_memory_and_queues(ctl):
    s0 = ctl.slice(1, island=0, axis_names=["data"], axis_types="auto")
    s1 = ctl.slice((2, 2), island=1)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release), slice=s0, name="held")
    after = pw.function(lambda x: x + 1, slice=s1, name="after")
    y = pw.program(lambda v: after(held(v)), name="blocked")(np.ones(4, np.float32))
    try:
        assert entered.wait(60)
        snap = ctl.snapshot()
    finally:
        release.set()
    y.result(timeout=60)

    assert isinstance(snap, Snapshot) and not snap.closed
    assert (snap.policy, snap.dispatch) == ("fifo", "parallel")
    assert [(i.id, i.device_ids) for i in snap.islands] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    assert snap.island(0).running == 1 and snap.island(1).running == 0
    assert snap.slices == (SliceView(s0.id, 0, (0,), (1,), ("data",), ("auto",)),
                           SliceView(s1.id, 1, (4, 5, 6, 7), (2, 2), s1.axis_names,
                                     ("explicit", "explicit")))
    (run,) = snap.runs
    assert isinstance(run, RunView) and (run.name, run.client) == ("blocked", "default")
    assert all(isinstance(n, NodeView) for n in run.nodes)
    assert [(n.name, n.compute) for n in run.nodes if n.compute] == [("held", True),
                                                                    ("after", True)]
    held_node = next(n for n in run.nodes if n.name == "held")
    assert held_node.state is TaskState.RUNNING and held_node.island == 0
    assert held_node.devices == (0,) and held_node.t_launch > 0
    copy = next(n for n in run.nodes if not n.compute and n.island == 1)  # to `after`
    assert copy.state is TaskState.WAITING
    assert (run.state, run.running_on, run.islands) == ("running", (0,), (0, 1))
    assert set(snap.memory) == set(range(8)) and snap.memory[0] >= 16  # the input, on dev 0

    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.policy = "share"
    with pytest.raises(TypeError):
        snap.memory[0] = 0  # a read-only mapping


def test_a_closed_controller_snapshots_as_closed():
    ctl = pw.Controller(islands=(2,))
    ctl.close()
    assert ctl.snapshot() == Snapshot(closed=True)


def test_a_closed_controllers_status_says_closed_and_lists_nothing():
    """``ctl.status()`` is the snapshot rendered: once closed, no islands, slices or memory
    (its islands' devices and buffers are gone), the same keys, ``closed`` True."""
    ctl = pw.Controller(islands=(2,))
    ctl.slice(2)
    keys = set(ctl.status())
    ctl.close()
    assert ctl.status() == {"islands": [], "slices": [], "programs": [], "memory": {},
                            "policy": "", "dispatch": "", "closed": True}
    assert set(ctl.status()) == keys


def test_set_default_makes_pw_controller_return_it():
    from pwkernel.runtime.controller import running_default

    ctl = pw.Controller(islands=(2,))
    try:
        assert ctl.set_default() is ctl and pw.controller() is ctl and running_default() is ctl
    finally:
        ctl.close()
    assert running_default() is None
    with pytest.raises(pw.ControllerClosedError):
        ctl.set_default()


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_dispatch_per_call_leaves_the_controllers_mode_alone(ctl, mode):
    """Behind a held node, the next one is with its scheduler at once under parallel dispatch
    (queued, or already launched behind its producer), and waits for the held one's value under
    sequential: in that call only."""
    s0 = ctl.slice(2, island=0)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release), slice=s0, name="held")
    after = pw.function(lambda x: x + 1, slice=s0, name="after")
    prog = pw.program(lambda v: after(held(v)), name="pair")
    ctl.dispatch = "sequential" if mode == "parallel" else "parallel"  # the other one
    y = prog(np.ones(4, np.float32), dispatch=mode)
    try:
        assert entered.wait(60)
        (run,) = ctl.snapshot().runs
    finally:
        release.set()
    np.testing.assert_allclose(y.result(timeout=60), 2.0)
    state = {n.name: n.state for n in run.nodes if n.compute}
    assert state["held"] is TaskState.RUNNING
    ahead = (TaskState.QUEUED, TaskState.RUNNING) if mode == "parallel" else (TaskState.WAITING,)
    assert state["after"] in ahead
    assert ctl.dispatch != mode  # the controller's mode did not change
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        prog(np.ones(4, np.float32), dispatch="eager")


def test_a_pool_part_from_an_executors_generic_pool_dict(ctl):
    from pwkernel.runtime.snapshot import PoolView

    row = {"name": "a", "queued": 1, "running": 2, "share": 0.25, "device_seconds": 1.5,
           "bytes": 64, "devices": {1: [2, 3], 0: [0]}, "me": True}
    pool = PoolView.of({"name": "class", "islands": [{"island": 0}, {"island": 1, "lost": True}],
                        "tenants": [row, {**row, "name": "b", "me": False, "devices": {}}]})
    assert pool.name == "class" and pool.lost == (1,)
    assert pool.me.name == "a" and dict(pool.me.slices) == {0: (0,), 1: (2, 3)}
    assert [t.name for t in pool.others] == ["b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.me.share = 1.0  # type: ignore[misc]
    assert pool.as_status()["tenants"][0]["slices"] == {0: [0], 1: [2, 3]}
    assert PoolView.of(None) is None
    assert PoolView.of_executor(ctl.executor) is None  # local islands are no pool's
    assert ctl.snapshot().pool is None and "pool" not in ctl.status()


class _PausedAt:
    """Hold the thread that runs ``target`` when it first calls ``code`` (with arguments
    ``when`` accepts), until ``go``."""

    def __init__(self, code, target, when=lambda args: True):
        self.code, self.target, self.when = code, target, when
        self.inside, self.go = threading.Event(), threading.Event()
        self.result: list = []

    def __call__(self) -> None:
        def profile(frame, event, _arg):
            if (event == "call" and frame.f_code is self.code and not self.inside.is_set()
                    and self.when(frame.f_locals)):
                self.inside.set()
                self.go.wait(60)
        sys.setprofile(profile)  # (this thread only)
        try:
            self.result.append(self.target())
        except Exception as e:  # noqa: BLE001 - handed to the test to assert on
            self.result.append(e)
        finally:
            sys.setprofile(None)

    def meanwhile(self, action):
        """Run ``target`` on a thread of its own, do ``action`` while it is held, let it go;
        what it returned (or raised)."""
        reader = threading.Thread(target=self)
        reader.start()
        try:
            assert self.inside.wait(60)
            action()
        finally:
            self.go.set()
            reader.join(60)
        (got,) = self.result
        return got


@pytest.mark.parametrize("read", ["snapshot", "status"])
def test_a_snapshot_taken_while_another_thread_closes_says_closed(read):
    """A monitoring thread's ``ctl.status()`` as another thread closes the controller: it
    answers closed; before, one that had begun reading slices the close then released raised
    ``ControllerClosedError`` (a status loop beside a training loop died with it)."""
    ctl = pw.Controller(islands=(4, 4))
    ctl.slice(2, island=0)
    paused = _PausedAt(SliceView.of.__func__.__code__, getattr(ctl, read))
    got = paused.meanwhile(ctl.close)  # (it has seen the controller open, and reads a slice)
    assert not isinstance(got, Exception), repr(got)
    assert got.closed if read == "snapshot" else got["closed"]
    assert not (got.slices if read == "snapshot" else got["slices"])


def test_a_slice_released_while_a_snapshot_reads_it_is_left_out(ctl):
    """A slice another thread releases while ``ctl.snapshot()`` reads the slices is left out
    of it, as one released before is; before, the snapshot raised ``SliceError``."""
    kept, going = ctl.slice(2, island=0), ctl.slice(2, island=1)
    paused = _PausedAt(SliceView.of.__func__.__code__, ctl.snapshot,
                       when=lambda args: args["vs"] is going)  # (kept was read already)
    got = paused.meanwhile(going.release)
    assert not isinstance(got, Exception), repr(got)
    assert [v.id for v in got.slices] == [kept.id]

"""The gang scheduler as a pure state machine: feed events, assert decisions. No JAX, no time."""

from __future__ import annotations

import numpy as np
import pytest

from pwkernel.runtime.scheduler import (
    Backfill,
    Cancel,
    ClientSpec,
    Ended,
    Forget,
    GangScheduler,
    Launch,
    MemoryFreed,
    NodeSpec,
    Policy,
    Ready,
    Reject,
    SetPolicy,
    Submit,
    SubmitProgram,
)
from tests.helpers.gang_order import LaunchLog

ALL = (0, 1, 2, 3)


def launched(decisions) -> list[int]:
    return [d.task for d in decisions if isinstance(d, Launch)]


def test_fifo_launches_in_submission_order_one_gang_at_a_time():
    s = GangScheduler(ALL)
    assert launched(s.handle(*(Submit(task=t, devices=ALL, ready=True) for t in range(3)))) == [0]
    assert launched(s.handle(Ended(task=0, seconds=1.0))) == [1]
    assert launched(s.handle(Ended(task=1, seconds=1.0))) == [2]
    assert s.running == (2,) and s.queued == ()


def test_events_are_built_by_keyword_and_carry_one_client_spec():
    with pytest.raises(TypeError):
        Submit(0, ALL)  # field order is no part of the API
    alice = ClientSpec("alice", weight=2.0, priority=1)
    ev = Submit(task=0, devices=ALL, client=alice)
    assert ev.client is alice and Submit(task=1, devices=ALL).client == ClientSpec()
    from pwkernel.runtime.scheduler import Finished  # the event's old name

    assert Finished is Ended


def test_an_end_of_a_task_never_launched_is_refused_and_changes_nothing():
    s = GangScheduler(ALL)
    s.handle(Submit(task=0, devices=ALL, ready=True), Submit(task=1, devices=ALL, ready=True))
    with pytest.raises(ValueError, match=r"never launched.*Cancel\(task=1\)"):
        s.handle(Ended(task=1, seconds=1.0))
    assert s.running == (0,) and s.queued == (1,)  # its queries still answer
    assert launched(s.handle(Ended(task=0, seconds=1.0))) == [1]
    s.handle(Ended(task=9, seconds=1.0))  # (one it does not know: ended and gone already)


def test_disjoint_gangs_run_together_and_waiting_tasks_do_not_block():
    s = GangScheduler(ALL)
    out = s.handle(Submit(task=0, devices=(0, 1)), Submit(task=1, devices=(2, 3), ready=True),
                   Submit(task=2, devices=(0, 1), ready=True))
    assert launched(out) == [1, 2]  # task 0 is not ready: it does not hold the queue
    assert launched(s.handle(Ready(task=0))) == []  # devices 0, 1 busy with task 2
    assert launched(s.handle(Ended(task=2))) == [0]


def test_blocked_task_reserves_its_devices_so_it_cannot_starve():
    s = GangScheduler(ALL)
    s.handle(Submit(task=0, devices=(0, 1), ready=True))                  # running on 0, 1
    out = s.handle(Submit(task=1, devices=ALL, ready=True),
                   Submit(task=2, devices=(2, 3), ready=True))
    # task 1 waits for 0, 1 and reserves 2, 3: task 2 may not jump ahead of it there
    assert launched(out) == []
    assert launched(s.handle(Ended(task=0))) == [1]
    assert launched(s.handle(Ended(task=1))) == [2]


def drive(s: GangScheduler, log: LaunchLog, seed: int, n: int = 300) -> set[int]:
    """Run ``n`` computations on random gangs of ``s``'s devices to completion, as the runtime
    would: one in three reads an earlier one's output (it becomes ready once that one is
    launched), and a running computation finishes only after its producers. Returns the
    computations launched."""
    rng = np.random.default_rng(seed)
    devices = list(s.devices)
    reads: dict[int, int] = {}
    events = []
    for t in range(n):
        gang = tuple(sorted(rng.choice(devices, int(rng.integers(1, len(devices) + 1)),
                                       replace=False).tolist()))
        if t and rng.random() < 1 / 3:
            reads[t] = int(rng.integers(0, t))
        events.append(Submit(task=t, devices=gang, ready=t not in reads))
    launched_, running, done = set(), [], set()

    def apply(decisions):
        new = [d.task for d in decisions if isinstance(d, Launch)]
        launched_.update(new)
        running.extend(new)
        ready = [Ready(task=t, after=(p,)) for t, p in reads.items()
                 if p in new]  # its producer is launched: it may queue behind it
        return ready

    pending = apply(log.record(s, *events))
    while pending or running:
        if pending:
            pending = apply(log.record(s, *pending))
            continue
        free = [t for t in running if reads.get(t) is None or reads[t] in done]
        t = free[int(rng.integers(len(free)))]
        running.remove(t)
        done.add(t)
        pending = apply(log.record(s, Ended(task=t, seconds=1.0)))
    return launched_


@pytest.mark.parametrize("seed", range(4))
def test_no_launch_shares_a_device_with_a_running_computation_but_its_ancestors(seed):
    s = GangScheduler(ALL, policy=["fifo", "priority", "share", "fifo"][seed])
    log = LaunchLog()
    assert drive(s, log, seed) == set(range(300))
    assert log.violations() == []
    assert s.running == s.queued == ()
    assert s._ledger.ready_sets == {}  # (the counts a pass stops by went back to nothing)


def test_the_order_check_catches_a_scheduler_that_ignores_busy_devices(monkeypatch):
    # A test of the test above: with the device check switched off, it reports violations.
    monkeypatch.setattr(GangScheduler, "_devices_free", lambda self, t: True)
    log = LaunchLog()
    drive(GangScheduler(ALL), log, seed=0)
    assert log.violations() and "not its ancestors" in log.violations()[0]


def test_priority_policy_runs_higher_priority_first():
    s = GangScheduler(ALL, policy="priority")
    s.handle(Submit(task=0, devices=ALL, ready=True))
    s.handle(Submit(task=1, devices=ALL, client=ClientSpec(priority=0), ready=True),
             Submit(task=2, devices=ALL, client=ClientSpec(priority=5), ready=True))
    assert launched(s.handle(Ended(task=0))) == [2]
    assert launched(s.handle(Ended(task=2))) == [1]


def test_share_policy_gives_exact_proportional_shares():
    s = GangScheduler(ALL, policy=Policy.SHARE)
    weights = {"a": 1, "b": 2, "c": 4, "d": 8}
    owner, counts, task = {}, dict.fromkeys(weights, 0), 0
    events = []
    for name, w in weights.items():  # every client backlogged with plenty of equal tasks
        for _ in range(60):
            owner[task] = name
            events.append(Submit(task=task, devices=ALL, client=ClientSpec(name, weight=w),
                                 cost_key="step", ready=True))
            task += 1
    running = launched(s.handle(*events))
    for _ in range(15 * 4):
        (t,) = running
        counts[owner[t]] += 1
        running = launched(s.handle(Ended(task=t, seconds=1.0)))
    assert counts == {"a": 4, "b": 8, "c": 16, "d": 32}
    shares = s.shares()
    assert shares == pytest.approx({"a": 1 / 15, "b": 2 / 15, "c": 4 / 15, "d": 8 / 15})


def test_share_corrects_estimates_with_actual_durations():
    s = GangScheduler(ALL, policy="share")
    events = []
    for t in range(400):  # client "long" runs 3x longer computations than "short"
        name = "long" if t % 2 else "short"
        events.append(Submit(task=t, devices=ALL, client=ClientSpec(name), cost_key=name,
                             ready=True))
    running = launched(s.handle(*events))
    seconds = {"long": 3.0, "short": 1.0}
    while running:
        (t,) = running
        running = launched(s.handle(Ended(task=t, seconds=seconds["long" if t % 2 else "short"])))
        if sum(c.device_seconds for c in s._clients.values()) > 60 * 4:
            break
    shares = s.shares()
    assert shares["long"] == pytest.approx(0.5, abs=0.08)


def test_a_guess_for_a_computation_never_seen_does_not_hold_back_a_newcomer():
    """Before any computation has ended, a launch is charged a guess (a second per device
    here, for computations of a millisecond). A client that arrives then must not start behind
    what was guessed: weights 1 (bob) and 3 (alice) share the devices at once, not bob's whole
    backlog first (which is what happened, on every backend, until one call had ended)."""
    s = GangScheduler(ALL, policy="share")

    def chains(name, weight, first):  # 6 programs of a 4-step chain each
        return [SubmitProgram(base=first + 10 * k, client=ClientSpec(name, weight=weight),
                              nodes=tuple(NodeSpec(index=i, devices=frozenset(ALL),
                                                   cost_key="step", waits=(i - 1,) if i else (),
                                                   after=(i - 1,) if i else ())
                                          for i in range(4)))
                for k in range(6)]

    running = launched(s.handle(*chains("bob", 1.0, 0)))
    assert running == [0, 1, 2, 3]  # a chain launched ahead, each charged the guess
    running += launched(s.handle(*chains("alice", 3.0, 1000)))
    order = []
    while running:
        t = running.pop(0)
        order.append("a" if t >= 1000 else "b")
        running += launched(s.handle(Ended(task=t, seconds=1e-3)))
    assert len(order) == 48 and order[:4] == list("bbbb")
    assert order[4:20].count("a") >= 10, "".join(order)  # alice served from her arrival


def test_idle_client_does_not_bank_credit():
    s = GangScheduler(ALL, policy="share")
    busy = ClientSpec("busy")
    running = launched(s.handle(*(Submit(task=t, devices=ALL, client=busy, ready=True)
                                  for t in range(20))))
    for _ in range(10):
        running = launched(s.handle(Ended(task=running[0], seconds=1.0)))
    # a newcomer starts at the current virtual time: it alternates, it does not run 10 in a row
    s.handle(*(Submit(task=100 + t, devices=ALL, client=ClientSpec("new"), ready=True)
               for t in range(10)))
    order = []
    for _ in range(6):
        order.append(running[0])
        running = launched(s.handle(Ended(task=running[0], seconds=1.0)))
    assert sum(t >= 100 for t in order) == 3


@pytest.mark.parametrize("first, then, order, passes", [
    (1.0, 4.0, [10, 11, 12, 1], 8.0 / 1 + 8.0 / 4),  # its end, then task 1's estimate
    (4.0, 1.0, [10, 1, 11, 12], 8.0 / 4 + 3.0 / 1),  # its end, then task 1's end
])
def test_work_is_settled_at_the_weight_it_was_charged_at_launch(first, then, order, passes):
    """Client "a" launches a computation at weight ``first`` (charged a guess of 1 s; it runs
    8 s). While it runs, the same name submits at weight ``then`` (another thread's
    ``ctl.client("a", weight=...)``, or a weight changed between submissions). The 8 s were
    used at weight ``first``, so that is what moves "a"'s virtual time: at weight 1 "b"
    (weight 1, 3 s computations) runs until it has used as much (9 s) before "a" goes again;
    at weight 4 "a" is only 2 s ahead and goes after one of "b"'s. Corrected at the other
    weight, the two orders were swapped, and part of the guess stayed counted for ever."""
    s = GangScheduler((0,), policy="share")
    assert launched(s.handle(Submit(task=0, devices=(0,), client=ClientSpec("a", weight=first),
                                    cost_key="a", ready=True))) == [0]
    later = [Submit(task=1, devices=(0,), client=ClientSpec("a", weight=then), cost_key="a",
                    ready=True)]
    later += [Submit(task=10 + i, devices=(0,), client=ClientSpec("b"), cost_key="b",
                     ready=True) for i in range(6)]
    assert launched(s.handle(*later)) == []
    got = launched(s.handle(Ended(task=0, seconds=8.0)))
    for _ in range(3):
        got += launched(s.handle(Ended(task=got[-1], seconds=3.0)))
    assert got == order
    a = s._clients["a"]
    assert a.guessed == 0.0  # none of its guesses is running
    assert a.passes == pytest.approx(passes)


@pytest.mark.parametrize("program", [False, True], ids=["submit", "program"])
def test_a_launch_is_charged_at_the_weight_it_was_submitted_with(program):
    """Client "a" queues a computation at weight 1 behind "b"'s; before it launches, the same
    name submits more work at weight 4 (another ``ctl.client("a", weight=4)``). The queued
    computation was submitted at weight 1, so its launch is charged at weight 1 (its 2 s move
    "a" by 2, not by 0.5), and settled so; the work submitted at weight 4 is charged at 4.
    Charged at the name's latest weight, "a" got a quarter of the device time it asked for
    at weight 1 for free."""
    def submit(task, weight):
        spec = ClientSpec("a", weight=weight)
        if program:
            return SubmitProgram(base=task, client=spec, group=task, nodes=(
                NodeSpec(index=0, devices=frozenset({0}), cost_key="a"),))
        return Submit(task=task, devices=(0,), client=spec, cost_key="a", ready=True)

    s = GangScheduler((0,), policy="share")
    s.handle(Submit(task=0, devices=(0,), client=ClientSpec("b"), cost_key="a", ready=True))
    # (an estimate for "a"'s computations: 2 s, learnt from "b"'s)
    assert launched(s.handle(Ended(task=0, seconds=2.0))) == []
    s.handle(Submit(task=1, devices=(0,), client=ClientSpec("b"), cost_key="b", ready=True))
    assert launched(s.handle(submit(10, 1.0))) == []   # queued behind "b"'s task 1
    assert launched(s.handle(submit(20, 4.0))) == []
    a = s._clients["a"]
    start = a.passes
    assert launched(s.handle(Ended(task=1, seconds=2.0))) == [10]
    assert a.passes - start == pytest.approx(2.0 / 1.0)   # charged at weight 1, not 4
    # settled at weight 1 too; the work submitted at weight 4 goes next, charged at 4 (the
    # estimate is now 2.5 s: the mean of 2 and 3)
    assert launched(s.handle(Ended(task=10, seconds=3.0))) == [20]
    assert a.passes - start == pytest.approx(3.0 / 1.0 + 2.5 / 4.0)
    s.handle(Ended(task=20, seconds=2.5))
    assert a.passes - start == pytest.approx(3.0 / 1.0 + 2.5 / 4.0)
    assert a.guessed == 0.0


def test_memory_budget_back_pressure_and_rejection():
    s = GangScheduler((0, 1), memory_budget=100)
    out = s.handle(Submit(task=0, devices=(0,), memory=101, ready=True))
    assert isinstance(out[0], Reject) and "101 bytes" in out[0].reason
    assert launched(s.handle(Submit(task=1, devices=(0,), memory=60, ready=True))) == [1]
    assert launched(s.handle(Ended(task=1))) == []  # its output (60 B) is still alive
    # would be 120:
    assert launched(s.handle(Submit(task=2, devices=(0,), memory=60, ready=True))) == []
    assert launched(s.handle(MemoryFreed(device=0, nbytes=60))) == [2]
    assert s.memory_in_use()[0] == 60


def test_cancel_drops_queued_tasks_and_policy_switches():
    s = GangScheduler(ALL)
    s.handle(*(Submit(task=t, devices=ALL, ready=True) for t in range(3)))
    s.handle(Cancel(task=1), Cancel(task=0))  # 0 is running: it cannot be preempted
    assert s.running == (0,)
    assert launched(s.handle(Ended(task=0))) == [2]
    s.handle(SetPolicy(policy="priority"))
    assert s.policy is Policy.PRIORITY
    with pytest.raises(ValueError, match="expected one of"):
        s.handle(SetPolicy(policy="lottery"))


def test_a_program_node_reading_a_rejected_one_waits_to_be_cancelled():
    """Its input will never exist: it is not launched, and the runtime's Cancel drops it."""
    s = GangScheduler((0, 1), memory_budget=100)
    out = s.handle(SubmitProgram(base=10, nodes=(
        NodeSpec(index=0, devices=frozenset({0}), memory=500),
        NodeSpec(index=1, devices=frozenset({0}), memory=10, waits=(0,), after=(0,)),
        NodeSpec(index=2, devices=frozenset({1}), memory=10))))
    assert [type(d) for d in out] == [Reject, Launch] and out[0].task == 10
    assert launched(out) == [12]  # the node that reads nothing of it runs
    assert s.queued == (11,)
    s.handle(Cancel(task=11))
    assert s.queued == () and launched(s.handle(Ended(task=12))) == []


def test_unknown_devices_are_rejected():
    s = GangScheduler((0, 1))
    (out,) = s.handle(Submit(task=0, devices=(5,), ready=True))
    assert isinstance(out, Reject) and "not on this island" in out.reason


def test_a_chain_launches_ahead_behind_its_own_producers():
    s = GangScheduler(ALL, depth=3)
    s.handle(Submit(task=0, devices=(0, 1), ready=True))
    # 1 reads 0's output, 2 reads 1's: both may queue behind in-flight ancestors
    assert launched(s.handle(Submit(task=1, devices=(0, 1)), Ready(task=1, after=(0,)))) == [1]
    assert launched(s.handle(Submit(task=2, devices=(0, 1)), Ready(task=2, after=(1,)))) == [2]
    assert s.running == (0, 1, 2)
    # depth 3 reached: the next link waits for the oldest to finish
    assert launched(s.handle(Submit(task=3, devices=(0, 1)), Ready(task=3, after=(2,)))) == []
    assert launched(s.handle(Ended(task=0))) == [3]


def test_unrelated_work_never_queues_behind_in_flight_computations():
    s = GangScheduler(ALL)
    s.handle(Submit(task=0, devices=(0, 1), ready=True))
    # no data dependency:
    assert launched(s.handle(Submit(task=1, devices=(0, 1), ready=True))) == []
    # reserved by 1:
    assert launched(s.handle(Submit(task=2, devices=(1, 2)), Ready(task=2, after=(0,)))) == []
    assert launched(s.handle(Ended(task=0))) == [1]
    assert launched(s.handle(Ended(task=1))) == [2]


def test_program_ahead_queues_a_programs_nodes_behind_each_other_only():
    s = GangScheduler(ALL, program_ahead=True)
    s.handle(Submit(task=0, devices=(0, 1), ready=True, group="p"))
    # 1 is p's too but reads nothing of 0's: it may still queue behind it
    assert launched(s.handle(Submit(task=1, devices=(0, 1), ready=True, group="p"))) == [1]
    # another program's node waits for p's computations to leave the devices
    assert launched(s.handle(Submit(task=2, devices=(0, 1), ready=True, group="q"))) == []
    # and so does p's next node: 2 reserved the devices first (no starvation)
    assert launched(s.handle(Submit(task=3, devices=(0, 1), ready=True, group="p"))) == []
    assert launched(s.handle(Ended(task=0))) == []
    assert launched(s.handle(Ended(task=1))) == [2]
    assert launched(s.handle(Ended(task=2))) == [3]
    # without program_ahead the group is ignored
    plain = GangScheduler(ALL)
    plain.handle(Submit(task=0, devices=(0, 1), ready=True, group="p"))
    assert launched(plain.handle(Submit(task=1, devices=(0, 1), ready=True, group="p"))) == []


def test_copies_need_only_memory_and_keep_the_memory_order():
    s = GangScheduler((0, 1), memory_budget=100)
    # device 0 busy:
    assert launched(s.handle(Submit(task=0, devices=(0,), memory=10, ready=True))) == [0]
    # a copy onto a busy device is admitted at once: it takes memory, never the device
    assert launched(s.handle(Submit(task=1, devices=(0,), memory=50, ready=True, copy=True))) == [1]
    assert s.running == (0,) and s.queued == () and s.memory_in_use()[0] == 60
    # one that does not fit waits, and reserves: a later computation may not take its bytes
    out = s.handle(Submit(task=2, devices=(0,), memory=50, ready=True, copy=True),
                   Submit(task=3, devices=(0, 1), memory=20, ready=True))
    assert launched(out) == []
    assert s.waiting_for_memory() == [(2, frozenset({0}), 50)]
    assert launched(s.handle(Ended(task=0))) == []          # its output (10 B) is still alive
    # 50 + 50: 3 still does not fit
    assert launched(s.handle(MemoryFreed(device=0, nbytes=10))) == [2]
    assert launched(s.handle(MemoryFreed(device=0, nbytes=50))) == [3]
    assert s.memory_in_use() == {0: 70, 1: 20}
    (reject,) = s.handle(Submit(task=4, devices=(1,), memory=101, ready=True, copy=True))
    assert isinstance(reject, Reject) and "memory budget is 100" in reject.reason


def test_a_donating_launch_is_counted_net_of_its_credit_and_never_above_the_budget():
    """A launch let in on its credit (the bytes it donates, which XLA reuses for its outputs)
    is counted net of it: the count never reads above the budget for work that fit, and the
    donated bytes' give-back, whenever it comes, settles the credit instead of counting twice.
    A free that comes meanwhile settles it first (the count stays conservative)."""
    s = GangScheduler((0,), memory_budget=100)
    assert launched(s.handle(Submit(task=0, devices=(0,), memory=60, ready=True))) == [0]
    assert launched(s.handle(Ended(task=0))) == []  # its output, the state, is alive: 60
    # the next step donates the state: 60 + 60 - 60 fits, and so does the count
    assert launched(s.handle(Submit(task=1, devices=(0,), memory=60, ready=True,
                                    credit=60))) == [1]
    assert s.memory_in_use() == {0: 60}
    s.handle(MemoryFreed(device=0, nbytes=60))  # the launch consumed the state: settled
    assert s.memory_in_use() == {0: 60}
    # a step let in on its credit while an unrelated 30 B goes before its consumption
    assert launched(s.handle(Submit(task=2, devices=(0,), memory=30, ready=True,
                                    copy=True))) == [2]  # 90 in use
    assert launched(s.handle(Ended(task=1))) == []
    assert launched(s.handle(Submit(task=3, devices=(0,), memory=60, ready=True,
                                    credit=60))) == [3]
    assert s.memory_in_use() == {0: 90}  # (not 150)
    s.handle(MemoryFreed(device=0, nbytes=30))  # the unrelated free settles 30 of the 60
    assert s.memory_in_use() == {0: 90}
    s.handle(MemoryFreed(device=0, nbytes=60))  # the consumption: 30 settled, 30 freed
    assert s.memory_in_use() == {0: 60}
    s.handle(Ended(task=3), MemoryFreed(device=0, nbytes=60))
    assert s.memory_in_use() == {0: 0}


def test_waiting_for_memory_reports_only_the_head_of_each_device_set():
    s = GangScheduler(ALL, memory_budget=100)
    s.handle(Submit(task=0, devices=(0, 1), memory=90, ready=True))
    s.handle(Ended(task=0))                                 # its 90 B output stays alive
    s.handle(Submit(task=1, devices=(0,), memory=20, ready=True),  # waits for memory: the head on 0
             Submit(task=2, devices=(0, 1), memory=5, ready=True),     # behind 1 on device 0
             Submit(task=3, devices=(2, 3), memory=200, ready=True))  # rejected: over budget
    assert s.waiting_for_memory() == [(1, frozenset({0}), 20)]
    assert launched(s.handle(Submit(task=4, devices=(2,), ready=True))) == [4]  # others go on


# --- a program in one event, readiness inside the scheduler, the order kept incrementally ----
def chain_specs(n: int, devices=(0, 1)) -> tuple[NodeSpec, ...]:
    """A chain of ``n`` computations: each reads the one before it (ready once it launched)."""
    gang = frozenset(devices)
    return tuple(NodeSpec(index=i, devices=gang, cost_key="step", waits=(i - 1,) if i else (),
                          after=(i - 1,) if i else ())
                 for i in range(n))


def test_a_program_arrives_in_one_event_and_its_chain_launches_ahead():
    s = GangScheduler(ALL, depth=4)
    out = s.handle(SubmitProgram(base=100, nodes=chain_specs(6), client=ClientSpec("a"),
                                 group="run"))
    assert launched(out) == [100, 101, 102, 103]  # one event, the chain up to the depth
    assert launched(s.handle(Ended(task=100))) == [104]
    assert launched(s.handle(Ended(task=101))) == [105]
    assert s.queued == ()


def test_inputs_from_elsewhere_hold_a_program_node_until_ready():
    s = GangScheduler(ALL)
    specs = (NodeSpec(index=0, devices=frozenset({0, 1}), external=True),
             NodeSpec(index=1, devices=frozenset({0, 1}), waits=(0,), after=(0,)),
             NodeSpec(index=2, devices=frozenset({2, 3})))
    # only 12 has all it reads:
    assert launched(s.handle(SubmitProgram(base=10, nodes=specs))) == [12]
    assert launched(s.handle(Ready(task=10))) == [10, 11]  # 11 becomes ready as 10 launches
    # a node whose producer is dropped never becomes ready; the runtime cancels it too
    s.handle(SubmitProgram(base=20, nodes=specs[:2]), Cancel(task=20))
    assert 21 in s.queued and launched(s.handle(Ended(task=10), Ended(task=11))) == []
    s.handle(Cancel(task=21))
    assert s.queued == ()
    # nor does a dropped node when its producer launches afterwards
    s.handle(SubmitProgram(base=30, nodes=specs[:2]), Cancel(task=31))
    assert launched(s.handle(Ready(task=30))) == [30]
    assert s.running == (12, 30) and s.queued == ()
    assert launched(s.handle(Ended(task=30))) == []


class Looks(list):
    """A client's ready list, counting how many of its entries a pass looks at."""

    looked = 0

    def __getitem__(self, i):
        self.looked += 1
        return super().__getitem__(i)


def test_ready_work_is_not_walked_again_for_every_launch():
    s = GangScheduler(ALL)
    s.handle(Submit(task=0, devices=ALL, ready=True))  # holds every device
    s.handle(*(Submit(task=t, devices=(t % 4,), ready=True) for t in range(1, 2001)))
    client = s._clients["default"]
    client.ready = table = Looks(client.ready)
    assert launched(s.handle(Submit(task=5000, devices=ALL, ready=True))) == []
    # 2000 ready and blocked: a pass stops once every device is reserved (after 4 looks);
    # it neither sorts them again nor walks all of them
    assert table.looked <= 8
    table.looked = 0
    assert launched(s.handle(Ended(task=0))) == [1, 2, 3, 4]
    assert table.looked <= 16


def test_a_pass_stops_once_the_devices_ready_work_needs_are_reserved():
    # 2000 independent calls on a slice of half the island: the other half is never
    # reserved, and each end's pass still stops at once (it walked all of them: quadratic)
    s = GangScheduler(ALL)
    s.handle(*(Submit(task=t, devices=(0, 1), ready=True) for t in range(2000)))
    client = s._clients["default"]
    client.ready = table = Looks(client.ready)
    for t in range(20):
        assert launched(s.handle(Ended(task=t))) == [t + 1]
    assert table.looked <= 20 * 4


def test_passes_over_several_clients_stop_once_the_devices_they_need_are_reserved():
    s = GangScheduler(ALL)
    for t in range(2000):
        s.handle(Submit(task=t, devices=(0, 1), ready=True,
                        client=ClientSpec(name=("a", "b")[t % 2])))
    tables = [Looks(c.ready) for c in s._clients.values()]
    for c, table in zip(s._clients.values(), tables, strict=True):
        c.ready = table
    for t in range(20):
        assert launched(s.handle(Ended(task=t))) == [t + 1]
    assert sum(table.looked for table in tables) <= 20 * 8


def test_a_policy_switch_keeps_every_ready_computation():
    s = GangScheduler(ALL)
    s.handle(Submit(task=0, devices=ALL, ready=True))
    s.handle(*(Submit(task=t, devices=ALL, client=ClientSpec(f"c{t % 2}", priority=t % 3),
                      ready=True)
               for t in range(1, 10)))
    s.handle(SetPolicy(policy="priority"))
    order = []
    running = 0
    while running is not None:
        out = launched(s.handle(Ended(task=running)))
        running = out[0] if out else None
        if running is not None:
            order.append(running)
    assert sorted(order) == list(range(1, 10))
    assert [t % 3 for t in order] == sorted((t % 3 for t in order), reverse=True)


def test_work_that_waited_for_its_inputs_does_not_bank_credit():
    """Client "a" queues ten computations whose inputs come from elsewhere (another island, a
    pending future); "b" runs ten meanwhile. "a" was not competing while its work waited, so
    once its inputs arrive it shares the device from the pass of what has run, alternating
    with "b" at equal weights; from its old pass, it ran its whole backlog back to back."""
    s = GangScheduler((0,), policy="share")
    b, a = ClientSpec("b"), ClientSpec("a")
    running = launched(s.handle(*(Submit(task=t, devices=(0,), client=b, cost_key="x",
                                         ready=True) for t in range(40))))
    s.handle(*(Submit(task=100 + t, devices=(0,), client=a, cost_key="x") for t in range(10)))
    for _ in range(10):
        running = launched(s.handle(Ended(task=running[0], seconds=1.0)))
    s.handle(*(Ready(task=100 + t) for t in range(10)))
    order = []
    for _ in range(10):
        order.append("a" if running[0] >= 100 else "b")
        running = launched(s.handle(Ended(task=running[0], seconds=1.0)))
    assert "".join(order) == "baba" * 2 + "ba", "".join(order)


def test_backfill_launches_what_fits_past_what_waits_for_memory_and_only_then():
    """Task 1 waits for memory (task 0's output holds it) and reserves device 0: task 2, which
    fits, waits behind it, and task 3 behind task 2's devices. A ``Backfill`` (the runtime's,
    once nothing runs anywhere) launches task 2 past task 1 but still not task 3, which shares
    a device with it; the next ordinary pass reserves for task 1 again."""
    s = GangScheduler((0, 1), memory_budget=100)
    assert launched(s.handle(Submit(task=0, devices=(0,), memory=80, ready=True))) == [0]
    s.handle(Ended(task=0))
    assert launched(s.handle(Submit(task=1, devices=(0,), memory=50, ready=True),
                             Submit(task=2, devices=(0,), memory=10, ready=True),
                             Submit(task=3, devices=(0, 1), memory=5, ready=True))) == []
    assert launched(s.handle(Backfill())) == [2]
    assert s.running == (2,) and s.queued == (1, 3)
    s.handle(Ended(task=2))
    assert launched(s.handle(Submit(task=4, devices=(0,), memory=5, ready=True))) == []
    assert launched(s.handle(MemoryFreed(device=0, nbytes=80))) == [1]


def test_a_client_gone_for_good_is_forgotten_once_its_work_ended():
    # A pool island's scheduler kept an account for every tenant that ever came, and each
    # scheduling pass read them all: thousands of attaches made every launch slow.
    s = GangScheduler(range(2), Policy.SHARE)
    gone, stays = ClientSpec("gone"), ClientSpec("stays")
    assert s.handle(Submit(task=0, devices=(0,), client=gone, cost_key="g", ready=True)) == [
        Launch(task=0)]
    s.handle(Forget(client="gone", cost_keys=("g",)))  # still running: its account stays
    assert set(s.shares()) == {"gone"}
    s.handle(Ended(task=0, seconds=1.0), Forget(client="gone", cost_keys=("g",)))
    assert s.shares() == {}
    # the client left schedules as before, alone or with another
    assert s.handle(Submit(task=1, devices=(0, 1), client=stays, cost_key="s", ready=True),
                    Submit(task=2, devices=(0, 1), client=stays, cost_key="s", ready=True,
                           after=(1,))) == [Launch(task=1), Launch(task=2)]
    s.handle(Ended(task=1, seconds=1.0), Ended(task=2, seconds=1.0))
    assert set(s.shares()) == {"stays"} and s.queued == () and s.running == ()


def test_busy_says_whether_work_is_in_flight_on_any_of_the_devices():
    s = GangScheduler(ALL)
    assert launched(s.handle(Submit(task=1, devices=(0, 1), ready=True))) == [1]
    assert s.busy((1, 2)) and not s.busy((2, 3))
    s.handle(Submit(task=2, devices=(2,), ready=False))  # queued, not launched: not busy
    assert not s.busy((2, 3))
    s.handle(Ended(task=1, seconds=0.0))
    assert not s.busy(ALL)

"""The deadlock demonstrator: without a gang scheduler, two programs with collectives on the
same chips deadlock when the chips receive them in different orders; the simulator names the
chips and computations that wait on each other. With gang scheduling the same workload runs.

Two hosts of one chip each. alice sits next to host 0 and 20 us further from host 1; bob the
other way round. Client work 1 + 1 per host, RPC 10, host executor 2 (microseconds).
"""

from __future__ import annotations

import pytest

import pwkernel as pw
from pwkernel.backends.sim import (
    Chip,
    Cluster,
    DeadlockError,
    HostCosts,
    Interconnect,
    Network,
    SimError,
    SimNode,
    SimProgram,
    Simulator,
)

US = 1e-6
FAR = {("alice", 1): 20 * US, ("bob", 0): 20 * US}


def cluster(hosts: int = 2) -> Cluster:
    return Cluster(Chip("toy", 1e12, 1e9, 1e11), (hosts,), 1, Interconnect(1e9, 1 * US),
                   Network(1e8, 5 * US), HostCosts(1 * US, 1 * US, 10 * US, 2 * US, 1e9))


def allreduce(name: str, collective: bool = True, then: tuple[int, ...] = ()) -> SimProgram:
    nodes = [SimNode(0, "allreduce", (0, 1), seconds=100 * US, collective=collective)]
    if then:
        nodes.append(SimNode(1, "post", then, (0,), seconds=10 * US))
    return SimProgram(name, nodes)


def simulate(gang: bool, collective: bool = True, delay=FAR, hosts: int = 2,
             then: tuple[int, ...] = ()) -> Simulator:
    sim = Simulator(cluster(hosts), gang=gang,
                    network_delay=lambda client, host: delay.get((client, host), 0.0))
    sim.submit(allreduce("p1", collective, then), client="alice")
    sim.submit(allreduce("p2", collective), client="bob")
    return sim


def spans(sim: Simulator) -> dict[str, tuple[float, float]]:
    return {e.program: (round(e.t_start / US, 6), round(e.t_end / US, 6))
            for e in sim.trace.events()}


def test_without_gang_scheduling_collectives_deadlock_and_the_cycle_is_named():
    sim = simulate(gang=False)
    with pytest.raises(DeadlockError) as info:
        sim.run()
    err = info.value
    assert isinstance(err, pw.PathwaysError) and isinstance(err, RuntimeError)
    d = err.deadlock
    # host 0 got p1 at 3+10 and p2 at 3+10+20; host 1 the other way round: chip 0 holds
    # p1 then p2, chip 1 p2 then p1, and each collective waits for the other chip.
    assert d.devices == (0, 1)
    assert d.computations == (("p1", "allreduce"), ("p2", "allreduce"))
    assert [(w.device, w.waits_for, w.reason, w.client) for w in d.cycle] == [
        (0, 1, "join", "alice"), (1, 0, "join", "bob")]
    assert d.time == pytest.approx(35 * US) and d.stuck == 2
    message = str(err)
    assert "chip 0 is in 'allreduce' (program 'p1', client 'alice')" in message
    assert "waits for chip 1 to join it" in message
    assert "Maybe you want gang=True" in message
    # it froze before anything ran: the trace holds only the frozen spans
    assert {e.status for e in sim.trace.events()} == {"deadlock"}


def test_the_same_workload_completes_with_gang_scheduling():
    sim = simulate(gang=True)
    assert sim.run() == pytest.approx(247 * US)
    # the island's scheduler (at host 0) puts p1 first on both chips: launched at 13, on the
    # hosts at 25; p2 reaches it at 33 and goes once p1's end is heard (135), hosts at 147.
    assert spans(sim) == {"p1": (25, 125), "p2": (147, 247)}


def test_the_trace_shows_where_each_chip_froze():
    sim = simulate(gang=False)
    with pytest.raises(DeadlockError) as info:
        sim.run()
    frozen = {(e.program, e.devices): (round(e.t_start / US, 6), round(e.t_end / US, 6))
              for e in sim.trace.events() if e.status == "deadlock"}
    # each host had its near client's program at 1 + 2 + 10 + 2 = 15 us; both chips stay in
    # it until the clock runs out of events
    end = round(info.value.deadlock.time / US, 6)
    assert frozen == {("p1", (0,)): (15, end), ("p2", (1,)): (15, end)}
    view = pw.ScheduleView(sim, live=False)
    try:
        shown = view.decoded()
        rows = zip(shown["program"], shown["device"], shown["status"], strict=True)
        assert sorted(rows) == [
            ("p1", 0, "deadlock"), ("p2", 1, "deadlock")]
    finally:
        view.close()


def test_without_collectives_each_chip_runs_its_own_shard_in_its_own_order():
    sim = simulate(gang=False, collective=False)
    assert sim.run() == pytest.approx(215 * US)
    # chip 0 runs p1 then p2, chip 1 p2 then p1, each shard when its host queued it (15)
    assert spans(sim) == {"p1": (15, 215), "p2": (15, 215)}


def test_without_gang_scheduling_a_consistent_order_is_luck_not_a_guarantee():
    sim = simulate(gang=False, delay={})
    sim.run()  # both hosts got p1 first: no deadlock this time
    assert spans(sim) == {"p1": (15, 115), "p2": (115, 215)}


def test_work_waiting_on_a_deadlocked_computation_is_counted_but_not_in_the_cycle():
    sim = simulate(gang=False, hosts=3, then=(2,))
    with pytest.raises(DeadlockError) as info:
        sim.run()
    d = info.value.deadlock
    assert d.devices == (0, 1) and d.stuck == 3


@pytest.mark.parametrize("bad", [-10 * US, float("nan"), float("inf")])
@pytest.mark.parametrize("gang", [True, False])
def test_a_network_delay_that_is_not_a_finite_duration_is_refused_naming_it(gang, bad):
    # a negative delay delivered alice's message before she sent it (the scheduler or the
    # host had it at once, rpc_latency early), a NaN broke the event heap's order, an
    # infinite one ended the run at t=inf; each ran without a word. With gang=True the
    # delay asked is to the scheduler, which sits with the island's first host (host 0).
    host = 0 if gang else 1
    sim = simulate(gang, delay={("alice", host): bad})
    with pytest.raises(SimError, match=rf"network_delay\('alice', {host}\) returned .*"
                                       r"expected the extra seconds .* a finite number >= 0"):
        sim.run()

"""One timing model (``backends/sim/timing.py``) under both simulators: the engine
(``Simulator``, plain graphs) and the simulated executor (``pw.Controller(backend="sim")``) give
the same program the same timeline, so a change to the model is made once."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends import sim
from pwkernel.backends.sim.timing import Timing

US = 1e-6
# Two islands of 2 hosts x 2 chips; every host-side cost non-zero and distinct, so a cost
# charged twice, or missed, by one simulator shows.
TWO = sim.Cluster(sim.Chip("test chip", 1e12, 1e9, 1e11), (2, 2), 2,
                  sim.Interconnect(1e10, 1e-6), sim.Network(1e9, 1e-5),
                  sim.HostCosts(client_per_node=10 * US, fanout_per_host=3 * US,
                                rpc_latency=100 * US, host_per_node=5 * US,
                                host_to_device=1e9, client_per_program=7 * US,
                                program_fanout_per_host=2 * US, scheduler_per_host=1 * US))


def both(dispatch: str) -> tuple[dict, dict]:
    """name -> (start, end) in us of an upload, two steps on island 0, a copy over DCN and a
    step on island 1: through the whole runtime, and through the engine (``from_graph``)."""
    with pw.Controller(backend="sim", cluster=TWO, dispatch=dispatch) as ctl:
        s0, s1 = ctl.slice(4, island=0), ctl.slice(4, island=1)
        a = pw.function(lambda x: x + 1, slice=s0, name="a", sim_cost=1e-3)
        b = pw.function(lambda x: x * 2, slice=s0, name="b", sim_cost=2e-3)
        c = pw.function(lambda x: x - 1, slice=s1, name="c", sim_cost=1e-3)

        @pw.program
        def f(v):
            return c(b(a(v)))

        x = np.zeros(1000, np.float32)
        graph = f.trace(x)
        assert f(x).wait(timeout=10)
        executor = {e.name: (e.t_start / US, e.t_end / US) for e in ctl.trace.events()}
    engine = sim.Simulator(TWO, dispatch=dispatch)
    engine.submit(sim.from_graph(graph, TWO, cost=lambda node: node.fn.sim_cost))
    engine.run()
    return executor, {e.name: (e.t_start / US, e.t_end / US) for e in engine.trace.events()}


# Worked out by hand. Parallel: the program (7 us + 2 us x 4 hosts), then each node's client
# work (10 us + 3 us per host); a's launch leaves the scheduler 2 x 1 us after it arrives,
# reaches its hosts 100 us later, 5 us there; b runs behind a; the copy (10 + 2 us) after b; c
# is launched once the copy has landed, 1 + 100 + 5 us later. Sequential: the client starts a
# node's work only when it hears that its inputs have ended, 100 us after each end, a copy's as
# a computation's: the upload (2 us) at 15 + 16 + 100 us, so a's work ends at 233 + 16 us, its
# launch reaches the scheduler 100 us later and its hosts 2 + 100 + 5 us after that; b's work
# starts at 1556 us, the copy's (10 + 3 x 4 us: it touches four hosts) at 3879 us, c's at
# 4113 us.
BY_HAND = {"parallel": {"a": (254.0, 1254.0), "c": (3373.0, 4373.0)},
           "sequential": {"host:host->0": (131.0, 133.0), "a": (456.0, 1456.0),
                          "b": (1779.0, 3779.0), "dcn:0->1": (4001.0, 4013.0),
                          "c": (4336.0, 5336.0)}}


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_both_simulators_give_the_same_timeline(dispatch):
    """One timeline in both dispatch modes: the controller hears of every end, a copy's as a
    computation's, ``rpc_latency`` after it (``docs/simulator.md``)."""
    executor, engine = both(dispatch)
    assert set(executor) == {"host:host->0", "a", "b", "dcn:0->1", "c"} == set(engine)
    for name, (start, end) in executor.items():
        assert engine[name] == (pytest.approx(start, abs=1e-6), pytest.approx(end, abs=1e-6))
    for name, span in BY_HAND[dispatch].items():
        assert executor[name] == pytest.approx(span), name


def test_a_shared_port_takes_one_copy_after_another_and_the_latency_overlaps():
    t = Timing(TWO)
    src, dst = t.devset((0, 1)), t.devset((2, 3))
    # 2e4 B over 2 lanes of 10 GB/s: the ports are busy 1 us, the copy takes 1 + 1 us
    assert t.claim("ici", 2e4, dst, src, 0.0) == pytest.approx((0.0, 2 * US))
    assert t.claim("ici", 2e4, dst, src, 0.0) == pytest.approx((1 * US, 2 * US))
    # another island's chips use other ports; a DCN copy holds its hosts' DCN ports
    assert t.claim("ici", 2e4, t.devset((6, 7)), t.devset((4, 5)), 0.0)[0] == 0.0
    start, seconds = t.claim("dcn", 1e3, t.devset((4,)), src, 0.0)
    assert (start, seconds) == pytest.approx((0.0, 10 * US + 1 * US))


def test_a_copy_between_gpu_nodes_of_one_island_crosses_infiniband_not_nvlink():
    # H100 nodes (NVIDIA's datasheet): NVLink 900 GB/s both ways (450 GB/s one way per GPU),
    # 8 x 400 Gb/s InfiniBand per node (50 GB/s per GPU); latencies assumed 2 us and 5 us.
    # A copy from node 0 to node 1 was timed over NVLink, 9x too fast.
    nbytes = 8 * 2**20 * 8  # 8 MiB per GPU
    t = Timing(sim.Cluster.preset("h100", chips=16))  # one island of two nodes
    inside = t.claim("ici", nbytes, t.devset(tuple(range(4, 8))), t.devset((0, 1, 2, 3)), 0.0)
    assert inside == pytest.approx((0.0, nbytes / 4 / 450e9 + 2 * US))
    node0, node1 = t.devset(tuple(range(8))), t.devset(tuple(range(8, 16)))
    across = t.claim("ici", nbytes, node1, node0, 0.0)
    assert across[1] == pytest.approx(nbytes / 8 / 50e9 + 5 * US)
    # the same through the whole runtime
    with pw.Controller(backend="sim", cluster=sim.Cluster.preset("h100", chips=16)) as ctl:
        a, b = ctl.slice(8), ctl.slice(8)
        assert {d.host for d in a.devices} != {d.host for d in b.devices}
        f = pw.function(lambda x: x * 2, slice=a, sim_cost=1e-3)
        g = pw.function(lambda x: x + 1, slice=b, sim_cost=1e-3)
        k = ctl.trace.next_index
        g(f(np.ones(nbytes // 4, np.float32))).wait()
        copy = next(e for e in ctl.trace.events(since=k) if e.link == "ici")
        assert copy.t_end - copy.t_start == pytest.approx(nbytes / 8 / 50e9 + 5 * US)


def test_the_clock_takes_events_in_time_then_creation_order_and_never_goes_back():
    t = Timing(TWO)
    seen = []
    t.at(2.0, seen.append, "late")
    t.at(1.0, seen.append, "first")
    t.at(1.0, seen.append, "second")
    t.now = 1.5
    t.at(1.5, seen.append, "now")
    times = []
    while t.heap:
        t.step()
        times.append(t.now)
    assert seen == ["first", "second", "now", "late"] and times == [1.5, 1.5, 1.5, 2.0]

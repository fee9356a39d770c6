"""The simulator's engine on tiny clusters, with timelines checked by hand.

The toy cluster has round numbers so each expected time can be worked out on paper (all in
microseconds): client 1 per node + 1 per host, RPC 10 one way, host executor 2 per computation,
ICI 1 GB/s per chip (latency 1), DCN 100 MB/s per host (latency 5), PCIe 1 GB/s.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from pwkernel.backends.sim import (
    Chip,
    Cluster,
    HostCosts,
    Interconnect,
    Network,
    NodeKind,
    SimError,
    SimNode,
    SimProgram,
    Simulator,
    abstract_mesh,
    estimate,
)
from pwkernel.backends.sim.scale import WORKLOADS, build, measure
from pwkernel.runtime.scheduler import GangScheduler
from pwkernel.runtime.trace import Event

US = 1e-6


def toy(islands=(1,), per_host: int = 2) -> Cluster:
    return Cluster(Chip("toy", 1e12, 1e9, 1e11), islands, per_host,
                   Interconnect(1e9, 1 * US), Network(1e8, 5 * US),
                   HostCosts(1 * US, 1 * US, 10 * US, 2 * US, 1e9))


def spans(sim: Simulator) -> dict[str, tuple[float, float, float]]:
    """name -> (t_submit, t_start, t_end) in microseconds."""
    return {e.name: tuple(round(t / US, 6) for t in (e.t_submit, e.t_start, e.t_end))
            for e in sim.trace.events()}


def chain() -> SimProgram:
    return SimProgram("chain", [SimNode(0, "a", (0, 1), seconds=100 * US),
                                SimNode(1, "b", (0, 1), (0,), 200 * US)])


def test_chain_with_parallel_dispatch_runs_ahead_of_the_data():
    sim = Simulator(toy())
    sim.submit(chain())
    assert sim.run() == pytest.approx(324 * US)
    # a: client 1+1 -> scheduler at 12, launched; hosts at 12+10+2 = 24; runs 100.
    # b: client done at 4 -> scheduler at 14; ready (a launched) -> launched at once,
    #    enqueued on its host at 26, starts when a ends (124), runs 200.
    assert spans(sim) == {"a": (12, 24, 124), "b": (14, 124, 324)}


def one(name: str, seconds: float, chips=(0, 1)) -> SimProgram:
    return SimProgram(name, [SimNode(0, name, chips, seconds=seconds)])


def test_a_program_after_another_is_launched_behind_it_without_waiting_for_its_end():
    sim = Simulator(toy())
    p1 = sim.submit(one("p1", 100 * US))
    sim.submit(one("p2", 200 * US), after=p1)
    assert sim.run() == pytest.approx(324 * US)
    # p2 reads p1's output: launched at 14 behind its in-flight producer, on its host at 26,
    # starts when p1 ends (124). Independent, it would wait for p1's Finished (134): on its
    # host at 146.
    assert spans(sim) == {"p1": (12, 24, 124), "p2": (14, 124, 324)}
    alone = Simulator(toy())
    alone.submit(one("p1", 100 * US))
    alone.submit(one("p2", 200 * US))
    alone.run()
    assert spans(alone)["p2"] == (14, 146, 346)
    with pytest.raises(SimError, match="has not started"):
        sim.submit(one("p3", 1 * US), after=p1)


def test_nodes_given_as_lists_run_and_programs_that_could_never_end_are_refused():
    # devices as a list was "unhashable type: 'list'" from inside submit; it runs as a tuple
    sim = Simulator(toy())
    sim.submit(SimProgram("chain", [SimNode(0, "a", [0, 1], seconds=100 * US),
                                    SimNode(1, "b", range(2), [0], 200 * US)]))
    assert sim.run() == pytest.approx(324 * US)
    assert spans(sim) == {"a": (12, 24, 124), "b": (14, 124, 324)}  # chain()'s timeline
    with pytest.raises(SimError, match=r"devices must be a sequence of ints .* got 3"):
        SimNode(0, "a", 3)
    with pytest.raises(SimError, match=r"node 0 \(a\) has seconds='1', a str; expected a "
                                       r"number, e.g. seconds=1e-3"):
        SimProgram("p", [SimNode(0, "a", (0,), seconds="1")])
    # a program with no nodes never ended (t_done stayed None), and after= it was IndexError
    with pytest.raises(SimError, match="program 'nothing' has no nodes"):
        SimProgram("nothing", [])
    # after= a run of another simulator was taken, and the program never ended
    other = Simulator(toy()).submit(one("p1", 100 * US))
    fresh = Simulator(toy())
    with pytest.raises(SimError, match="a SimRun this simulator's submit returned"):
        fresh.submit(one("p2", 100 * US), after=other)
    assert fresh.runs == [] and fresh.run() == 0.0


def test_per_program_client_costs_come_before_the_programs_nodes():
    sim = Simulator(toy().with_host(client_per_program=5 * US, program_fanout_per_host=3 * US))
    sim.submit(chain())
    sim.run()
    # the program: 5 + 3 x 1 host = 8; then a: 8 + 2 -> scheduler 20, host 32, ends 132;
    # b: client done at 12, scheduler 22, starts when a ends.
    assert spans(sim) == {"a": (20, 32, 132), "b": (22, 132, 332)}


def test_the_scheduler_sends_each_launch_to_each_host_one_after_another():
    sim = Simulator(toy(islands=(2,)).with_host(scheduler_per_host=3 * US))
    chips = (0, 1, 2, 3)  # two hosts
    sim.submit(SimProgram("chain", [SimNode(0, "a", chips, seconds=1 * US),
                                    SimNode(1, "b", chips, (0,), 1 * US)]))
    sim.run()
    # a: client 1 + 1 x 2 hosts -> scheduler at 13; its thread sends 2 launches (3 each):
    #    gone at 19, hosts at 29, enqueued at 31, runs to 32.
    # b: client done at 6 -> scheduler at 16, launched behind a, but the thread is busy
    #    until 19: gone at 25, hosts at 35, enqueued at 37 (without the cost: 28).
    assert spans(sim) == {"a": (13, 31, 32), "b": (16, 37, 38)}
    multi = Simulator(toy(islands=(2,)).with_host(scheduler_per_host=3 * US),
                      controller="multi")  # no scheduler: no such cost
    multi.submit(one("c", 1 * US, chips))
    multi.run()
    assert spans(multi)["c"][1] == 3


def test_a_simulation_of_its_own_keeps_every_event_it_counts():
    # (a controller's trace keeps its newest million; a simulated run is counted from its
    # events, so one past a million computations must not lose its first ones)
    sim = Simulator(Cluster.preset("tpu-v4", chips=8))
    assert sim.trace.capacity is None


def test_multi_controller_hosts_dispatch_their_own_chips_with_no_client_hop():
    sim = Simulator(toy(islands=(2,)), controller="multi")  # chips 0, 1 on host 0; 2, 3 on 1
    chips = (0, 1, 2, 3)
    sim.submit(SimProgram("spmd", [SimNode(0, "a", chips, seconds=100 * US, collective=True),
                                   SimNode(1, "b", chips, (0,), 100 * US, collective=True)]))
    assert sim.run() == pytest.approx(203 * US)
    # each host: its own dispatch 1, its executor 2: a on the chips at 3 (no RPC, no
    # scheduler); b dispatched at 2, enqueued at 5 behind a, starts when a ends.
    assert spans(sim) == {"a": (3, 3, 103), "b": (5, 103, 203)}
    with pytest.raises(SimError, match="controller must be"):
        Simulator(toy(), controller="many")


def test_sequential_dispatch_prepares_a_node_after_its_inputs_exist():
    sim = Simulator(toy(), dispatch="sequential")
    sim.submit(chain())
    assert sim.run() == pytest.approx(358 * US)
    # b: the client hears of a's end at 134, works 2, the scheduler has it at 146, the host
    # at 158: the 34 us gap is the round trip parallel dispatch hides.
    assert spans(sim) == {"a": (12, 24, 124), "b": (146, 158, 358)}


def test_a_gang_waits_for_all_its_chips_and_nothing_jumps_ahead_of_it():
    sim = Simulator(toy(islands=(2,)))  # chips 0, 1 on host 0; 2, 3 on host 1
    sim.submit(SimProgram("pa", [SimNode(0, "a", (0, 1), seconds=100 * US)]), client="alice")
    sim.submit(SimProgram("pg", [SimNode(0, "g", (0, 1, 2, 3), seconds=50 * US)]),
               client="bob")
    sim.submit(SimProgram("pc", [SimNode(0, "c", (2, 3), seconds=30 * US)]), client="carol",
               at=5 * US)
    assert sim.run() == pytest.approx(248 * US)
    # g (2 hosts: client 1+2, scheduler at 13) needs chips 0, 1, busy with a: it waits and
    # reserves chips 2, 3, so c (scheduler at 17) may not take them although they are idle.
    # a's end reaches the scheduler at 134: g launched, on both hosts at 146, runs 50;
    # its end reaches the scheduler at 206: c launched, on host 1 at 218.
    assert spans(sim) == {"a": (12, 24, 124), "g": (13, 146, 196), "c": (17, 218, 248)}


def test_transfers_over_dcn_take_the_link_model_time_one_after_another():
    sim = Simulator(toy(islands=(1, 1)))  # island 0: chips 0, 1; island 1: chips 2, 3
    mb = 10**6
    sim.submit(SimProgram("dcn", [
        SimNode(0, "a", (0, 1), seconds=100 * US),
        SimNode(1, "x", (2, 3), (0,), kind=NodeKind.TRANSFER, nbytes=mb, src_devices=(0, 1)),
        SimNode(2, "y", (2, 3), (0,), kind=NodeKind.TRANSFER, nbytes=mb, src_devices=(0, 1)),
        SimNode(3, "b", (2, 3), (1, 2), seconds=40 * US)]))
    assert sim.run() == pytest.approx(20181 * US)
    # x: 1 MB over one host's 100 MB/s = 10000 + latency 5, from a's end at 124.
    # y: same link, starts when x's bytes are through (10124).
    # b: ready when both landed (20129); on host 2 at 20129+10+2.
    assert spans(sim) == {"a": (12, 24, 124), "x": (15, 124, 10129),
                          "y": (18, 10124, 20129), "b": (20, 20141, 20181)}
    moved = {e.name: e for e in sim.trace.events() if e.kind == "transfer"}
    assert moved["x"].link == "dcn" and (moved["x"].src, moved["x"].dst) == (0, 1)
    assert moved["x"].src_devices == (0, 1) and moved["x"].nbytes == mb


def test_transfers_inside_an_island_and_from_the_host():
    sim = Simulator(toy(islands=(2,)))
    kb = 10**5
    sim.submit(SimProgram("ici", [
        SimNode(0, "in", (0, 1), kind=NodeKind.TRANSFER, nbytes=kb),
        SimNode(1, "a", (0, 1), (0,), 10 * US),
        SimNode(2, "move", (2, 3), (1,), kind=NodeKind.TRANSFER, nbytes=kb, src_devices=(0, 1))]))
    sim.run()
    # in: client 1+1, issued at 12; 100 kB over host 0's PCIe (1 GB/s) = 100.
    # a: scheduler at 14, ready once 'in' is issued (12); on host 0 at 26; runs from 112.
    # move: 2 chips send to 2 chips over ICI: 50 kB each at 1 GB/s = 50, + 1 latency.
    assert spans(sim) == {"in": (12, 12, 112), "a": (14, 112, 122), "move": (17, 122, 173)}
    assert {e.name: e.link for e in sim.trace.events()} == {"in": "host", "a": None,
                                                            "move": "ici"}


def test_a_collective_from_xla_runs_for_its_estimated_time():
    cluster = toy()
    mesh = abstract_mesh((2,), ("x",))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    def allreduce(v):  # f32[1024] on each chip: 4096 bytes
        return jax.lax.psum(v, "x")

    cost = estimate(allreduce, jax.ShapeDtypeStruct((2048,), jnp.float32), cluster=cluster,
                    mesh=mesh, in_specs=P("x"))
    # a ring of 2 chips: 2 * (1/2 * 4096 B / 1 GB/s + 1 step of 1 us)
    assert cost.collective_seconds == pytest.approx(2 * (2048e-9 + 1 * US))
    sim = Simulator(cluster)
    sim.submit(SimProgram("ar", [SimNode(0, "allreduce", (0, 1), seconds=cost.seconds,
                                         collective=cost.has_collectives)]))
    sim.run()
    assert spans(sim)["allreduce"] == (12, 24, round(24 + cost.seconds / US, 6))


def test_share_policy_gives_device_time_in_proportion_to_weight():
    sim = Simulator(toy(), policy="share")
    step = SimProgram("step", [SimNode(0, "step", (0, 1), seconds=100 * US)])
    for _ in range(40):
        sim.submit(step, client="alice", weight=1)
        sim.submit(step, client="bob", weight=3)
    sim.run()
    order = "".join(e.client[0] for e in sorted(sim.trace.events(), key=lambda e: e.t_start))
    # the real GangScheduler's stride scheduling: one of alice's per three of bob's
    assert order[:40] == "abbb" * 10
    fifo = Simulator(toy(), policy="fifo")
    for _ in range(4):
        fifo.submit(step, client="alice")
        fifo.submit(step, client="bob")
    fifo.run()
    assert [e.client for e in fifo.trace.events()] == ["alice", "bob"] * 4


def test_the_engine_drives_the_runtimes_own_gang_scheduler():
    sim = Simulator(toy(islands=(1, 1)), policy="priority")
    assert len(sim.schedulers) == 2
    for island, s in sim.schedulers.items():
        assert type(s) is GangScheduler  # the runtime's class itself, not a copy
        assert s.devices == sim.cluster.island_devices(island)
        assert s.policy == "priority"
    sim.submit(chain())
    sim.run()
    assert sim.schedulers[0].shares() == {"default": 1.0}  # it saw the computations end
    assert sim.schedulers[0].running == ()


def test_trace_uses_the_runtimes_event_schema_and_the_views_can_read_it():
    from pwkernel.viz.columns import DeviceLayout
    from pwkernel.viz.encoding import Codebook, compute_arrays, transfer_arrays

    cluster = toy(islands=(1, 1))
    sim = Simulator(cluster)
    sim.submit(SimProgram("p", [
        SimNode(0, "a", (0, 1), seconds=10 * US),
        SimNode(1, "t", (2, 3), (0,), kind=NodeKind.TRANSFER, nbytes=1000, src_devices=(0, 1)),
        SimNode(2, "b", (2, 3), (1,), seconds=10 * US)]), client="alice")
    sim.run()
    events = sim.trace.events()
    assert all(isinstance(e, Event) for e in events)
    assert [e.index for e in events] == [0, 1, 2]
    assert {(e.kind, e.program, e.client, e.status) for e in events} == {
        ("compute", "p", "alice", "ok"), ("transfer", "p", "alice", "ok")}
    layout = DeviceLayout.from_islands((i, cluster.island_devices(i)) for i in range(2))
    bars = compute_arrays([e for e in events if e.kind == "compute"], layout, 0.0, Codebook())
    strips = transfer_arrays([e for e in events if e.kind == "transfer"], layout, 0.0,
                             Codebook())
    assert len(bars["device"]) == 4 and len(strips["device"]) == 2
    assert sim.trace.to_chrome()["traceEvents"]


def test_runs_report_their_times_and_bad_input_is_refused_clearly():
    sim = Simulator(toy())
    run = sim.submit(chain(), at=50 * US)
    sim.run()
    assert run.t_submit == pytest.approx(50 * US) and run.duration == pytest.approx(324 * US)
    with pytest.raises(SimError, match="chips 0..1"):
        sim.submit(SimProgram("far", [SimNode(0, "x", (5,), seconds=1.0)]))
    with pytest.raises(SimError, match="clock is already at"):
        sim.submit(chain(), at=0.0)
    with pytest.raises(SimError, match="topological order"):
        SimProgram("bad", [SimNode(0, "x", (0,), (1,)), SimNode(1, "y", (0,))])
    with pytest.raises(SimError, match="spans islands"):
        Simulator(toy(islands=(1, 1))).submit(SimProgram("w", [SimNode(0, "x", (1, 2))]))
    with pytest.raises(SimError, match="needs a Cluster"):
        Simulator("tpu-v4")
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        Simulator(toy(), dispatch="eager")


def test_submit_refuses_what_the_scheduler_or_clock_would_trip_over_mid_run():
    # each was taken: a priority 'hi' raised a bare TypeError from inside run(), at=NaN gave
    # a run submitted at NaN, an infinite duration an infinite clock, weight 0 a share of 0
    sim = Simulator(toy(), policy="priority")
    for bad, match in [(dict(weight=0), "weight must be a finite number > 0"),
                       (dict(weight=-1.0), "weight must be"),
                       (dict(weight=float("inf")), "weight must be"),
                       (dict(priority="hi"), "priority must be an int"),
                       (dict(priority=1.5), "priority must be an int"),
                       (dict(client=None), "client must be a non-empty string"),
                       (dict(at=float("nan")), "at must be a finite time"),
                       (dict(at=float("inf")), "at must be a finite time"),
                       (dict(at="1"), "at must be a finite time")]:
        with pytest.raises(SimError, match=match):
            sim.submit(chain(), **bad)
    with pytest.raises(SimError, match="seconds=inf; expected a finite duration"):
        SimProgram("forever", [SimNode(0, "x", (0,), seconds=float("inf"))])
    for nbytes in (-1e9, float("nan")):  # a negative copy freed its ports back in time
        with pytest.raises(SimError, match="nbytes=.*expected a finite number of bytes"):
            SimProgram("up", [SimNode(0, "x", (0,), kind=NodeKind.TRANSFER, nbytes=nbytes)])
    assert sim.runs == [] and sim.run() == 0.0  # nothing half-submitted
    sim.submit(chain(), client="alice", weight=2, priority=1)
    assert sim.run() == pytest.approx(324 * US)


def test_run_until_never_moves_the_clock_back():
    sim = Simulator(toy())
    sim.submit(chain())
    sim.run(until=100 * US)  # a's end (the hand timeline: 24..124 us) is still ahead
    assert sim.now == pytest.approx(100 * US)
    for earlier in (50 * US, float("nan")):
        with pytest.raises(SimError, match="before the clock, already at"):
            sim.run(until=earlier)
    assert sim.now == pytest.approx(100 * US)
    with pytest.raises(SimError, match="clock is already at"):
        sim.submit(chain(), at=60 * US)  # (it was allowed after the clock went back to 50)
    assert sim.run() == pytest.approx(324 * US)


def test_a_transfer_larger_than_its_chips_hbm_is_refused():
    # the toy chip has 1 GB of HBM: 3 GB onto two chips is at least 1.5 GB on one of them
    sim = Simulator(toy())
    big = SimProgram("big", [SimNode(0, "upload", (0, 1), kind=NodeKind.TRANSFER,
                                     nbytes=3_000_000_000)])
    with pytest.raises(SimError, match=r"program 'big': 'upload' moves 2.8 GiB onto 2 chips, "
                                       r"at least 1.4 GiB on each, more than Chip.hbm_bytes "
                                       r"\(valid: at most 1000000000 B") as info:
        sim.submit(big)
    assert "\n" not in str(info.value)
    fits = SimProgram("fits", [SimNode(0, "upload", (0, 1), kind=NodeKind.TRANSFER,
                                       nbytes=2_000_000_000)])
    sim.submit(fits)  # 1 GB each, sharded: fits
    sim.run()


def test_the_same_inputs_give_the_same_timeline():
    def once():
        sim = Simulator(toy(islands=(2,)), policy="share")
        for i in range(20):
            sim.submit(chain(), client=f"c{i % 3}", weight=1 + i % 3)
        sim.run()
        return sim.trace.rows()

    assert once() == once()


def test_scale_benchmark_runs_both_workloads():
    """The 2048-chip benchmark (``python -m pwkernel.backends.sim.scale``), run small: its
    timing is a benchmark figure, not asserted here."""
    for workload in WORKLOADS:
        row = measure(workload, computations=300)
        assert row["chips"] == 2048
        assert row["computations"] >= 256 and row["virtual_seconds"] > 0


def test_the_scale_command_refuses_no_computations(capsys):
    from pwkernel.backends.sim.scale import main

    for n in ("0", "-5"):  # ran nothing and printed rows of 0 computations as a result
        with pytest.raises(SystemExit):
            main(["--computations", n])
        assert "--computations must be at least 1" in capsys.readouterr().err


def test_the_scale_command_names_itself_and_prints_what_its_help_says(capsys):
    """Its usage names the command docs/simulator.md gives (it said ``scale.py``), and
    ``--json`` prints what its help says: a JSON list, one object per workload."""
    import json

    from pwkernel.backends.sim.scale import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m pwkernel.backends.sim.scale"), text
    assert "a JSON list" in " ".join(text.split()), text
    main(["--json", "--computations", "20", "--workload", "spmd", "--workload", "opbyop"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["workload"] for r in rows] == ["spmd", "opbyop"]


#: the 2048-chip scale workloads, 300 computations each: (when the last node ended, trace
#: rows, SHA-256 of the rows). A change that only makes the engine faster must leave these
#: exactly as they are; a deliberate change of the model updates them (and says so). Last
#: change: not the model's, the rows gained the trace's ``tenant`` field at their end (the
#: rows without it still hash to the previous pins, 742cb0e5..., da8ca356..., 94ae95bd...).
PINNED = {
    "spmd": (1.50268999999999, 300,
             "e4d01867a625356b2ba13b251db48291b91d7a5e0b8b8c788b3fd196a98c3314"),
    "pipelines": (0.07344976266666671, 496,
                  "df24501fdd08cdcd9bde7c4a49802c82480a33d54ae915f6c60fd1bf85b3ae80"),
    "opbyop": (1.5355800000000126, 300,
               "54ea599d551c708b8b5c846cc5435e39bec5ec9c50b4840cf15ad2c3b9dff6e2"),
}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_scale_workloads_timelines_are_pinned(workload):
    import hashlib

    sim = build(workload, 300)
    end = sim.run()
    rows = sim.trace.rows()
    digest = hashlib.sha256(repr(rows).encode()).hexdigest()
    assert (end, len(rows), digest) == PINNED[workload]


@pytest.mark.parametrize("depth", [0, -1, 2.5, True])
def test_a_depth_that_launches_nothing_ahead_is_refused_with_the_fix(depth):
    # depth=0 and -1 ran as depth=1 without a word
    with pytest.raises(SimError, match=r"depth must be an int >= 1 .* got "):
        Simulator(toy(), depth=depth)
    sim = Simulator(toy(), depth=1)
    sim.submit(chain())
    assert sim.run() > 0

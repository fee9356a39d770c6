"""``pw.Controller(backend="sim")``: the whole runtime (tracing, plans, dispatch, the real gang
schedulers, futures, trace, views) on a simulated cluster, on a virtual clock.

Timelines are checked against times worked out by hand from the cluster's parameters (the
module docstring of ``pwkernel/backends/sim/executor.py`` has the model)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.backends import sim
from pwkernel.bench.figure2 import INPUT, figure2
from pwkernel.runtime import scheduler as sch
from pwkernel.runtime.graph import ComputeNode

US = 1e-6
# One island of 2 hosts x 2 chips, with round numbers for every host-side cost.
TINY = sim.Cluster(sim.Chip("test chip", 1e12, 1e9, 1e11), (2,), 2, sim.Interconnect(1e10, 1e-6),
                   sim.Network(1e9, 1e-5),
                   sim.HostCosts(client_per_node=10 * US, fanout_per_host=0.0,
                                 rpc_latency=100 * US, host_per_node=5 * US,
                                 host_to_device=1e9))


def spans(ctl) -> dict[str, tuple[float, float]]:
    """name -> (start, end) in microseconds, rounded to 1 ns."""
    return {e.name: (round(e.t_start / US, 3), round(e.t_end / US, 3))
            for e in ctl.trace.events()}


def chain(ctl, dispatch="parallel"):
    s = ctl.slice(4)
    a = pw.function(lambda x: x + 1, slice=s, name="a", sim_cost=1e-3)
    b = pw.function(lambda x: x * 2, slice=s, name="b", sim_cost=1e-3)

    @pw.program
    def two(v):
        return b(a(v))

    return two(np.zeros(1000, np.float32), dispatch=dispatch)  # 4000 bytes, from the host


def test_a_chain_runs_on_the_hand_worked_timeline():
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        out = chain(ctl)
        assert out.wait(timeout=10)
        # client: the upload's host-side work ends at 10 us, a's at 20, b's at 30; each
        # reaches the scheduler 100 us later. The upload holds both hosts' PCIe for 2000 B /
        # 1 GB/s = 2 us. a reaches its hosts 100 us after its launch decision (at 120 us)
        # and takes 5 us there; b (launched ahead, behind a) waits for a on the chips.
        assert spans(ctl) == {"host:host->0": (110.0, 112.0), "a": (225.0, 1225.0),
                              "b": (1225.0, 2225.0)}
        assert out.t_done == pytest.approx(2225 * US)
        assert ctl.executor.now() == pytest.approx(2325 * US)  # b's end reached the scheduler


def test_the_scheduler_sends_each_launch_to_each_host_in_turn():
    with pw.Controller(backend="sim", cluster=TINY.with_host(scheduler_per_host=7 * US)) as ctl:
        chain(ctl).wait(timeout=10)
        # a's launch leaves the scheduler after 2 hosts x 7 us (at 134 us), b's after a's
        # (at 148 us); each reaches its hosts 100 us later and takes 5 us there
        assert spans(ctl) == {"host:host->0": (110.0, 112.0), "a": (239.0, 1239.0),
                              "b": (1239.0, 2239.0)}


def test_a_copy_over_dcn_lands_before_its_consumer_is_launched():
    two = sim.Cluster(TINY.chip, (1, 1), 2, TINY.ici, sim.Network(1e9, 10 * US), TINY.host)
    with pw.Controller(backend="sim", cluster=two) as ctl:
        a = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=0), name="a", sim_cost=1e-3)
        b = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1), name="b", sim_cost=1e-3)

        @pw.program
        def across(v):
            return b(a(v))

        across(np.zeros(1000, np.float32)).wait(timeout=10)
        # 4000 B: 4 us of one host's PCIe, then 10 us + 4 us over DCN once a has ended;
        # b is launched only when the copy has landed (at 1239 us), 100 us to its host + 5
        assert spans(ctl) == {"host:host->0": (110.0, 114.0), "a": (225.0, 1225.0),
                              "dcn:0->1": (1225.0, 1239.0), "b": (1344.0, 2344.0)}


def test_a_collective_costs_its_ring_on_the_interconnect():
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        total = jax.shard_map(lambda b: jax.lax.psum(b, "x"), in_specs=P("x"), out_specs=P())
        f = pw.function(total, slice=ctl.slice(4), in_specs=P("x"), out_specs=P(), name="psum")
        f(np.ones(4096, np.float32)).wait(timeout=10)
        start, end = spans(ctl)["psum"]
        # an all-reduce of 4 KiB per chip over 4 chips on a switch: two rounds of 3/4 of the
        # bytes at 10 GB/s and 3 steps of 1 us; plus 8 KiB of memory traffic at 100 GB/s
        ring = 2 * (0.75 * 4096 / 1e10 + 3 * 1e-6)
        assert (end - start) * US == pytest.approx(ring + 8192 / 1e11, abs=1e-9)


def test_sequential_dispatch_pays_a_round_trip_per_node():
    with pw.Controller(backend="sim", cluster=TINY.with_host(client_per_program=50 * US)) as ctl:
        chain(ctl, dispatch="sequential").wait(timeout=10)
        # 50 us for the program, then the client starts a node's work only once it has heard
        # its inputs have ended, 100 us after each end (a copy's as a computation's): a at
        # 262 us (the upload's end + 100 us), b at 1577 us (a's end + 100 us)
        assert spans(ctl) == {"host:host->0": (160.0, 162.0), "a": (477.0, 1477.0),
                              "b": (1792.0, 2792.0)}


def test_a_sequential_node_that_waits_for_chips_is_timed_as_the_engine_times_it():
    """Under sequential dispatch the client works on a node when its inputs exist (here at
    once), not when the scheduler launches it after the chips free up: the controller and the
    engine give the same timeline (b: a's end 1140 us, heard 50 us later, sent to the hosts
    50 + 10 us after that)."""
    cluster = sim.Cluster.preset("tpu-v4", chips=8)
    with pw.Controller(backend="sim", cluster=cluster, dispatch="sequential") as ctl:
        f = pw.function(lambda: jnp.ones(8), slice=ctl.slice(8), sim_cost=1e-3, name="f")
        f()
        f().wait(timeout=10)
        seen = [(round(e.t_start * 1e6, 1), round(e.t_end * 1e6, 1))
                for e in ctl.trace.events() if e.kind == "compute"]
    engine = sim.Simulator(cluster, policy="fifo", dispatch="sequential")
    for name in ("a", "b"):
        engine.submit(sim.SimProgram(name, [sim.SimNode(0, "f", cluster.island_devices(0), (),
                                                        1e-3)]))
    engine.run()
    want = [(round(e.t_start * 1e6, 1), round(e.t_end * 1e6, 1))
            for e in engine.trace.events() if e.kind == "compute"]
    assert seen == want == [(140.0, 1140.0), (1250.0, 2250.0)]


def test_futures_have_shapes_shardings_and_times_but_no_values():
    with pw.Controller(backend="sim") as ctl:  # default: TPU v4, two islands of 4 chips
        assert [len(i.devices) for i in ctl.islands] == [4, 4] and ctl.backend == "sim"
        s = ctl.slice(4, island=1)
        f = pw.function(lambda x, w: x @ w, slice=s, in_specs=(P("x"), P()))
        y = f(np.ones((4096, 4096), jnp.bfloat16), np.ones((4096, 4096), jnp.bfloat16))
        assert (y.shape, y.dtype) == ((4096, 4096), jnp.bfloat16)
        assert y.sharding.is_equivalent_to(NamedSharding(s.mesh, P("x")), 2)  # as JAX types it
        assert sorted(d.id for d in y.sharding.device_set) == list(ctl.islands[1].device_ids)
        with pytest.raises(pw.NoValueError, match=r"shape \(4096, 4096\).*no value"):
            y.result()
        assert y.done() and y.t_done > 0  # waiting moved the clock to its end
        compute = [e for e in ctl.trace.events() if e.kind == "compute"]
        assert compute[0].t_end == y.t_done
        # XLA's cost analysis on the TPU v4 roofline: 2 x 4096^3 flops over 4 chips at
        # 275 TFLOP/s (compute-bound: ~48 MB per chip at 1.2 TB/s is 40 us), plus 2 us
        assert compute[0].t_end - compute[0].t_start == pytest.approx(
            2 * 4096**3 / 4 / 275e12 + 2e-6, rel=0.02)
        # the memory it holds is JAX's shard bytes on the simulated chips
        assert ctl.memory()[ctl.islands[1].devices[0]] == 4096 // 4 * 4096 * 2
        # jax.jit's in_shardings/out_shardings over the simulated chips' mesh
        g = pw.function(lambda x: x * 2, slice=s, in_shardings=NamedSharding(s.mesh, P("x")),
                        out_shardings=NamedSharding(s.mesh, P()))
        z = g(np.ones((8, 4), np.float32))
        assert z.sharding.is_equivalent_to(NamedSharding(s.mesh, P()), 2)


def test_a_simulated_future_answers_what_its_shape_dtype_and_sharding_tell():
    # nbytes, itemsize and is_fully_replicated waited for the value: NoValueError here
    def fn(x):
        return x.astype(jnp.bfloat16), jax.random.split(jax.random.key(0), 3), x.sum()

    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        f = pw.function(fn, slice=ctl.slice(4), in_specs=P("x"), out_specs=(P("x"), P(), P()),
                        sim_cost=1e-3)
        outs = f(np.ones((8, 2), np.float32))
        for fut, real in zip(outs, fn(np.ones((8, 2), np.float32)), strict=True):
            assert (fut.nbytes, fut.itemsize) == (real.nbytes, real.itemsize)
        assert [fut.is_fully_replicated for fut in outs] == [False, True, True]
        assert not any(fut.done() for fut in outs)  # none of it waited for the clock


def test_a_simulated_future_given_to_another_controller_says_what_to_pass():
    # the error said "pass fut.result()", which raises NoValueError for a simulated future
    with pw.Controller(backend="sim", cluster=TINY) as one, \
            pw.Controller(backend="sim", cluster=TINY) as other:
        f = pw.function(lambda x: x * 2, slice=one.slice(4), sim_cost=1e-3)
        g = pw.function(lambda x: x + 1, slice=other.slice(4), sim_cost=1e-3)
        y = f(np.ones((8, 2), np.float32))
        with pytest.raises(pw.ProgramError, match=r"a simulated one.*no value to move across"
                                                  r".*np.zeros\(\(8, 2\), 'float32'\)"):
            g(y)
        assert g(np.zeros(y.shape, y.dtype)).shape == (8, 2)  # what it says works


def test_a_host_callback_on_simulated_chips_asks_for_its_duration():
    # (was XLA's "the platform for the specified backend cpu is different from the lowering
    # platform tpu", which named no callback)
    def noisy(x):
        jax.debug.print("sum {}", x.sum())
        return x * 2

    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        f = pw.function(noisy, slice=ctl.slice(2))
        with pytest.raises(pw.ProgramError, match=r"noisy calls the host \(jax.debug.print\).*"
                                                  r"sim_cost=seconds"):
            f(np.ones(8, np.float32))
        timed = pw.function(noisy, slice=ctl.slice(2), sim_cost=1e-3)  # what it says works
        assert timed(np.ones(8, np.float32)).exception(timeout=30) is None


def test_donation_errors_are_those_of_a_real_backend():
    """A simulated program that would fail for real fails on the simulator too: reading a
    value an earlier call donated, and donating a value the same call also reads."""
    with pw.Controller(backend="sim") as ctl:
        s = ctl.slice(2)
        step = pw.function(lambda x: x * 2, slice=s, donate_argnums=0, sim_cost=1e-3)
        both = pw.function(lambda x, y: x + y, slice=s, donate_argnums=0, sim_cost=1e-3)
        a = step(np.ones(4, np.float32))
        b = step(a)
        again = step(a)
        for fut, match in ((again, "given to an earlier call that donates it"),
                           (both(b, b), "donates input 0 and also reads")):
            error = fut.exception(timeout=30)
            assert isinstance(error, RuntimeError) and isinstance(error, pw.ProgramError)
            assert error is not None and match in str(error), error
        assert step(b).exception(timeout=30) is None  # the newest value carries on


def test_a_real_array_is_uploaded_to_simulated_chips():
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        f = pw.function(lambda x: x * 2, slice=ctl.slice(4), name="double")
        f(jnp.ones(8)).wait(timeout=10)   # on this process's CPU device 0, not on chip 0
        assert [e.name for e in ctl.trace.events()] == ["host:host->0", "double"]


def test_a_typed_key_is_lowered_and_timed_like_any_array():
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        s = ctl.slice(2)
        split = pw.function(lambda k: tuple(jax.random.split(k)), slice=s, name="split")
        draw = pw.function(lambda k: jax.random.normal(k, (1024,)), slice=s, name="draw")
        key, sub = split(jax.random.key(0))
        x = draw(sub)
        assert x.wait(timeout=10) and key.wait(timeout=10)
        assert key.dtype == jax.random.key(0).dtype and x.shape == (1024,)
        assert [e.name for e in ctl.trace.events() if e.kind == "compute"] == ["split", "draw"]


def test_a_program_whose_values_do_not_fit_a_chips_hbm_is_refused():
    # TINY's chips have 1 GB of HBM. A 4 GiB value replicated on 4 chips is 4 GiB on each
    # (it used to "run"); a 1 GiB one sharded over the 4 is 256 MiB each and fits.
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        s = ctl.slice(4)
        big = pw.function(lambda x: jnp.zeros((1 << 30,), jnp.float32) + x.sum(), slice=s,
                          in_specs=P(), out_specs=P(), name="big", sim_cost=1e-3)
        with pytest.raises(sim.SimError) as info:
            big(np.zeros(4, np.float32))
        text = str(info.value)
        assert "'big'" in text and "4.0 GiB on chip 0" in text, text
        assert "Chip.hbm_bytes" in text and "at most 1000000000 B" in text, text
        assert "\n" not in text
        assert not ctl.trace.events() and not ctl.runs()  # refused before anything ran
        sharded = pw.function(lambda x: jnp.zeros((1 << 28,), jnp.float32) + x.sum(), slice=s,
                              in_specs=P(), out_specs=P("x"), name="sharded", sim_cost=1e-3)
        fits = sharded(np.zeros(4, np.float32))  # 256 MiB each: fits
        assert fits.exception(timeout=10) is None and not ctl.runs()
        assert [e.name for e in ctl.trace.events() if e.kind == "compute"] == ["sharded"]
        assert {ctl.memory()[d] for d in s.devices} == {1 << 28}  # its quarter on each chip
        ran = len(ctl.trace.events())
        # an argument too large to upload is refused the same way, before anything runs:
        # 2 GiB (one float32 broadcast: nothing is allocated), replicated on each chip
        copy = pw.function(lambda x: x.sum(), slice=s, in_specs=P(), out_specs=P(), name="copy",
                           sim_cost=1e-3)
        with pytest.raises(sim.SimError, match=r"'host:host->0' puts 2.0 GiB on chip 0, "
                                               r"more than its Chip.hbm_bytes"):
            copy(np.broadcast_to(np.float32(0), (1 << 29,)))
        assert len(ctl.trace.events()) == ran and not ctl.runs()


def test_the_same_program_gives_the_same_graph_on_real_and_simulated_islands():
    def fig2(ctl):
        return figure2(ctl).f.trace(INPUT)

    def shape(graph):
        return [(type(n).__name__, n.name, n.island if isinstance(n, ComputeNode) else n.dst,
                 n.devices, n.inputs if isinstance(n, ComputeNode) else (n.input,))
                for n in graph.nodes]

    with pw.Controller(islands=(4, 4)) as real, pw.Controller(backend="sim") as simulated:
        g_real, g_sim = fig2(real), fig2(simulated)
        assert shape(g_real) == shape(g_sim) and len(g_real.nodes) == 7

        def values(graph):
            return [(v.shape, v.dtype, getattr(v.sharding, "spec", None))
                    for v in graph.values.values()]

        assert values(g_real) == values(g_sim)


def test_the_islands_are_driven_by_the_runtimes_own_gang_schedulers(monkeypatch):
    decided = []  # (scheduler class, launches) per handle() that launched something
    handle = sch.GangScheduler.handle

    def spy(self, *events):
        out = handle(self, *events)
        if any(isinstance(d, sch.Launch) for d in out):
            decided.append((type(self), sum(isinstance(d, sch.Launch) for d in out)))
        return out

    monkeypatch.setattr(sch.GangScheduler, "handle", spy)
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        chain(ctl).wait()
        # both computations were launched by the runtime's own class, nothing else
        assert {c for c, _ in decided} == {sch.GangScheduler}
        assert sum(n for _, n in decided) == 2
        assert not any(isinstance(v, type) and issubclass(v, sch.GangScheduler) and
                       v is not sch.GangScheduler for v in vars(sim).values())


def shares(policy: str) -> float:
    """Computations of the weight-3 client per computation of the weight-1 client, until the
    first of them has done all its work (both submit 40 one-step programs at t=0)."""
    with pw.Controller(backend="sim", cluster=TINY, policy=policy) as ctl:
        step = pw.function(lambda x: x + 1, slice=ctl.slice(4), name="step", sim_cost=1e-3)
        x = step(np.zeros(4, np.float32))
        x.wait()
        outs = []
        for name, weight in (("light", 1.0), ("heavy", 3.0)):
            with ctl.client(name, weight=weight):
                outs += [step(x) for _ in range(40)]
        assert ctl.wait(timeout=30)
        steps = [e for e in ctl.trace.events() if e.name == "step" and e.client != "default"]
        first = min(max(e.t_end for e in steps if e.client == c) for c in ("light", "heavy"))
        done = [e.client for e in steps if e.t_end <= first]
        return done.count("heavy") / max(1, done.count("light"))


def test_proportional_share_is_the_real_policy_on_virtual_time():
    assert 2.5 < shares("share") < 3.5
    assert shares("fifo") < 0.1  # submission order: the light client's 40 go first


def test_runs_are_deterministic():
    def once():
        with pw.Controller(backend="sim", cluster=TINY, policy="share") as ctl:
            step = pw.function(lambda x: x + 1, slice=ctl.slice(2), name="step")
            for client in ("a", "b", "c"):
                with ctl.client(client, weight=len(client)):
                    for _ in range(5):
                        step(np.ones(256, np.float32))
            ctl.wait(timeout=30)
            return [(e.name, e.client, e.devices, e.t_start, e.t_end)
                    for e in ctl.trace.events()]

    first = once()
    assert len(first) == 30 and first == once()


def test_await_and_block_until_ready_move_the_clock_and_advance_refuses_infinity():
    """A simulated future is awaited and blocked on as a real one (the virtual clock moves
    for it; awaiting ends as result() does: no value), and the clock only moves finitely."""
    import asyncio

    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        f = pw.function(lambda x: x * 2, slice=ctl.slice(2), sim_cost=1e-3)
        y = f(np.ones(4, np.float32))

        async def main():
            return await asyncio.wait_for(y, timeout=60)

        with pytest.raises(pw.NoValueError):
            asyncio.run(main())
        assert y.done() and ctl.executor.now() >= 1e-3
        assert str(y) == f"{y}" == repr(y)  # printed as what it is: no value to print
        z = f(np.ones(4, np.float32))
        assert jax.block_until_ready({"z": z})["z"] is z and z.block_until_ready() is z
        with pytest.raises(sim.SimError, match="finite seconds"):
            ctl.executor.advance(float("inf"))


def test_advance_lets_time_pass_between_submissions():
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        step = pw.function(lambda x: x + 1, slice=ctl.slice(4), name="step", sim_cost=1e-3)
        y = step(np.zeros(4, np.float32))
        assert ctl.executor.advance(0.5) == 0.5 and y.done()
        z = step(y)
        z.wait()
        (second,) = [e for e in ctl.trace.events() if e.name == "step"][1:]
        assert second.t_submit == 0.5 and second.t_start == pytest.approx(0.5 + 225 * US - 10
                                                                           * US, abs=1e-9)
        with pytest.raises(sim.SimError, match="seconds >= 0"):
            ctl.executor.advance(-1)


def test_a_2048_chip_pod_shows_in_the_views_report_and_trace(tmp_path):
    cluster = sim.Cluster.preset("tpu-v4", chips=2048)
    with pw.Controller(backend="sim", cluster=cluster) as ctl:
        pod = ctl.slice((512, 4), axis_names=("data", "model"))
        step = pw.function(lambda x: jnp.tanh(x) * 2, slice=pod, in_specs=P("data", "model"),
                           name="step", sim_cost=0.1)

        @pw.program
        def train(x):
            for _ in range(4):
                x = step(x)
            return x

        train(np.ones((8192, 1024), np.float32)).wait(timeout=30)
        assert ctl.host_of is cluster.host_of
        view = pw.ScheduleView(ctl, live=False)
        assert view.layout_rows.n_rows <= 64  # not 2048 rows: groups of hosts
        assert set(view.decoded()["name"]) == {"step"}
        topo = pw.TopologyView(ctl, window=1.0, live=False)  # the last virtual second
        assert min(topo.source.data["utilization"]) > 0.3  # 0.4 s of steps in it
        report = pw.report(ctl, tmp_path / "report.html")
        assert "step" in report.read_text()
        saved = ctl.trace.save(tmp_path / "trace.json")
        events = json.loads(saved.read_text())["traceEvents"]
        assert sum(e.get("name") == "step" for e in events) >= 4


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="backend='sim'"):
        pw.Controller(cluster=TINY)
    with pytest.raises(ValueError, match="dcn="):
        pw.Controller(backend="sim", dcn=pw.Link(bandwidth=1e9, latency=0))
    with pytest.raises(sim.SimError, match="pw.sim.Cluster or a preset's name"):
        pw.Controller(backend="sim", cluster=TINY.chip)
    with pytest.raises(sim.SimError, match="unknown cluster preset"):
        pw.Controller(backend="sim", cluster="tpu-v9")
    with pytest.raises(ValueError, match="islands=.*drop islands="):
        pw.Controller(islands=(2, 2), backend="sim", cluster=TINY)
    with pytest.raises(sim.SimError, match="islands of a TPU preset are equal"):
        pw.Controller(islands=(8, 4), backend="sim")
    # said in islands, as they were given (it said "chips=12, islands=2 ... chips=16")
    with pytest.raises(sim.SimError, match=r"preset 'tpu-v4' is whole hosts of 4 chips; "
                       r"islands=\(7, 7\) are not. Maybe you want islands=\(8, 8\)"):
        pw.Controller(islands=(7, 7), backend="sim")
    with pytest.raises(sim.SimError, match=r"whole hosts of 8 chips.*islands=\(8,\)"):
        pw.Controller(islands=(3,), backend="sim", cluster="h100")
    with pw.Controller(islands=(16, 16), backend="sim", cluster="h100") as gpus:
        assert gpus.executor.cluster.chip.name == "H100 SXM" and len(gpus.devices) == 32
    with pw.Controller(backend="sim", cluster="h100") as node:  # a preset alone: its machine
        assert len(node.devices) == 8 and len(node.islands) == 1
    with pytest.raises(ValueError, match="islands=\\(4, 4\\) but the cluster has islands of "
                       "\\[4\\] chips"):
        pw.Controller(islands=(4, 4), backend="sim", cluster=TINY)  # (the old default too)
    with pw.Controller(backend="sim", cluster=TINY) as ctl:
        for bad in (-1, True):
            with pytest.raises(pw.ProgramError, match="sim_cost must be seconds"):
                pw.function(lambda x: x, slice=ctl.slice(1), sim_cost=bad)
        f = pw.function(lambda x: x, slice=ctl.slice(1), sim_cost=np.float32(1e-3))  # NumPy's
        assert f(np.ones(4, np.float32)).exception(timeout=30) is None  # seconds are seconds
        with pytest.raises(sim.SimError, match="advance takes finite seconds"):
            ctl.executor.advance(True)
        with pytest.raises(ValueError, match="reattach"):
            ctl.reattach(0)
    assert pw.sim is sim


def test_a_slice_larger_than_a_simulated_island_names_a_larger_simulated_pod():
    # it said pw.Controller(islands=(8,)), "which on CPU needs that many host devices": a
    # controller on this machine's CPUs, not a simulated pod
    with pw.Controller(backend="sim", islands=(4, 4)) as ctl:
        for ask in (lambda: ctl.slice(8), lambda: ctl.slice(8, island=1),
                    lambda: ctl.slice(8, devices=range(8))):
            with pytest.raises(pw.SliceError, match=r"a simulated cluster with an island that "
                               r"large: its preset with islands=\(8,\), e.g. pw.Controller\("
                               r"backend='sim', cluster='tpu-v4', islands=\(8,\)\)") as error:
                ask()
            assert "on CPU" not in str(error.value)
    with pw.Controller(backend="sim", cluster="tpu-v4", islands=(8,)) as bigger:
        assert bigger.slice(8).size == 8  # what it says works


def test_the_scale_benchmark_runs_small():
    from pwkernel.bench import sim_controller

    out = sim_controller.run(computations=200, chips=64)
    assert out["events"] == 201 and out["virtual_s"] > 200 * 1e-4  # the steps, and an upload
    with pytest.raises(ValueError, match="multiple of 100"):
        sim_controller.run(computations=150)


@pytest.mark.parametrize("argv, said", [
    (["--chips", "6"], "a multiple of 4 chips per host"),
    (["--computations", "-5"], "positive multiple of 100"),
])
def test_the_scale_benchmarks_command_line_refuses_in_one_line(argv, said, capsys):
    # it was a traceback (the SimError or ValueError of run())
    from pwkernel.bench import sim_controller

    with pytest.raises(SystemExit) as exit_:
        sim_controller.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err

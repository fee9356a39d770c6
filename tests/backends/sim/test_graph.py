"""From the runtime's traced graph to a simulated program: the same program gives the same
graph on the local runtime and in the simulator, with costs from XLA's cost analysis."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.backends.sim import (
    Cluster,
    Cost,
    NodeKind,
    SimError,
    Simulator,
    from_graph,
    xla_cost,
)


def _shape(events):
    return sorted((e.kind, e.name, e.devices, e.link or "", e.nbytes) for e in events)


def test_the_same_program_gives_the_same_graph_on_the_runtime_and_the_simulator(ctl, fig2):
    f = fig2.f
    v = np.arange(8.0, dtype=np.float32)
    graph = f.trace(v)
    y, z = f(v)
    np.testing.assert_allclose(y.result(), v * 2 + 1)
    ctl.trace.wait_for(len(graph.nodes), timeout=30)
    cluster = Cluster.preset("tpu-v4", chips=8, islands=2)  # chip ids = the host's devices
    program = from_graph(graph, cluster)
    # Figure 2, node for node: v to s0 (host), a, x to s1 (DCN, shared by b and c), b, c,
    # c's output back to s0 (DCN), a again
    T, C = NodeKind.TRANSFER, NodeKind.COMPUTE
    assert [(n.kind, n.devices, n.inputs, n.src_devices) for n in program.nodes] == [
        (T, (0, 1), (), ()), (C, (0, 1), (0,), ()), (T, (4, 5), (1,), (0, 1)),
        (C, (4, 5), (2,), ()), (C, (4, 5), (2,), ()), (T, (0, 1), (4,), (4, 5)),
        (C, (0, 1), (5,), ())]
    assert [n.name for n in program.nodes] == [n.name for n in graph.nodes]
    assert all(n.nbytes == 32 for n in program.nodes if n.kind is T)
    sim = Simulator(cluster)
    sim.submit(program)
    sim.run()
    # the same computations and transfers (host, ICI, DCN), on the same devices, same sizes
    assert _shape(sim.trace.events()) == _shape(ctl.trace.events())
    assert {e.link for e in sim.trace.events()} >= {"host", "dcn"}


def test_xla_costs_follow_the_slice_and_its_shardings(ctl):
    s = ctl.slice(4, island=0)
    mm = pw.function(lambda x, w: x @ w, slice=s, in_specs=(P("x"), P()))
    f = pw.program(lambda x, w: mm(x, w))
    x = np.ones((1024, 256), np.float32)
    w = np.ones((256, 512), np.float32)
    cluster = Cluster.preset("tpu-v4", chips=8, islands=2)
    node = next(n for n in f.trace(x, w).nodes if n.name == "lambda")
    cost = xla_cost(cluster)(node)
    assert cost.flops == pytest.approx(2 * 1024 * 256 * 512 / 4)  # x's rows over 4 chips
    program = from_graph(f.trace(x, w), cluster)
    assert program.nodes[-1].seconds == pytest.approx(cost.seconds)


def test_xla_costs_type_the_mesh_as_the_slice_types_it(ctl):
    """(xla_cost lowered every function on an auto mesh: a function only explicit axes take,
    such as a matmul with out_sharding=, could not be costed from a default, explicit slice)"""
    import jax.numpy as jnp

    cluster = Cluster.preset("tpu-v4", chips=8, islands=2)
    x = np.ones((256, 256), np.float32)
    def explicit_mm(u, v):  # (only explicit axes take out_sharding=)
        return jnp.matmul(u, v, out_sharding=P("a", "b"))

    for types, body in (("explicit", explicit_mm), ("auto", jnp.matmul)):
        s = ctl.slice((2, 2), island=0, axis_names=("a", "b"), axis_types=types)
        fn = pw.function(body, slice=s, in_specs=(P("a"), P(None, "b")), name="mm")
        f = pw.program(lambda u, v, fn=fn: fn(u, v))
        node = next(n for n in f.trace(x, x).nodes if n.name == "mm")
        assert xla_cost(cluster)(node).flops == pytest.approx(2 * 256**3 / 4)
        s.release()


def test_given_costs_and_device_maps(ctl, fig2):
    f = fig2.f
    graph = f.trace(np.arange(4.0, dtype=np.float32))
    big = Cluster.preset("tpu-v4", chips=64, islands=2)  # islands of 32 chips
    # the host's device d -> chip d of island 0, or chip 32 + (d - 4) of island 1
    chip = {d: (d if d < 4 else 32 + d - 4) for d in range(8)}
    program = from_graph(graph, big, cost=lambda node: Cost.given(1e-3), devices=chip)
    computes = [n for n in program.nodes if n.kind is NodeKind.COMPUTE]
    assert {n.seconds for n in computes} == {1e-3}
    assert {d for n in computes for d in n.devices} <= {0, 1, 32, 33}
    with pytest.raises(SimError, match="chips 0..7"):
        from_graph(graph, Cluster.preset("tpu-v4", chips=8, islands=2), cost=1e-3,
                   devices=lambda d: d + 100)
    with pytest.raises(SimError, match="a dict or a function"):
        from_graph(graph, big, cost=1e-3, devices=[0, 1])


def test_a_functions_sim_cost_is_its_cost_in_both_simulators(ctl):
    # from_graph lowered every function for XLA's figures, sim_cost or not: a host callback
    # (which cannot be lowered without devices) failed, and a given duration was ignored
    import jax

    s = ctl.slice(2, island=0)

    def host_side(x):
        return jax.pure_callback(lambda v: np.asarray(v) + 1,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    f = pw.function(lambda x: x * 2, slice=s, sim_cost=1e-3, name="double")
    cb = pw.function(host_side, slice=s, sim_cost=2e-3, name="on_host")
    g = pw.program(lambda x: cb(f(x)))
    x = np.ones(8, np.float32)
    cluster = Cluster.preset("tpu-v4", chips=8, islands=2)
    program = from_graph(g.trace(x), cluster)
    assert {n.name: n.seconds for n in program.nodes if n.kind is NodeKind.COMPUTE} == {
        "double": 1e-3, "on_host": 2e-3}
    bare = pw.function(host_side, slice=s, name="no_cost")
    with pytest.raises(SimError, match=r"could not lower no_cost on an abstract mesh .*"
                                       r"sim_cost=seconds"):
        from_graph(pw.program(lambda x: bare(x)).trace(x), cluster)

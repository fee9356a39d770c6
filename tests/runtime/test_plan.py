"""``runtime.plan.build``: a traced graph's plan, read node by node on small real programs.

What each node reads and writes (value slots), where it runs (island, devices), what its
outputs take per device, and who counts whose arrival: a computation that reads a computation
of the same program on the same island waits for its launch inside the scheduler
(``NodeSpec.waits``); every other input (an argument, a transfer, a computation with a host
callback) is an ``external`` arrival the dispatcher counts (``Plan.notify``).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.graph import ComputeNode, TransferNode
from pwkernel.runtime.plan import build

V = np.array([1.0, 2.0], dtype=np.float32)


def by_name(plan, name: str, nth: int = 0):
    return [p for p in plan.nodes if p.name == name][nth]


def transfer_into(plan, node):
    """The transfer node that writes ``node``'s (only) input slot."""
    src = plan.nodes[plan.producer[node.inputs[0]]]
    assert isinstance(src.node, TransferNode), src
    return src


def test_figure2_slots_and_the_user_visible_results(fig2):
    graph = fig2.f.trace(V)
    plan = build(graph)
    assert plan.nslots == len(graph.values) and len(plan.nodes) == len(graph.nodes) == 7
    assert plan.inputs == tuple(graph.inputs) and plan.sources == plan.inputs and not plan.consts
    assert plan.outputs == tuple(graph.outputs) and plan.futures == frozenset(graph.outputs)
    b, a2 = by_name(plan, "b"), by_name(plan, "a", 1)
    assert [plan.producer[s] for s in plan.outputs] == [b.index, a2.index]
    assert all(plan.producer[s] == -1 for s in plan.inputs)
    for p in plan.nodes:  # each slot is written by exactly the node that lists it
        assert all(plan.producer[s] == p.index for s in p.outputs)
        assert all(p.index in plan.consumers[s] for s in p.inputs)
    assert plan.refs == tuple(len(c) for c in plan.consumers)
    # what each result's Future is made of: slot, producer, shape, dtype, island, name
    assert [(m[0], m[1], m[2], m[3], m[5], m[6]) for m in plan.made] == [
        (plan.outputs[0], b.index, (2,), np.dtype(np.float32), 1, "b"),
        (plan.outputs[1], a2.index, (2,), np.dtype(np.float32), 0, "a")]


def test_figure2_devices_and_bytes(fig2):
    plan = build(fig2.f.trace(V))
    s0, s1 = fig2.s0.device_ids, fig2.s1.device_ids
    a, b, c, a2 = (by_name(plan, "a"), by_name(plan, "b"), by_name(plan, "c"),
                   by_name(plan, "a", 1))
    for node, island, devices in ((a, 0, s0), (b, 1, s1), (c, 1, s1), (a2, 0, s0)):
        assert node.is_compute and isinstance(node.node, ComputeNode)
        assert (node.island, node.devices, node.spec.devices) == (island, devices,
                                                                  frozenset(devices))
    # a's output is sharded over its 2 devices (P("x")): one float32 each; b's is replicated
    assert a.out_nbytes == ({d: 4 for d in s0},) and a.memory == a.spec.memory == 4
    assert b.out_nbytes == ({d: 8 for d in s1},) and b.memory == b.spec.memory == 8
    # a transfer runs on its destination: the island and devices of the reader
    x_over_dcn = transfer_into(plan, b)
    assert not x_over_dcn.is_compute and x_over_dcn.node.link == "dcn"
    assert (x_over_dcn.island, x_over_dcn.devices) == (1, s1)
    assert x_over_dcn.out_nbytes == ({d: 8 for d in s1},) and x_over_dcn.spec is None
    upload = transfer_into(plan, a)
    assert upload.node.link == "host" and upload.inputs == plan.inputs and upload.devices == s0


def test_figure2_every_input_crosses_a_transfer_and_is_counted_by_the_dispatcher(fig2):
    plan = build(fig2.f.trace(V))
    a, b, c, a2 = (by_name(plan, "a"), by_name(plan, "b"), by_name(plan, "c"),
                   by_name(plan, "a", 1))
    assert all(p.spec.waits == () and p.spec.external for p in (a, b, c, a2))
    assert plan.external == tuple(p.external for p in plan.nodes) == (1,) * 7
    # b and c read the one copy of x on island 1: both count its arrival
    x1 = transfer_into(plan, b).outputs[0]
    assert transfer_into(plan, c).outputs[0] == x1
    assert plan.notify[x1] == (b.index, c.index) and plan.refs[x1] == 2
    # the results are read by nobody: no one is told when they exist
    assert not b.notifies and not a2.notifies and c.notifies and a.notifies
    # the scheduler's part, per island in program order; a2 reads c (island 1) only: no
    # ancestor on its own island
    assert {i: [s.index for s in specs] for i, specs in plan.islands.items()} == {
        0: [a.index, a2.index], 1: [b.index, c.index]}
    assert a2.spec.after == () and a.foreign and not a2.foreign


def test_a_chain_on_one_slice_waits_for_launches_inside_the_scheduler(ctl):
    s, t = ctl.slice(2, island=0), ctl.slice(2, island=0)
    f = pw.function(lambda x: x * 2, slice=s, name="f")
    g = pw.function(lambda x, y: x + y, slice=s, name="g")
    h = pw.function(lambda x: x - 1, slice=t, name="h")
    k = pw.function(lambda x, v: x * v, slice=s, name="k")

    @pw.program
    def chain(v):
        x = f(v)
        y = g(x, x)        # reads x twice: one distinct input, waited for at f's launch
        return h(y), k(x, v)  # h: over ICI to another slice; k: x, and v from the host

    plan = build(chain.trace(V))
    f_, g_, h_, k_ = (by_name(plan, n) for n in "fghk")
    assert g_.inputs == (f_.outputs[0],) * 2 and g_.distinct == (f_.outputs[0],)
    assert (g_.n_inputs, g_.external, g_.spec.waits, g_.spec.external) == (1, 0, (f_.index,),
                                                                          False)
    assert plan.notify[f_.outputs[0]] == ()  # g and k see it launch; nobody counts it
    assert k_.spec.waits == (f_.index,) and k_.n_inputs == 2 and k_.external == 1
    assert k_.spec.external and k_.foreign  # v reaches k through its own upload
    ici = transfer_into(plan, h_)
    assert ici.node.link == "ici" and ici.devices == t.device_ids
    assert (h_.spec.waits, h_.spec.after, h_.external) == ((), (g_.index,), 1)
    assert plan.notify[ici.outputs[0]] == (h_.index,) and g_.notifies
    assert (h_.devices, h_.spec.devices) == (t.device_ids, frozenset(t.device_ids))


def test_a_computation_with_a_host_callback_is_waited_for_by_the_dispatcher(ctl):
    s = ctl.slice(1, island=0)
    noted = pw.function(lambda x: jax.pure_callback(
        lambda a: a, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s, name="noted")
    after = pw.function(lambda x: x + 1, slice=s, name="after")
    plan = build(pw.program(lambda v: after(noted(v))).trace(V))
    noted_, after_ = by_name(plan, "noted"), by_name(plan, "after")
    assert not noted_.asynchronous and after_.asynchronous
    # a launch that may run synchronously is no signal: its output's arrival is counted
    assert after_.spec.waits == () and after_.external == 1 and after_.spec.external
    assert after_.spec.after == (noted_.index,)
    assert plan.notify[noted_.outputs[0]] == (after_.index,) and noted_.notifies


def test_host_arrays_captured_while_tracing_are_constants_and_sources(ctl):
    s = ctl.slice(2, island=0)
    add = pw.function(lambda x, w: x + w, slice=s, name="add")
    w = np.full(2, 10.0, np.float32)
    plan = build(pw.program(lambda v: add(v, w)).trace(V))
    ((slot, value),) = plan.consts
    assert value.tolist() == w.tolist() and not np.shares_memory(value, w)  # a copy, as jit
    assert slot not in plan.inputs and plan.producer[slot] == -1
    assert plan.sources == plan.inputs + (slot,)
    add_ = by_name(plan, "add")
    assert add_.n_inputs == add_.external == 2 and add_.spec.waits == ()


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_a_plan_is_built_once_per_graph_and_runs(ctl, mode):
    # The dispatcher keeps the plan on the graph: a second call of the same signature reuses it.
    ctl.dispatch = mode
    s = ctl.slice(2, island=0)
    f = pw.function(lambda x: x * 2, slice=s, name="f")
    prog = pw.program(lambda v: f(f(v)))
    assert prog(V).result(timeout=60).tolist() == [4.0, 8.0]
    graph = prog.trace(V)
    plan = graph.plan
    assert plan is not None and plan.graph is graph
    assert prog(V).result(timeout=60).tolist() == [4.0, 8.0] and graph.plan is plan


class Walked(list):
    """A graph's list of value ids, counting how often it is walked or searched whole."""

    walks = 0

    def __iter__(self):
        self.walks += 1
        return super().__iter__()

    def __contains__(self, slot):
        self.walks += 1
        return super().__contains__(slot)


def test_a_plan_walks_the_outputs_and_arguments_once_however_many_calls_donate(ctl):
    s = ctl.slice(2, island=0)
    inc = pw.function(lambda x: x + 1, slice=s)
    consume = pw.function(lambda x: x + 1, slice=s, donate_argnums=0)

    @pw.program
    def p(xs):  # each argument donated as it is, and a value of each made and donated
        return [consume(x) for x in xs] + [consume(inc(x)) for x in xs]

    on_s = jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
    xs = [jax.device_put(V + i, on_s) for i in range(50)]
    graph = p.trace(xs)
    graph.outputs, graph.inputs = Walked(graph.outputs), Walked(graph.inputs)
    plan = build(graph)
    # once each, not once per donating call (50 + 50 of them: quadratic in a program's calls)
    assert graph.outputs.walks <= 6 and graph.inputs.walks <= 6
    donors = [n for n in plan.nodes if n.donates]
    assert len(donors) == 100
    args = {slot for n in donors[:50] for slot, _ in n.donated_args}
    assert args == set(graph.inputs) and all(not n.donated_internal for n in donors[:50])
    assert all(n.donated_internal == n.donated_slots and not n.donated_args
               for n in donors[50:])

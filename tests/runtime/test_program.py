"""pw.function and @pw.program: the paper's Figure 2, specs, caching, tracing errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime import compiled
from pwkernel.runtime.errors import NeedsValueError


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_figure2_program_in_both_dispatch_modes(ctl, fig2, mode):
    ctl.dispatch = mode
    f = fig2.f
    y, z = f(np.array([1.0, 2.0]))
    assert isinstance(y, pw.Future) and isinstance(z, pw.Future)
    assert y.shape == (2,) and y.dtype == np.float32 and y.sharding is not None
    assert y.result(timeout=60).tolist() == [3.0, 5.0]
    assert z.result(timeout=60).tolist() == [2.0, 4.0]
    events = ctl.trace.events()
    dcn = [e for e in events if e.kind == "transfer" and e.link == "dcn"]
    assert {(e.src, e.dst) for e in dcn} == {(0, 1), (1, 0)}
    assert all(e.nbytes == 8 and e.t_end >= e.t_start >= e.t_submit for e in dcn)
    computes = [e for e in events if e.kind == "compute"]
    assert len(computes) == 4 and {e.island for e in computes} == {0, 1}


def test_program_is_one_graph_with_inserted_transfers(fig2):
    f = fig2.f
    graph = f.trace(np.array([1.0, 2.0]))
    kinds = [type(n).__name__ for n in graph.nodes]
    assert kinds.count("ComputeNode") == 4
    links = sorted(n.link for n in graph.nodes if type(n).__name__ == "TransferNode")
    assert links == ["dcn", "dcn", "host"]  # x is moved once to island 1, shared by b and c
    assert f.trace(np.array([5.0, 6.0])) is graph  # cached per input signature


def test_ici_transfer_between_slices_of_one_island(ctl):
    s0 = ctl.slice(2, island=0)
    s1 = ctl.slice(2, island=0)
    assert set(s0.device_ids).isdisjoint(s1.device_ids)
    a = pw.function(lambda x: x + 1, slice=s0)
    b = pw.function(lambda x: x * 10, slice=s1)
    out = pw.program(lambda v: b(a(v)))(np.arange(4, dtype=np.float32))
    assert out.result(timeout=60).tolist() == [10.0, 20.0, 30.0, 40.0]
    (ici,) = [e for e in ctl.trace.events() if e.link == "ici"]
    assert ici.src == ici.dst == 0 and set(ici.devices) == set(s1.device_ids)


def test_compiled_once_per_signature(ctl):
    s = ctl.slice(2)
    f = pw.function(lambda x: x * 2, slice=s)
    for _ in range(3):
        f(np.ones(4, np.float32)).result(timeout=60)
    f(np.ones(6, np.float32)).result(timeout=60)
    assert len(f._cache) == 2


def test_defaults_replicate_host_values_and_keep_placed_shardings(ctl):
    """As jax.jit under jax.set_mesh: a host value is replicated, an array on the slice's
    mesh keeps its sharding, and pw.BATCH is the one word for sharding the batch."""
    s = ctl.slice(4, island=0)
    f = pw.function(lambda x: x * 1, slice=s)
    assert f(np.ones((8, 3))).result().sharding.spec in (P(), P(None, None))
    kept = pw.function(lambda x: x * 1, slice=s)(jax.device_put(
        np.ones((8, 4)), NamedSharding(s.mesh, P(None, "x"))))
    assert kept.sharding.spec == P(None, "x") == kept.result().sharding.spec
    batch = pw.function(lambda x: x * 1, slice=s, in_specs=pw.BATCH)
    assert batch(np.ones((8, 3))).result().sharding.spec == P("x", None)
    with pytest.raises(pw.SpecError, match="pw.BATCH.*not divisible by 4"):
        batch(np.ones((6, 3)))


def test_pytrees_and_multiple_outputs(ctl):
    s = ctl.slice(2)
    step = pw.function(lambda p, x: {"w": p["w"] - 0.1 * x, "n": p["n"] + 1}, slice=s)
    params = {"w": np.ones(4, np.float32), "n": np.zeros((), np.int32)}
    out = step(params, np.ones(4, np.float32))
    assert set(out) == {"w", "n"}
    np.testing.assert_allclose(out["w"].result(), 0.9)
    assert int(out["n"].result()) == 1


def test_futures_flow_into_later_programs_before_they_resolve(ctl):
    s = ctl.slice(1, island=0)
    inc = pw.function(lambda x: x + 1, slice=s)
    x = inc(np.zeros(2, np.float32))
    chain = [x]
    for _ in range(20):
        chain.append(inc(chain[-1]))
    assert chain[-1].result(timeout=60).tolist() == [21.0, 21.0]
    assert np.asarray(chain[5]).tolist() == [6.0, 6.0]


def test_collectives_with_shard_map(ctl):
    s = ctl.slice(4, island=1)

    def total(x):
        return jax.shard_map(lambda b: jax.lax.psum(b.sum(keepdims=True), "x"), mesh=s.mesh,
                             in_specs=P("x"), out_specs=P())(x)

    f = pw.function(total, slice=s, in_specs=P("x"), out_specs=P())
    assert f(np.arange(8.0)).result(timeout=60).tolist() == [28.0]


@pytest.mark.parametrize(
    "specs, shape, match",
    [
        (P("x"), (3,), r"dimension 0 \(size 3\) over mesh axis x of size 2"),
        (P("y"), (4,), r"mesh axis 'y', but the slice's mesh has axes \('x',\)\. Maybe you "
                       r"want one of those, P\('x'\), or a slice whose axes name it: "
                       r"ctl.slice\(\.\.\., axis_names=\('y', \.\.\.\)\)"),
        (P("x", None, None), (4,), "names 3 dimensions"),
    ],
)
def test_specs_that_do_not_fit_name_the_axis_and_sizes(ctl, specs, shape, match):
    f = pw.function(lambda x: x, slice=ctl.slice(2), in_specs=specs)
    with pytest.raises(pw.SpecError, match=match):
        f(np.ones(shape, np.float32))


def test_tracing_errors_say_what_to_do(ctl):
    f = pw.function(lambda x: x, slice=ctl.slice(2))
    with pytest.raises(pw.ProgramError, match="only compiled functions can operate"):
        pw.program(lambda v: f(v) + 1)(np.ones(2))
    with pytest.raises(pw.ProgramError, match="called no compiled function"):
        pw.program(lambda v: v)(np.ones(2))
    with pytest.raises(pw.ProgramError, match="called no compiled function"):
        pw.program(lambda v: (v, 1.0, jnp.ones(2)))(np.ones(2))  # (constants: no slice to place)
    with pytest.raises(pw.ProgramError, match=r"returned str 'hello' at \['label'\]; a program "
                       r"returns the values of its compiled-function calls. Maybe you want"):
        pw.program(lambda v: {"y": f(v), "label": "hello"})(np.ones(2))
    with pytest.raises(pw.ProgramError, match="static_argnums=0"):
        f("text")
    with pytest.raises(pw.SliceError, match="VirtualSlice"):
        pw.function(lambda x: x, slice=2)
    with pytest.raises(pw.ProgramError, match="could not be traced"):
        pw.function(lambda x: jnp.dot(x, x.T[:1]), slice=ctl.slice(1))(np.ones((2, 3)))
    # whatever needs a value gets the same line: methods, properties, comparisons, jnp,
    # range() over a traced argument (jnp's and jax.jit's own TypeError, which hid it
    # behind "a jit-wrapped function was called with a non-array argument", is its cause)
    x = np.ones(2)
    for body, arg in ((lambda v: f(v).sum(), x), (lambda v: f(v).T, x),
                      (lambda v: f(v) > 0, x), (lambda v: f(v)[0], x),
                      (lambda n: [f(x) for _ in range(n)], 2), (lambda v: jnp.sin(f(v)), x),
                      (lambda v: jnp.mean(f(v)), x), (lambda v: jax.jit(jnp.cos)(f(v)), x)):
        with pytest.raises(pw.NeedsValueError, match="only compiled functions can operate"):
            pw.program(body)(arg)
    assert NeedsValueError is pw.NeedsValueError and issubclass(NeedsValueError, TypeError)


def test_a_shard_map_out_specs_error_names_the_out_specs_fix_not_an_input_layout(ctl):
    """An ``all_gather`` returned with ``out_specs=P()`` (check_vma cannot see it is
    replicated): jax.jit raises the same ValueError. pwkernel's line used to cut JAX's message
    at "given the mesh:" and suggest in_specs=pw.BATCH, which changes nothing; it now says
    which out_specs and the three fixes."""
    s = ctl.slice(4)
    gather = jax.shard_map(lambda v: jax.lax.all_gather(v, "x", tiled=True), in_specs=P("x"),
                           out_specs=P())
    x = jax.device_put(np.arange(8.0), NamedSharding(s.mesh, P("x")))
    with pytest.raises(ValueError, match="out_specs which require replication") as jit:
        with jax.set_mesh(s.mesh):
            jax.jit(gather)(x)
    with pytest.raises(pw.ProgramError) as got:
        pw.function(gather, slice=s)(x)
    assert isinstance(got.value, type(jit.value)) and "pw.BATCH" not in str(got.value)
    assert "out_specs is P() which implies" in str(got.value)
    assert "jax.lax.psum" in str(got.value) and "check_vma=False" in str(got.value)
    fixed = jax.shard_map(lambda v: jax.lax.all_gather(v, "x", tiled=True), in_specs=P("x"),
                          out_specs=P(), check_vma=False)
    assert np.array_equal(pw.function(fixed, slice=s)(x).result(), np.arange(8.0))


def test_a_program_over_two_controllers_says_how_to_split_it(ctl):
    """It said only that a program runs on one controller, not what to do about it."""
    with pytest.warns(pw.SharedDevicesWarning):
        other = pw.Controller(islands=(4, 4))
    try:
        mine = pw.function(lambda x: x * 2, slice=ctl.slice(2))
        theirs = pw.function(lambda x: x + 1, slice=other.slice(2), name="theirs")
        with pytest.raises(pw.ProgramError, match="theirs is on a slice of Controller") as e:
            pw.program(lambda v: theirs(mine(v)))(np.ones(2))
        assert "pass fut.result() from one to the next" in str(e.value)
        # (two controllers made alike have the same repr: it read as one controller twice)
        assert "called before it are on another controller, Controller(" in str(e.value)
        # the fix it names works
        assert theirs(mine(np.ones(2)).result(60)).result(60).tolist() == [3.0, 3.0]
    finally:
        other.close()


def test_program_static_arguments_and_its_own_dispatch_parameter(ctl):
    """@pw.program takes static_argnums/static_argnames as jax.jit does (a Python value at
    trace time, part of the cache key); a parameter named ``dispatch`` is the function's."""
    s = ctl.slice(2)
    double = pw.function(lambda x: x * 2, slice=s)

    @pw.program(static_argnums=1, static_argnames="mode")
    def repeat(x, n, mode="same"):
        for _ in range(n):
            x = double(x)
        return x if mode == "same" else double(x)

    assert repeat(np.ones(2), 3).result(60).tolist() == [8.0, 8.0]
    assert repeat(np.ones(2), 2, mode="more").result(60).tolist() == [8.0, 8.0]
    assert repeat(np.ones(2), 1, dispatch="sequential").result(60).tolist() == [2.0, 2.0]
    assert len(repeat._graphs) == 3
    with pytest.raises(ValueError, match="static_argnames names \\['nn'\\]"):
        pw.program(lambda x: x, static_argnames="nn")

    @pw.program
    def both(x, dispatch):
        return double(x), double(dispatch)

    got = both(np.ones(2), dispatch=np.full(2, 3.0))
    assert [g.result(60).tolist() for g in got] == [[2.0, 2.0], [6.0, 6.0]]
    assert double(np.ones(2), dispatch="sequential").result(60).tolist() == [2.0, 2.0]
    add = pw.function(lambda x, dispatch: x + dispatch, slice=s)
    assert add(np.ones(2), dispatch=np.ones(2)).result(60).tolist() == [2.0, 2.0]


def test_decorator_forms(ctl):
    s = ctl.slice(2)

    @pw.function(slice=s)
    def square(x):
        return x * x

    @pw.program(name="sq_twice")
    def twice(x):
        return square(square(x))

    assert twice(np.full(2, 2.0)).result().tolist() == [16.0, 16.0]
    assert twice.name == "sq_twice" and square.__name__ == "square"


def test_a_program_returning_its_argument_gives_what_jax_jit_gives(ctl):
    """An argument returned as it is comes back as jax.jit returns it: a jax.Array (a host
    value on the default device, a Python scalar weakly typed), its sharding known at once."""
    s = ctl.slice(2, island=0)
    inc = pw.function(lambda a: a + 1, slice=s)

    @pw.program
    def passes(a, b):
        return b, inc(a)

    x = np.arange(4.0, dtype=np.float32)
    placed = jax.device_put(x, NamedSharding(s.mesh, P()))
    for b, weak in ((x * 2, False), (3.0, True), (7, True), (placed, False)):
        fut = passes(x, b)[0]
        assert fut.sharding is not None and fut.weak_type is weak
        got = fut.result(timeout=60)
        assert isinstance(got, jax.Array) and got.weak_type is weak
        assert got.sharding == fut.sharding
        assert jax.typeof(got).dtype == jax.typeof(jnp.asarray(b)).dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(b))
    assert not placed.is_deleted()


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_value_returned_twice_is_two_arrays_as_under_jax_jit(ctl, dispatch):
    """A program that returns one value twice (EMA weights started at the weights) gives two
    arrays, as jax.jit does: a step that donates both, or one of them, leaves the other."""
    s = ctl.slice(2, island=0)
    init = pw.function(lambda v: v * 2, slice=s)

    @pw.program
    def start(v):
        w = init(v)
        return {"params": w, "ema": w}

    step = pw.function(lambda st: jax.tree.map(lambda a: a + 1, st), slice=s,
                       donate_argnums=0)
    x = np.arange(4.0, dtype=np.float32)
    state = start(x, dispatch=dispatch)
    assert state["params"] is not state["ema"]
    state = step(state, dispatch=dispatch)  # donates both: no "reads the same array" error
    for leaf in state.values():
        np.testing.assert_array_equal(leaf.result(60), x * 2 + 1)
    state = start(x, dispatch=dispatch)
    pw.function(lambda a: a, slice=s, donate_argnums=0)(state["params"]).result(60)
    np.testing.assert_array_equal(state["ema"].result(60), x * 2)


def test_traces_of_ever_new_shapes_are_kept_up_to_a_bound_as_jax_jit_keeps_them(ctl, monkeypatch):
    # jax.jit's caches keep their latest 2048 or so traces; so do a program's graphs and a
    # function's executables and one-node programs (here 4, to stay quick): they grew forever
    monkeypatch.setattr(compiled, "TRACES", 4)
    s = ctl.slice(2, island=0)
    inc = pw.function(lambda x: x + 1, slice=s)
    scale = pw.function(lambda x, k: x * k, slice=s, static_argnums=1)
    traced = []

    @pw.program
    def p(x):
        traced.append(x.shape)
        return inc(x)

    for n in range(1, 11):
        assert p(np.zeros(n, np.float32)).result(60).tolist() == [1.0] * n
        assert scale(np.ones(2, np.float32), n).result(60).tolist() == [n, n]
    assert len(p._graphs) == len(inc._cache) == len(scale._programs) == 4
    assert len(traced) == 10
    for n in (7, 8, 9, 10, 10, 9):  # the latest kept: not traced again
        assert p(np.zeros(n, np.float32)).result(60).tolist() == [1.0] * n
    assert len(traced) == 10
    assert p(np.zeros(1, np.float32)).result(60).tolist() == [1.0]  # forgotten: traced again
    assert traced[10:] == [(1,)] and len(p._graphs) == 4

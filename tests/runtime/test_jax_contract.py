"""pw.function is jax.jit placed on a slice: call conventions, defaults, donation, errors."""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from tests.helpers.programs import gate


def test_keyword_static_and_pytree_arguments(ctl):
    s = ctl.slice(2)

    def f(x, n, *, scale=1.0, tree=None):
        return {"y": x * scale * n, "t": jax.tree.map(lambda a: a + n, tree)}

    pf = pw.function(f, slice=s, static_argnums=1)
    jf = jax.jit(f, static_argnums=1)
    x = np.arange(4.0, dtype=np.float32)
    tree = {"a": np.ones(2, np.float32), "b": (np.zeros(3, np.float32),)}
    got = jax.tree.map(lambda v: v.result(60), pf(x, 3, scale=2.0, tree=tree))
    want = jf(x, 3, scale=2.0, tree=tree)
    jax.tree.map(np.testing.assert_allclose, got, want)
    named = pw.function(lambda x, n: x * n, slice=s, static_argnames="n")
    assert named(x, n=5).result(60).tolist() == (x * 5).tolist()
    assert len(named._cache) == 1 and named(x, n=5) is not None and len(named._cache) == 1
    named(x, n=6).result(60)
    assert len(named._cache) == 2  # a static value is part of the compilation key
    with pytest.raises(pw.ProgramError, match="hashable.*tuple instead of a list"):
        named(x, n=[1, 2])


@pytest.mark.parametrize("make", [jnp.ones, np.ones], ids=["jax", "numpy"])
def test_an_array_given_as_a_static_argument_is_told_to_pass_it_as_an_array(ctl, make):
    """An array (unhashable, as under ``jax.jit``) given as a static value gets the array's
    fix, not the list's ("a tuple instead of a list")."""
    f = pw.function(lambda x, n: x * 2, slice=ctl.slice(2), static_argnums=1)
    with pytest.raises(ValueError, match="Pass it as an array argument") as e:
        f(np.ones(2), make(2))
    assert "tuple instead of a list" not in str(e.value)


def test_methods_bind_self_as_jax_jit_methods_do(ctl):
    """``@pw.function`` (and ``@pw.program``) on a method binds ``self`` as a
    ``jax.jit``-decorated method does: the instance is the first argument (here static)."""
    s = ctl.slice(2)

    class Scaler:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            return hash(self.k)

        def __eq__(self, other):
            return isinstance(other, Scaler) and other.k == self.k

        @functools.partial(jax.jit, static_argnums=0)
        def jitted(self, x):
            return x * self.k

        @pw.function(slice=s, static_argnums=0)
        def placed(self, x):
            return x * self.k

        @pw.program(static_argnums=0)
        def twice(self, x):
            return self.placed(self.placed(x))

    x = np.arange(4.0, dtype=np.float32)
    m = Scaler(3.0)
    np.testing.assert_array_equal(m.placed(x).result(60), m.jitted(x))
    np.testing.assert_array_equal(Scaler.placed(m, x).result(60), m.jitted(x))
    np.testing.assert_array_equal(m.twice(x).result(60), x * 9)
    assert Scaler.placed.name == "placed" and Scaler(3.0).placed.__self__ == m


def test_static_values_equal_but_of_other_types_compile_apart_and_argnums_are_checked(ctl):
    """jax.jit keeps 2 and 2.0 (1 and True) apart as static values, counts a negative
    position from the end, and refuses positions and names the function does not take."""
    s = ctl.slice(2)
    scale = lambda x, s: x * s  # noqa: E731
    x = jnp.arange(3)
    pf, jf = pw.function(scale, slice=s, static_argnums=-1), jax.jit(scale, static_argnums=-1)
    for v in (2, 2.0, True, 2):
        got, want = pf(x, v).result(60), jf(x, v)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), (v, got, want)
    assert len(pf._cache) == 3
    for kw, jax_kw in [({"static_argnums": 5}, "static_argnums"),
                       ({"static_argnames": "nn"}, "invalid argnames"),
                       ({"donate_argnums": (0, 2)}, "donate_argnums")]:
        with pytest.raises(ValueError, match=jax_kw):
            jax.jit(scale, **kw)
        with pytest.raises(ValueError, match="position|does not take") as info:
            pw.function(scale, slice=s, **kw)
        assert isinstance(info.value, pw.ProgramError) and "\n" not in str(info.value)
    star = pw.function(lambda *a, **k: a[0] * a[1], slice=s, static_argnums=1,
                       static_argnames="any")  # *args and **kwargs take any position or name
    assert star(x, 3).result(60).tolist() == [0, 3, 6]


def test_errors_raised_while_tracing_keep_their_type(ctl):
    """An error the user's function raises while JAX traces it is caught by the same
    ``except`` clause as under jax.jit, and is also a pw.ProgramError with pwkernel's line."""
    s = ctl.slice(2)

    def rows3(x):
        if x.shape[0] != 3:
            raise ValueError("need 3 rows")
        return x

    with pytest.raises(ValueError, match="need 3 rows"):
        jax.jit(rows3)(jnp.ones(2))
    with pytest.raises(ValueError, match="rows3 could not be traced: ValueError: need 3 rows"
                       ) as info:
        pw.function(rows3, slice=s)(jnp.ones(2))
    assert isinstance(info.value, pw.ProgramError)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        pw.function(lambda x: x if x.sum() > 0 else -x, slice=s)(jnp.ones(2))
    assert pw.function(rows3, slice=s)(jnp.ones(3)).result(60).tolist() == [1.0] * 3


def test_out_specs_are_pytree_prefixes(ctl):
    s = ctl.slice(2)

    def step(params, x):
        return jax.tree.map(lambda p: p - x.mean(), params), params, x.sum()

    params = {f"w{i}": np.ones((4, 2), np.float32) for i in range(6)}
    f = pw.function(step, slice=s, out_specs=(P(), P(), P()))  # one per returned element
    new, old, total = f(params, np.arange(4.0, dtype=np.float32))
    assert total.result(60) == 6.0 and set(new) == set(params)
    with pytest.raises(pw.SpecError, match="pytree prefix of it"):
        pw.function(step, slice=s, out_specs=(P(), P()))(params, np.ones(4, np.float32))


def test_in_and_out_shardings_as_jax_jit_takes_them(ctl):
    s = ctl.slice(4, island=0)
    rows, whole = NamedSharding(s.mesh, P("x")), NamedSharding(s.mesh, P())

    def step(x, w):
        return jnp.tanh(x @ w), (x.sum(), w)

    x, w = np.arange(32.0, dtype=np.float32).reshape(8, 4) / 32, np.eye(4, dtype=np.float32)
    shardings = {"in_shardings": (rows, whole), "out_shardings": (whole, (None, rows))}
    with jax.set_mesh(s.mesh):
        want = jax.jit(step, **shardings)(x, w)
    got = pw.function(step, slice=s, **shardings)(x, w)  # host inputs: placed as asked
    for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g.result(60), v)
        assert g.sharding.is_equivalent_to(v.sharding, v.ndim), (g.sharding, v.sharding)
    assert got[0].sharding.is_equivalent_to(whole, 2)
    assert got[1][1].sharding.is_equivalent_to(rows, 2)
    # a sharding written for another mesh with the slice's axis names: its spec, on the slice
    elsewhere = jax.make_mesh((2,), ("x",), devices=jax.devices()[6:8])
    moved = pw.function(lambda v: v * 2, slice=s, in_shardings=NamedSharding(elsewhere, P("x")))
    out = moved(jax.device_put(x, rows))
    assert out.sharding.is_equivalent_to(rows, 2)
    np.testing.assert_allclose(out.result(60), x * 2)
    # a host value under in_shardings is typed as jax.jit types it on explicit axes (by
    # itself: replicated); in_specs places and types it
    with jax.set_mesh(s.mesh):
        want = jax.jit(lambda v: v * 2, in_shardings=P("x"))(x)
    got = pw.function(lambda v: v * 2, slice=s, in_shardings=P("x"))(x).result(60)
    assert jax.typeof(got) == jax.typeof(want) and got.sharding.is_equivalent_to(whole, 2)
    assert pw.function(lambda v: v * 2, slice=s, in_specs=P("x"))(x).sharding.is_equivalent_to(
        rows, 2)
    # what jax.jit refuses there, refused: a spec of another rank, a shape the axis does not
    # divide (checked before the host value is typed), keyword arguments with in_shardings
    inc = pw.function(lambda a: a + 1, slice=s, in_shardings=P("x"))
    for args, kwargs in [((np.float32(1),), {}), ((np.ones(3, np.float32),), {}),
                         ((), {"a": x})]:
        with jax.set_mesh(s.mesh), pytest.raises(ValueError):
            jax.jit(lambda a: a + 1, in_shardings=P("x"))(*args, **kwargs)
        with pytest.raises(ValueError, match="in_shardings"):
            inc(*args, **kwargs)


def test_in_shardings_per_argument_leave_out_static_ones_and_say_so(ctl):
    """As jax.jit reads in_shardings, a tuple has one entry per non-static positional
    argument; a tuple with an entry for the static one too says that, under its own name."""
    s = ctl.slice((2, 2), axis_names=("d", "m"))
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)

    def f(a, n, b):
        return a * n + b

    ok = pw.function(f, slice=s, static_argnums=1, in_shardings=(P("d"), P()))(x, 2, x)
    np.testing.assert_array_equal(ok.result(60), x * 3)
    for kw in ("in_specs", "in_shardings"):
        with pytest.raises(pw.SpecError, match=(
                rf"{kw} must be .*\(2 here: the static ones \(at 1\) take no entry")):
            pw.function(f, slice=s, static_argnums=1, **{kw: (P("d"), None, P())})(x, 2, x)


def test_a_call_on_jax_tracers_is_a_nested_jit(ctl):
    """Inside jax.jit, jax.grad, jax.vmap or another pw.function's body, a pw.function is what
    a nested jax.jit is (its body, inline), and so is a pw.program."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)

    def scale(a, n):
        return jnp.sin(a) * n

    inner = pw.function(scale, slice=s, static_argnums=1, donate_argnums=0)
    plain = jax.jit(scale, static_argnums=1)
    outer = pw.function(lambda a: inner(a, 3) + 1, slice=s)
    np.testing.assert_allclose(outer(x).result(60), np.sin(x) * 3 + 1, rtol=1e-6)
    add = pw.function(lambda c, a: c + a, slice=s)  # a host constant before the tracer
    np.testing.assert_allclose(pw.function(lambda a: add(np.ones(4, np.float32), a), slice=s)(
        x).result(60), x + 1)
    np.testing.assert_allclose(jax.jit(lambda a: inner(a, 2))(x), plain(x, 2))
    np.testing.assert_allclose(jax.grad(lambda a: inner(a, 2).sum())(x),
                               jax.grad(lambda a: plain(a, 2).sum())(x), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(lambda a: inner(a, 2))(x), plain(x, 2))

    @pw.program
    def prog(a):
        return inner(a, 5)

    np.testing.assert_allclose(jax.jit(prog)(x), plain(x, 5))
    kept = jnp.asarray(x)
    jax.jit(lambda a: inner(a, 2))(kept)
    assert not kept.is_deleted()  # donation is for calls on the slice, as in a nested jit
    assert float(prog(x).result(60)[1]) == pytest.approx(np.sin(1.0) * 5)  # on the slice


def test_a_call_inside_a_trace_without_tracer_arguments_is_a_nested_jit(ctl):
    """A pw.function (or program) called inside jax.jit or another pw.function's body with no
    tracer among its arguments (no arguments, host constants, a closure's arrays) is a nested
    jax.jit too: its body inline, as jax.jit's is, not a program submitted while JAX traces."""
    s = ctl.slice(2)
    zeros = pw.function(lambda: jnp.zeros(4), slice=s)
    double = pw.function(lambda a: a * 2, slice=s)

    @pw.program
    def doubled_zeros():
        return double(zeros())

    host = np.arange(4.0, dtype=np.float32)

    def step(a):
        return a + zeros() + double(host) + doubled_zeros()

    want = jax.jit(lambda a: a + jnp.zeros(4) + jax.jit(lambda c: c * 2)(host))(host)
    with jax.set_mesh(s.mesh):
        under_mesh = jax.jit(step)(host)
    for got in (jax.jit(step)(host), under_mesh, pw.function(step, slice=s)(host).result(60)):
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_transformation_around_a_function_that_needs_its_mesh_says_what_to_do(ctl):
    """jax.grad, jax.jit or jax.vmap around a pw.function, with no mesh ambient, trace its body
    as a nested jax.jit: without the slice's mesh (which cannot be set inside a trace). A body
    that needs it (jax.shard_map with no mesh=, reshard to a PartitionSpec) fails there with
    JAX's own error, as a nested jax.jit's does, and a note naming the two ways that work."""
    s = ctl.slice(2)

    def total(a):
        return jax.shard_map(lambda b: b * 2, in_specs=P(), out_specs=P())(a).sum()

    def to_x(a):
        return jax.sharding.reshard(a, P("x")).sum()

    x = np.arange(8.0, dtype=np.float32)
    for fn in (total, to_x):
        f = pw.function(fn, slice=s)
        for transform in (jax.grad, jax.jit, jax.vmap):
            arg = x if transform is not jax.vmap else x.reshape(2, 4)
            with pytest.raises(ValueError) as caught:
                transform(f)(arg)
            note = "\n".join(getattr(caught.value, "__notes__", ()))
            assert f"pw.function(jax.grad({fn.__name__}), slice=...)" in note, (
                transform, note)
            assert "jax.set_mesh(f.slice.mesh)" in note
    f = pw.function(total, slice=s)  # both ways the note names
    np.testing.assert_array_equal(pw.function(jax.grad(total), slice=s)(x).result(60),
                                  np.full(8, 2.0))
    with jax.set_mesh(s.mesh):
        np.testing.assert_array_equal(jax.grad(f)(x), np.full(8, 2.0))
    with pytest.raises(TypeError) as caught:  # the body's own error: no note about meshes
        jax.grad(pw.function(lambda a: a.reshape(3).sum(), slice=s))(x)
    assert not any("mesh" in n for n in getattr(caught.value, "__notes__", ()))


def test_a_nested_call_on_auto_axes_keeps_its_shardings_as_a_nested_jit_does(ctl):
    """On auto axes a jax.jit called inside another lays its inputs and outputs out as its
    in_shardings/out_shardings say (the compiler propagates from there); a pw.function called
    inside a pw.function, or inside jax.jit under the slice's mesh, does the same with its
    shardings or specs (pw.BATCH included), on a mesh with its slice's axes."""
    s = ctl.slice((2, 2), axis_names=("x", "y"), axis_types="auto")
    on = functools.partial(NamedSharding, s.mesh)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    jitted = {"out": jax.jit(lambda a: a * 2, out_shardings=on(P("x", "y"))),
              "in": jax.jit(lambda a: a * 2, in_shardings=on(P(None, "y")))}
    placed = {"out": pw.function(lambda a: a * 2, slice=s, out_shardings=on(P("x", "y"))),
              "in": pw.function(lambda a: a * 2, slice=s, in_shardings=on(P(None, "y"))),
              "batch": pw.function(lambda a: a * 2, slice=s, in_specs=pw.BATCH)}
    jitted["batch"] = jax.jit(lambda a: a * 2, in_shardings=on(P(("x", "y"))))
    for which, inner in placed.items():
        with jax.set_mesh(s.mesh):
            want = jax.jit(lambda a, f=jitted[which]: f(a) + 1)(x)
            in_jit = jax.jit(lambda a, f=inner: f(a) + 1)(x)
        got = pw.function(lambda a, f=inner: f(a) + 1, slice=s)(x).result(60)
        assert want.sharding.spec != P()  # (the case shows something)
        for result in (got, in_jit):
            assert result.sharding.is_equivalent_to(want.sharding, 2), (
                f"{which}: {result.sharding.spec}; a nested jax.jit gives {want.sharding.spec}")
            np.testing.assert_array_equal(np.asarray(result), x * 2 + 1)
    other = ctl.slice((2, 2), axis_names=("x", "y"), axis_types="auto")
    got = pw.function(lambda a: placed["out"](a) + 1, slice=other)(x).result(60)
    np.testing.assert_array_equal(np.asarray(got), x * 2 + 1)  # (another slice's devices)
    assert got.sharding.is_equivalent_to(NamedSharding(other.mesh, P("x", "y")), 2)


def test_eval_shape_and_lower_as_jax_jit_has_them(ctl):
    """What a call would give (shapes, dtypes, shardings) and what it would run (the lowered
    computation), without running anything."""
    s = ctl.slice(4, island=0)

    def step(x, w, n):
        return {"y": jnp.tanh(x @ w) * n, "total": x.sum()}

    f = pw.function(step, slice=s, static_argnums=2, in_specs=(pw.BATCH, P()))
    x, w = np.ones((8, 4), np.float32), np.eye(4, dtype=np.float32)
    before = len(ctl.trace.events())
    shapes = f.eval_shape(x, w, 3)
    lowered = f.lower(x, w, 3)
    assert len(ctl.trace.events()) == before  # nothing ran
    assert "tanh" in lowered.as_text() and lowered.compile().memory_analysis() is not None
    assert len(f._cache) == 1 and len(f.lower(x, w, 4).as_text()) > 0 and len(f._cache) == 2
    out = f(x, w, 3)
    for struct, fut in zip(jax.tree.leaves(shapes), jax.tree.leaves(out), strict=True):
        assert (struct.shape, struct.dtype) == (fut.shape, fut.dtype)
        assert struct.sharding == fut.sharding == fut.result(60).sharding
    assert shapes["y"].sharding.spec == P("x", None)  # the batch, sharded as asked
    # ahead of time, as with jax.jit: ShapeDtypeStructs for arguments, and the compiled
    # computation returns the function's own result pytree
    structs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(
        w.shape, w.dtype, sharding=NamedSharding(s.mesh, P())))
    assert jax.tree.map(lambda v: v.shape, f.eval_shape(*structs, 3)) == \
        jax.tree.map(lambda v: v.shape, shapes)
    compiled = f.lower(*structs, 3).compile()
    placed = [jax.device_put(v, sh) for v, sh in zip((x, w), compiled.input_shardings[0],
                                                      strict=True)]
    ran = compiled(*placed)
    assert set(ran) == {"y", "total"} and float(ran["total"]) == 32.0
    with pytest.raises(pw.ProgramError, match="ShapeDtypeStruct, which has no value"):
        f(*structs, 3)
    with pw.Controller(backend="sim", islands=(8,)) as sim:  # simulated chips: lowered for them
        g = pw.function(lambda a: a @ a, slice=sim.slice(4))
        assert "dot" in g.lower(np.ones((64, 64), np.float32)).as_text()


def test_a_compiled_lowering_is_called_as_jax_jits_is(ctl):
    """``f.lower(*args, **kwargs).compile()`` takes the call's dynamic arguments as the
    caller passes them (pytrees, keywords; static ones left out) and says which it donates,
    as ``jax.jit``'s does."""
    s = ctl.slice(2)

    def step(params, x, n, *, scale=1.0):
        return {"y": (x @ params["w"] + params["b"]) * n * scale, "total": x.sum()}

    params = {"w": np.eye(4, dtype=np.float32), "b": np.ones(4, np.float32)}
    x = np.ones((2, 4), np.float32)
    with jax.set_mesh(s.mesh):
        jit_lowered = jax.jit(step, static_argnums=2).lower(params, x, 3, scale=2.0)
        want = jit_lowered.compile()(params, x, scale=2.0)
    f = pw.function(step, slice=s, static_argnums=2, donate_argnames="params")
    lowered = f.lower(params, x, 3, scale=2.0)
    assert lowered.in_tree == jit_lowered.in_tree
    (given, data), _ = lowered.args_info
    assert all(info.donated for info in jax.tree.leaves(given)) and not data.donated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (XLA reuses no donated buffer here, and says so)
        got = lowered.compile()(params, x, scale=2.0)
    jax.tree.map(np.testing.assert_allclose, got, want)


def test_donation_only_when_asked(ctl):
    s = ctl.slice(2)
    x = jax.device_put(jnp.ones(8), NamedSharding(s.mesh, P()))
    keep = pw.function(lambda a: a + 1, slice=s)
    keep(x).result(60)
    assert not x.is_deleted()
    give = pw.function(lambda a: a + 1, slice=s, donate_argnums=0)
    assert give(x).result(60).tolist() == [2.0] * 8
    assert x.is_deleted()  # the user asked for it
    y = jax.device_put(jnp.ones(8), NamedSharding(s.mesh, P()))
    pw.function(lambda a, b: a + b, slice=s, donate_argnames="b")(y, b=y * 1).result(60)
    assert not y.is_deleted()


def test_a_value_donated_already_fails_the_call_as_jax_jit_does(ctl):
    """A donating call given a buffer an earlier call consumed, or one it also reads, fails
    its futures with a RuntimeError that says so (this jaxlib's compiled call, and jax.jit on
    a sharded array, crash the process there), and the controller and other values carry on."""
    s = ctl.slice(2)
    f = pw.function(lambda x: x * 2, slice=s, donate_argnums=0)
    add = pw.function(lambda x, y: x + y, slice=s, donate_argnums=0)
    y = f(jnp.ones(8))
    assert f(y).result(60).tolist() == [4.0] * 8
    x = jax.device_put(jnp.ones(8), NamedSharding(s.mesh, P()))
    f(x).result(60)
    pending = f(jnp.ones(8))  # two donating calls on one value, the first not yet ended
    first, second = f(pending), f(pending)

    @pw.program
    def twice(v):
        return f(v), f(v)

    q = pw.function(lambda v: v + 1, slice=s)(jnp.arange(4.0))
    read = pw.function(lambda v: v + 1, slice=s)  # not donating, its executable run before
    v = pw.function(lambda v: v * 1, slice=s)(jnp.ones(8))
    read(v).result(60)
    f(v).result(60)
    for fut in (f(y), f(x), second, twice(jnp.ones(8))[1], add(q, q), read(v)):
        with pytest.raises(RuntimeError, match="deleted.*given to an earlier call that "
                           "donates|donates input 0 and also reads") as info:
            fut.result(60)
        assert isinstance(info.value, pw.ProgramError)
    assert first.result(60).tolist() == [4.0] * 8
    assert add(q, q * 1).result(60).tolist() == [2.0, 4.0, 6.0, 8.0]
    assert ctl.wait(60)


def test_a_gone_array_copied_to_another_island_fails_as_a_computations_input_does(ctl):
    """A user's array that was deleted, or donated to an earlier call, read on another
    island (or another slice: a copy first) fails its futures with the ProgramError that
    names it and the fix, as on its own slice, not with JAX's bare "Array has been deleted"."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    a = pw.function(lambda x: x * 2, slice=s0)
    b = pw.function(lambda x: x + 1, slice=s1)
    eat = pw.function(lambda x: x * 10, slice=s0, donate_argnums=0)

    @pw.program
    def two_islands(v):
        return b(a(v)), a(v)

    deleted = jax.device_put(jnp.ones(8), NamedSharding(s1.mesh, P()))
    deleted.delete()
    donated = jax.device_put(jnp.ones(8), NamedSharding(s0.mesh, P()))
    eat(donated).result(60)
    for fut in (*two_islands(deleted), b(donated), a(deleted)):
        with pytest.raises(RuntimeError, match="deleted.*donates it") as info:
            fut.result(60)
        assert isinstance(info.value, pw.ProgramError)
    assert two_islands(jnp.ones(8))[0].result(60).tolist() == [3.0] * 8
    assert ctl.wait(60)


def test_a_donated_value_with_a_host_view_of_one_shard_fails_the_next_call(ctl):
    """A host view kept of a replicated value (np.asarray of it, for a checkpoint: zero-copy on
    CPU) keeps its first shard from being donated: the array says it is not deleted while its
    other shard is gone, and XLA's call on it crashed the process. The call fails its futures
    instead, and the host copy stays good."""
    s = ctl.slice(2)
    init = pw.function(lambda: jnp.ones((4, 4)), slice=s, out_specs=P())
    step = pw.function(lambda w: w * 2, slice=s, donate_argnums=0)
    w = init()
    saved = np.asarray(w.result(60))
    assert step(w).result(60).tolist() == [[2.0] * 4] * 4
    with pytest.raises(RuntimeError, match="given to an earlier call that donates") as info:
        step(w).result(60)
    assert isinstance(info.value, pw.ProgramError)
    assert saved.tolist() == [[1.0] * 4] * 4 and step(init()).result(60).sum() == 32.0


def test_user_jax_arrays_survive_every_call(ctl):
    """The arrays a flax model's init or jnp.ones gives, passed as they are: alive after."""
    s = ctl.slice(4)
    key = jax.random.PRNGKey(0)
    w = jnp.ones((8, 8))
    f = pw.function(lambda k, w, x: jax.random.normal(k, x.shape) + x @ w, slice=s)
    f(key, w, np.ones((4, 8), np.float32)).result(60)
    np.asarray(key), np.asarray(w)  # neither was deleted


def test_plain_code_that_used_to_fail_under_the_defaults(ctl):
    s = ctl.slice(2)
    x = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
    fn = lambda x: jnp.tanh(x @ x.T) @ x  # noqa: E731
    got = pw.function(fn, slice=s)(x).result(60)
    np.testing.assert_allclose(got, jax.jit(fn)(x), rtol=1e-5)
    with jax.set_mesh(s.mesh):
        want = jax.jit(fn)(x)
    assert got.sharding.is_equivalent_to(want.sharding, 2)


def test_tracing_errors_name_the_inputs_who_chose_them_and_the_fix(ctl):
    s = ctl.slice(2)
    bad = pw.function(lambda x: float(x.sum()), slice=s, name="needs_value")
    with pytest.raises(pw.ProgramError) as info:
        bad(np.ones(4, np.float32))
    text = str(info.value)
    assert "needs_value could not be traced" in text
    assert "f32[4] P() (pwkernel's default: replicated)" in text
    assert "static_argnums" in text and text.count("\n") <= 3
    sharded = jax.device_put(np.ones((4, 4), np.float32), NamedSharding(s.mesh, P("x")))
    with pytest.raises(pw.ProgramError, match=r"kept from the argument"):
        pw.function(lambda x: float(x.sum()), slice=s)(sharded)

    def gated(x, scale, *, mode=1.0):  # JAX's own words name this function and its arguments
        return x * scale if mode > 0 else x

    with pytest.raises(pw.ProgramError, match="concrete value of argument mode") as info:
        pw.function(gated, slice=s)(np.ones(2, np.float32), 2.0, mode=1.0)
    cause = str(info.value.__cause__)
    assert f"function gated at {__file__}" in cause and "the argument mode" in cause

    def text(x):
        return "done"

    with pytest.raises(pw.ProgramError, match=f"function text at {__file__}"):
        pw.function(text, slice=s)(np.ones(2, np.float32))


@pytest.mark.parametrize("call, match", [
    (lambda ctl: ctl.slice(2.0), "positive int or a tuple of positive ints, got 2.0"),
    (lambda ctl: ctl.slice("2"), "positive int or a tuple"),
    (lambda ctl: ctl.slice(2, devices=[0, 0]), "distinct device ids"),
    (lambda ctl: ctl.slice(2, devices=[0, 5]), "not all on one island"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(1), in_specs="x"),
     "in_specs must be PartitionSpecs"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(2), in_shardings=jax.sharding.
                             SingleDeviceSharding(jax.devices()[0])),  # (one device: taken)
     "in_shardings takes NamedShardings, PartitionSpecs or None"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(1), in_specs=P(), in_shardings=P()),
     "give in_specs or in_shardings, not both"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(2), out_shardings=NamedSharding(
        jax.make_mesh((2,), ("data",)), P("data"))), "axis_names=\\('data',\\)"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(1), out_shardings=NamedSharding(
        ctl.slice(1).mesh, P(), memory_kind="pinned_host")), "Leave memory_kind unset"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(1), static_argnums="0"),
     "static_argnums must be ints"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.slice(1), name=3), "name must be a str"),
    (lambda ctl: pw.program(name=3), "pw.program's name must be a str, got int"),
    (lambda ctl: pw.function(lambda x: x, slice=ctl.islands[0]),
     "got Island. Maybe you want slice=ctl.slice\\(4, island=0\\)"),
    (lambda ctl: pw.function(lambda x: x), "needs slice=, the devices it runs on"),
    (lambda ctl: pw.function()(lambda x: x), "@pw.function.slice=ctl.slice.2.. with ctl"),
    (lambda ctl: pw.Controller(islands=4), "islands must be a sequence of positive"),
    (lambda ctl: pw.Controller(islands="4,4"), "Maybe you want islands=\\(4, 4\\)"),
    (lambda ctl: pw.program(5), "pw.program needs a callable .the function to trace., got int"),
    (lambda ctl: pw.program(name="p")(None), "got NoneType. Maybe you want @pw.program"),
    (lambda ctl: ctl.remap("s0"), "remap needs a VirtualSlice of this controller"),
])
def test_bad_arguments_get_one_line_that_names_the_expected_types(ctl, call, match):
    with pytest.raises((pw.PathwaysError, ValueError, TypeError), match=match) as info:
        call(ctl)
    assert "\n" not in str(info.value)


def test_slice_on_chosen_devices(ctl):
    s = ctl.slice(2, devices=[5, 7])
    assert s.island.id == 1 and s.device_ids == (5, 7)


def test_a_second_controller_over_live_devices_warns(ctl):
    with pytest.warns(pw.SharedDevicesWarning, match="already holds devices.*Maybe you want "
                      r"pw.controller\(\)"):
        other = pw.Controller(islands=(4, 4))
    other.close()
    with pytest.warns(pw.SharedDevicesWarning, match=r"pw.controller\(\) made it.*"
                      r"ctl.set_default\(\)"):  # (its advice is not pw.controller() again)
        made = pw.controller()
    made.close()
    ctl.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pw.Controller(islands=(4, 4)).close()  # the first one is closed: nothing shared


def test_a_chain_of_donating_calls_runs_ahead_and_ends(ctl):
    """Each call donates the state the previous one is still computing (as a jax.jit loop with
    donate_argnums does): every launch ends, with jax.jit's values."""
    s = ctl.slice(2)
    fn = lambda w: jnp.tanh(w @ w) + 0.5  # noqa: E731
    step = pw.function(fn, slice=s, donate_argnums=0)
    w = pw.function(lambda w: w * 1, slice=s)(np.full((64, 64), 1 / 64, np.float32))
    want = np.full((64, 64), 1 / 64, np.float32)
    for _ in range(20):
        w = step(w)
        want = jax.jit(fn)(want)
    np.testing.assert_allclose(np.asarray(w.result(60)), np.asarray(want), rtol=1e-5)
    assert ctl.wait(60)


def test_a_donating_call_on_a_copys_output_runs_behind_the_copy(ctl):
    """A donated input that a transfer makes (a value moved to the caller's slice, in a
    program and from the run before) is donated only once the copy has landed: every step
    ends, with jax.jit's values."""
    a = ctl.slice(2, island=0, devices=[0, 1])
    b = ctl.slice(2, island=0, devices=[2, 3])
    fn = lambda w: jnp.tanh(w @ w) + 0.5  # noqa: E731
    grow = pw.function(fn, slice=a)
    eat = pw.function(fn, slice=b, donate_argnums=0)

    @pw.program
    def step(w):
        return grow(eat(grow(w)))  # grow's output goes to b by a copy, which eat donates

    w = np.full((64, 64), 1 / 64, np.float32)
    want = w
    for _ in range(8):
        w = step(w)
        want = jax.jit(fn)(jax.jit(fn)(jax.jit(fn)(want)))
    np.testing.assert_allclose(np.asarray(w.result(60)), np.asarray(want), rtol=1e-5)
    assert ctl.wait(60)


@pytest.mark.parametrize("donate", [0, ()], ids=["donating", "plain"])
def test_a_call_is_launched_behind_its_running_producer(ctl, donate):
    """As jax.jit enqueues a call on a value still being computed (donated or not), so does
    pw.function: the submitting thread launches it at once (its end is watched on a fence,
    not on the buffer it donates), long before its producer ends."""
    s = ctl.slice(2)

    def heavy(w):
        for _ in range(12):
            w = jnp.tanh(w @ w)
        return w

    slow = pw.function(heavy, slice=s)
    step = pw.function(lambda w: w * 0.5, slice=s, donate_argnums=donate)
    w0 = np.full((1024, 1024), 1 / 1024, np.float32)
    slow(w0).result(60)  # compiled
    step(slow(w0)).result(60)
    produced = slow(w0)
    consumed = step(produced)
    assert consumed.producer.has_outputs and not produced.done()  # launched, producer running
    np.testing.assert_allclose(np.asarray(consumed.result(60)),
                               np.asarray(jax.jit(heavy)(w0)) * 0.5, rtol=1e-5)
    assert ctl.wait(60)


def test_a_call_that_relays_a_running_value_out_on_its_devices_is_launched_at_once(ctl):
    """A value being computed, replicated on a slice, given to a function that takes it
    sharded on the same devices (``in_specs``): the copy between the two layouts is queued
    behind its producer and the call returns at once. Before, ``jax.device_put`` from
    replicated to sharded on the same devices read the value first: the submitting thread
    waited for the producer's end (a gate held it until released)."""
    s = ctl.slice(2)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release, s.mesh), slice=s, in_specs=P("x"),
                       out_specs=P())  # (gathered: replicated)
    twice = pw.function(lambda x: x * 2, slice=s, in_specs=P("x"))
    host = np.arange(8.0, dtype=np.float32)
    release.set()
    twice(held(host)).result(60)  # compiled, and the copy's identity too
    release.clear()
    valve = threading.Timer(60, release.set)  # (bounds the old behaviour's wait)
    valve.start()
    try:
        produced = held(host)
        assert entered.wait(60)
        doubled = twice(produced)
        assert not release.is_set() and not produced.done()  # returned with the gate closed
        release.set()
        np.testing.assert_array_equal(np.asarray(doubled.result(60)), host * 2)
        assert doubled.sharding.spec == P("x")
    finally:
        release.set()
        valve.cancel()


def test_a_donating_call_behind_a_failing_host_callback_consumes_nothing(ctl):
    """A host callback's failure is known only when its computation ends (its outputs are
    ready before): a call that donates must not consume its inputs before then."""
    s = ctl.slice(2)
    go = threading.Event()

    def check(v):
        go.wait(60)  # the donating call is submitted before this check fails
        if not np.all(np.isfinite(v)):
            raise FloatingPointError("not finite")
        return v

    checked = pw.function(lambda x: jax.pure_callback(
        check, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s)
    update = pw.function(lambda w, g: w - g, slice=s, donate_argnums=0)
    w = pw.function(lambda w: w * 1, slice=s)(np.ones(4, np.float32))
    w.result(60)
    bad = np.array([1.0, np.nan, 0.0, 0.0], np.float32)
    failed = update(w, checked(bad))
    go.set()
    with pytest.raises(FloatingPointError, match="not finite"):
        failed.result(60)
    assert not w.result(60).is_deleted()  # nothing of w was donated
    np.testing.assert_array_equal(np.asarray(update(w, checked(np.ones(4, np.float32)))
                                             .result(60)), np.zeros(4, np.float32))
    assert ctl.wait(60)


def test_out_specs_over_a_result_with_none(ctl):
    f = pw.function(lambda x: (x * 2, None, {"a": x}), slice=ctl.slice(2),
                    out_specs=(P(), None, P()))
    y, nothing, d = f(np.ones(4, np.float32))
    assert nothing is None and y.result(60).tolist() == [2.0] * 4
    assert d["a"].result(60).tolist() == [1.0] * 4


@pytest.mark.parametrize("n", [3, 12])
def test_a_donating_call_behind_a_reader_of_a_host_callbacks_outputs_runs(ctl, n):
    """The donating call waits for its inputs' ends; their launch and end are seen in two
    threads, in either order, and it still becomes ready (it once waited for ever when the
    end was seen first)."""
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    hold = gate(entered, release)
    make = pw.function(lambda x: [hold(x) + i for i in range(n)], slice=s, name="make")
    total = pw.function(lambda leaves, x: sum(leaves) + x, slice=s, name="total")
    step = pw.function(lambda leaves: [a * 2 for a in leaves], slice=s, donate_argnums=(0,),
                       name="step")
    try:
        outs = make(np.ones(3, np.float32))
        assert entered.wait(60)
        result = total(outs[::-1], np.ones(3, np.float32))
        new = step(outs)
    finally:
        release.set()
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)),
                               np.full(3, n + sum(range(n)) + 1))
    for i, f in enumerate(new):
        np.testing.assert_allclose(np.asarray(f.result(timeout=60)), np.full(3, 2.0 * (1 + i)))


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4])
def test_sub_byte_integers_as_jax_jit_takes_them(ctl, dtype):
    """int4/uint4 in and out, across islands: XLA's compiled call wants them packed, the
    arrays JAX places are not (the runtime calls those through jax.jit's own call)."""
    def inc(v):
        return v + jnp.asarray(1, dtype)

    widen = pw.function(lambda v: v.astype(jnp.int8) * 2, slice=ctl.slice(2, island=1))
    f = pw.function(inc, slice=ctl.slice(2, island=0))
    x = jnp.arange(6, dtype=dtype)
    y = f(x)
    np.testing.assert_array_equal(np.asarray(y.result(60)), np.asarray(jax.jit(inc)(x)))
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(widen(y).result(60)),
                                  np.asarray(jax.jit(inc)(x)).astype(np.int8) * 2)


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
def test_float0_gradients_of_ints_as_jax_jit_takes_them(ctl, dispatch):
    """jax.grad(..., allow_int=True) gives an int leaf a float0 gradient (no data); jax.jit
    takes one as an argument, from the host or from an earlier call, and so does
    pw.function, alone or in a program whose other island reads it too."""
    state = {"w": np.ones(3, np.float32), "n": np.int32(3)}
    grad = jax.grad(lambda p: (p["w"] ** 2).sum() * p["n"], allow_int=True)

    def apply(p, g):
        return {"w": p["w"] - 0.1 * g["w"], "n": p["n"] + 1}

    want = jax.jit(apply)(state, jax.jit(grad)(state))
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    pg, pa = pw.function(grad, slice=s0), pw.function(apply, slice=s1)

    @pw.program
    def step(p):
        return pa(p, pg(p))

    g = pg(state, dispatch=dispatch)
    assert g["n"].dtype == jax.dtypes.float0
    for got in (pa(state, jax.jit(grad)(state), dispatch=dispatch), pa(state, g),
                step(state, dispatch=dispatch)):
        jax.tree.map(lambda u, v: np.testing.assert_array_equal(np.asarray(u.result(60)), v),
                     got, want)


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
def test_a_host_argument_is_read_when_the_call_is_made(ctl, dispatch):
    """jax.jit reads a NumPy argument during the call: refilling the buffer afterwards (a data
    loader reusing its batch) changes nothing, even while the call waits on its inputs; so
    does a NumPy constant a program captured, between two calls of its cached trace."""
    s = ctl.slice(1)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release), slice=s)
    add = pw.function(lambda a, b: a + b, slice=s)

    @pw.program
    def prog(v, w):
        return add(held(v), w)

    batch = np.ones(4, np.float32)
    direct = add(held(np.zeros(4, np.float32)), batch, dispatch=dispatch)
    via_program = prog(np.zeros(4, np.float32), batch, dispatch=dispatch)
    batch[:] = 100.0  # both wait for the gate: nothing has been uploaded on their behalf yet
    release.set()
    assert direct.result(60).tolist() == via_program.result(60).tolist() == [1.0] * 4

    bias = np.ones(4, np.float32)

    @pw.program
    def shifted(v):
        return add(v, bias)

    assert shifted(np.zeros(4, np.float32)).result(60).tolist() == [1.0] * 4
    bias[:] = 100.0
    assert shifted(np.zeros(4, np.float32)).result(60).tolist() == [1.0] * 4


def test_bad_static_arguments_raise_what_jax_jit_raises(ctl):
    """An unhashable static, an array given as a static (a future hashes by identity: it would
    compile, and be kept, once per future) and an argument both static and donated are
    ValueErrors, as under jax.jit; nothing is compiled or kept for them."""
    s = ctl.slice(2)
    scale = lambda x, n: x * n  # noqa: E731
    f, jf = pw.function(scale, slice=s, static_argnums=1), jax.jit(scale, static_argnums=1)
    x = jnp.arange(4.0)
    total = pw.function(lambda v: v.sum(), slice=s)(x)
    for bad in ([1, 2], np.ones(2), jnp.ones(2), total):
        if not isinstance(bad, pw.Future):
            with pytest.raises(ValueError):
                jf(x, bad)
        with pytest.raises(ValueError, match="static argument") as info:
            f(x, bad)
        assert isinstance(info.value, pw.ProgramError)
    assert not f._cache
    # inside a static container: an array is unhashable (named), a future is refused too
    # (it hashes by identity: it would compile, and be kept, once per future)
    with pytest.raises(ValueError, match="got a tuple holding a ArrayImpl"):
        f(x, (jnp.ones(2),))
    for _ in range(2):
        with pytest.raises(ValueError, match="holds a pw.Future"):
            f(x, (1, pw.function(lambda v: v.sum(), slice=s)(x)))
    counted = pw.program(lambda v, t: f(v, 2), static_argnums=1)
    with pytest.raises(ValueError, match="holds a pw.Future"):
        counted(x, (total,))
    assert not f._cache and not f._programs
    with pytest.raises(ValueError):
        jax.jit(scale, static_argnums=1, donate_argnums=1)
    with pytest.raises(ValueError, match="both static and donated"):
        pw.function(scale, slice=s, static_argnums=1, donate_argnums=1)


@dataclasses.dataclass(frozen=True)
class _Config:
    scale: object
    name: str = "cfg"


@pytest.mark.parametrize("static, says", [
    ((2, {"k": 3}), r"got a tuple holding a dict at \[1\]\. Maybe you want a tuple of \(key, "
                    r"value\) pairs, or a frozen dataclass, instead of a dict"),
    ({"a": [1]}, r"got a dict\. Maybe you want a tuple of \(key, value\) pairs"),
    ((1, (2, [3])), r"got a tuple holding a list at \[1\]\[1\]\. Maybe you want a tuple "
                    "instead of a list"),
    (_Config(np.ones(2)), r"got a _Config holding a ndarray at \.scale\. Maybe you want to "
                          "pass the array as an array argument"),
    (_Config({1, 2}), r"got a _Config holding a set at \.scale\. Maybe you want a frozenset"),
], ids=["dict-in-tuple", "dict", "nested-list", "array-in-dataclass", "set-in-dataclass"])
def test_an_unhashable_static_pytree_names_the_part_and_its_fix(ctl, static, says):
    """A static pytree that is unhashable (a ValueError, as under ``jax.jit``) names the part
    that makes it so, where it is, and the fix for that part (not a list's fix for a dict)."""
    f = pw.function(lambda x, c: x, slice=ctl.slice(2), static_argnums=1)
    with pytest.raises(ValueError, match=says) as info:
        f(np.ones(2, np.float32), static)
    assert isinstance(info.value, pw.ProgramError)
    with pytest.raises(ValueError):  # (what jax.jit raises for it)
        jax.jit(lambda x, c: x, static_argnums=1)(np.ones(2, np.float32), static)


def test_an_argument_that_is_no_array_is_named_with_its_fix(ctl):
    """A string or object given where jax.jit wants an array: a TypeError (as jax.jit's) that
    names the function, the argument and where in its pytree, counted as the caller wrote
    the call (static arguments included), and the fix."""
    s = ctl.slice(2)
    x = np.arange(4.0, dtype=np.float32)
    f = pw.function(lambda a, n, b, *, mode=None: a * n + b, slice=s, static_argnums=1,
                    name="step")
    cases = [((x, 2, "b"), {}, "argument 2 is of type str", "static_argnums=2"),
             ((x, 2, {"k": [x, object()]}), {}, r"argument 2\['k'\]\[1\] is of type object",
              "take it out of the pytree"),
             ((x, 2, x), {"mode": "fast"}, "argument 'mode' is of type str",
              "static_argnames='mode'")]
    for args, kwargs, where, fix in cases:
        with pytest.raises(TypeError) as info:
            f(*args, **kwargs)
        assert isinstance(info.value, pw.ProgramError)
        assert str(info.value).startswith("step: ") and "\n" not in str(info.value)
        assert re.search(where, str(info.value)) and fix in str(info.value)

    @pw.program
    def twice(a, label):
        return f(a, 2, a)

    with pytest.raises(pw.ProgramError, match="twice: argument 1 is of type str"):
        twice(x, "run")
    masked = np.ma.masked_array(x, mask=x > 1)  # jax.jit refuses it: its mask would be lost
    with pytest.raises(ValueError):
        jax.jit(lambda a: a * 2)(masked)
    with pytest.raises(ValueError, match=r"argument 0 is of type MaskedArray.*x\.filled"):
        pw.function(lambda a: a * 2, slice=s)(masked)
    with pytest.raises(pw.ProgramError, match="MaskedArray"):
        pw.program(lambda a: f(a, 2, masked))(x)  # (a constant the program captures)


@pytest.mark.parametrize("x64", [False, True])
def test_python_ints_are_typed_as_jax_types_them(ctl, x64):
    """A Python int is JAX's default int, weakly typed, or jax.jit's OverflowError where it
    does not fit (NumPy would have typed 2**63 uint64, and 2**64 not as an int at all)."""
    s = ctl.slice(2)
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        ident = pw.function(lambda a: a, slice=s)
        top = 2**63 - 1 if x64 else 2**31 - 1
        got = ident(top).result(60)
        assert got.dtype == (np.int64 if x64 else np.int32) and got.weak_type
        assert int(got) == top
        for big in (top + 1, 2**64, -2**70):
            with pytest.raises(OverflowError):
                jax.jit(lambda a: a)(big)
            with pytest.raises(OverflowError, match=f"Python int {big} does not fit"):
                ident(big)
            with pytest.raises(OverflowError):
                pw.program(lambda v, c=big: pw.function(lambda a, b: a + b, slice=s)(v, c))(1)
    finally:
        jax.config.update("jax_enable_x64", old)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_function_is_traced_again_when_jax_options_change(ctl, dispatch):
    """jax.jit traces again under a new jax_enable_x64, default matmul precision, threefry
    mode, dtype promotion rule (its cache key holds JAX's trace context); so does
    pw.function, instead of running what it traced before."""
    s = ctl.slice(2)
    ramp = pw.function(lambda: jnp.arange(3.0), slice=s)
    mix = pw.function(lambda a, b: a @ b, slice=s)
    a = np.ones((2, 2), np.float32)
    assert ramp(dispatch=dispatch).result(60).dtype == np.float32
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        assert ramp(dispatch=dispatch).dtype == np.float64
        assert ramp(dispatch=dispatch).result(60).dtype == np.float64
    finally:
        jax.config.update("jax_enable_x64", old)
    assert ramp(dispatch=dispatch).result(60).dtype == np.float32
    assert "HIGHEST" not in mix.lower(a, a).as_text()
    with jax.default_matmul_precision("highest"):
        assert "HIGHEST" in mix.lower(a, a).as_text()
        np.testing.assert_array_equal(mix(a, a, dispatch=dispatch).result(60), a @ a)
    # every option JAX keys its traces on: the random bits, the promotion rules, ...
    draw = pw.function(lambda: jax.random.uniform(jax.random.key(0), (4,)), slice=s)
    draw(dispatch=dispatch).result(60)
    with jax.threefry_partitionable(not jax.config.jax_threefry_partitionable):
        want = jax.jit(lambda: jax.random.uniform(jax.random.key(0), (4,)))()
        np.testing.assert_array_equal(draw(dispatch=dispatch).result(60), want)
    add, i, h = pw.function(lambda u, v: u + v, slice=s), np.ones(2, np.int32), np.ones(2, "f2")
    assert add(i, h, dispatch=dispatch).result(60).dtype == np.float16
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception, match="no available implicit dtype promotion") as jit:
            jax.jit(lambda u, v: u + v)(i, h)
        with pytest.raises(type(jit.value), match="no available implicit dtype promotion"):
            add(i, h, dispatch=dispatch)


def test_under_disable_jit_functions_and_programs_run_eagerly(ctl):
    """Under jax.disable_jit() jax.jit runs the function's Python on concrete values (to debug
    it with print and branches); so do pw.function and @pw.program (futures given are read)."""
    s = ctl.slice(2)
    seen = []

    def relu_sum(x, n):
        seen.append(type(x).__name__)
        return x.sum() * n if x.sum() > 0 else -x.sum()  # a Python branch: concrete values

    f = pw.function(relu_sum, slice=s, static_argnums=1)
    prog = pw.program(lambda v: f(f(v, 2) * np.ones(2, np.float32), 3))
    x = np.arange(4.0, dtype=np.float32)
    arrived = pw.function(lambda v: v + 1, slice=s)(x)
    with jax.disable_jit():
        with jax.set_mesh(s.mesh):
            want = jax.jit(relu_sum, static_argnums=1)(x, 2)
        assert float(f(x, 2)) == float(want) == 12.0
        assert float(f(arrived, 2)) == 20.0
        assert float(prog(x)) == 72.0
        assert not isinstance(pw.function(lambda v: v * 2, slice=s)(x), pw.Future)
    assert set(seen) <= {"ArrayImpl", "ndarray"}  # never a tracer
    assert isinstance(pw.function(lambda v: v * 2, slice=s)(x), pw.Future)  # compiled again

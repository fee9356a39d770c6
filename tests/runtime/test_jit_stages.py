"""What a ``jax.jit`` function offers beside its call, on ``pw.function`` and ``@pw.program``:
``trace``, ``clear_cache``, ``eval_shape``, the ``keep_unused``/``inline`` options, and clear
errors for what cannot apply to a function placed on a slice (``runtime/stages.py``)."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from tests.helpers.programs import gate


def test_trace_is_jax_jits_trace(ctl):
    """``f.trace(*args, **kwargs)`` is a ``jax.stages.Traced``: the same jaxpr, argument
    structure and result types as ``jax.jit``'s, its ``.lower()`` compiles to the same values,
    and the function's Python does not run again for it."""
    s = ctl.slice(2)
    ran = []

    def step(params, x, n, *, scale=1.0):
        ran.append(n)
        return {"y": jnp.tanh(x @ params["w"] + params["b"]) * n * scale, "total": x.sum()}

    params = {"w": np.eye(4, dtype=np.float32), "b": np.ones(4, np.float32)}
    x = np.ones((2, 4), np.float32)
    with jax.set_mesh(s.mesh):
        want = jax.jit(step, static_argnums=2).trace(params, x, 3, scale=2.0)
        want_values = want.lower().compile()(params, x, scale=2.0)
    f = pw.function(step, slice=s, static_argnums=2)
    f(params, x, 3, scale=2.0)
    calls = len(ran)
    got = f.trace(params, x, 3, scale=2.0)
    assert isinstance(got, jax.stages.Traced) and len(ran) == calls  # (traced once, before)
    assert str(got.jaxpr) == str(want.jaxpr) and got.in_tree == want.in_tree
    assert got.fun_name == want.fun_name == "step"
    assert jax.tree.map(lambda a: (a.shape, a.dtype), got.out_info) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), want.out_info)
    lowered = got.lower()
    assert lowered.as_text().startswith("module @jit_step")  # named as jax.jit names it
    jax.tree.map(np.testing.assert_allclose, lowered.compile()(params, x, scale=2.0),
                 want_values)
    with pw.Controller(backend="sim", islands=(8,)) as sim:  # simulated chips: traced too
        g = pw.function(lambda a: a @ a, slice=sim.slice(4))
        assert "dot_general" in str(g.trace(np.ones((64, 64), np.float32)).jaxpr)


def test_calling_a_trace_evaluates_it_under_the_slices_mesh(ctl):
    """Calling ``f.trace(*args)`` evaluates its jaxpr, as calling ``jax.jit``'s ``Traced``
    does, under the slice's mesh, which a ``jax.jit`` trace made under a mesh needs (the
    README's promise): the caller never set that mesh, so outside it the call failed with
    JAX's "only AbstractMesh exists" error. The mesh is the one it was traced on, even once
    the slice has moved."""
    s = ctl.slice(2, island=0)
    f = pw.function(lambda x, y: {"z": x * 2 + y}, slice=s)
    x, y = np.arange(4.0, dtype=np.float32), np.float32(1)
    traced = f.trace(x, y)
    assert isinstance(traced, jax.stages.Traced)
    np.testing.assert_allclose(traced(x, y)["z"], [1.0, 3.0, 5.0, 7.0])
    ctl.remap(s, island=1)
    np.testing.assert_allclose(traced(x, y)["z"], [1.0, 3.0, 5.0, 7.0])
    assert jax.sharding.get_abstract_mesh().empty  # (no mesh left ambient after the call)


def _reading_a_global(ctl):
    """A function reading a global, as ``jax.jit`` and ``pw.function``, each alone and called
    by an outer ``jax.jit`` / ``@pw.program``; and what the four give now."""
    scale = {"now": 1.0}

    def f(x):
        return x * scale["now"]

    jf, pf = jax.jit(f), pw.function(f, slice=ctl.slice(2))
    outer_jit = jax.jit(lambda x: jf(x) + 0)
    outer = pw.program(lambda x: pf(x))
    x = np.ones(2, np.float32)

    def values():
        return [float(jf(x)[0]), float(pf(x).result(60)[0]), float(outer_jit(x)[0]),
                float(outer(x).result(60)[0])]

    return scale, values, (jf, pf, outer_jit, outer)


def test_clear_cache_traces_again_as_jax_jits_does(ctl):
    """A function that reads a global keeps what it traced (as ``jax.jit`` does) until
    ``clear_cache()``; a program that called it keeps its own graph, as an outer ``jax.jit``
    keeps its trace, until its own ``clear_cache()``."""
    scale, values, (jf, pf, outer_jit, outer) = _reading_a_global(ctl)

    assert values() == [1.0] * 4
    scale["now"] = 2.0
    assert values() == [1.0] * 4  # traced before: the old global, under jax.jit too
    jf.clear_cache()
    pf.clear_cache()
    assert values() == [2.0, 2.0, 1.0, 1.0]  # the outer ones kept their traces
    outer_jit.clear_cache()
    outer.clear_cache()
    assert values() == [2.0] * 4


def test_cache_size_counts_specializations_as_jax_jits_does(ctl):
    """``_cache_size()``, what tests of ``jax.jit`` code read to see that a call compiled
    nothing new: one per shape, weak type and static value, and none after ``clear_cache()``."""
    s = ctl.slice(2)

    def scaled(x, n=2.0, *, times=1):
        return x * n * times

    jf = jax.jit(scaled, static_argnames="times")
    pf = pw.function(scaled, slice=s, static_argnames="times")
    calls = [((np.ones(3, np.float32),), {}), ((np.ones(4, np.float32),), {}),
             ((np.ones(3, np.float32), 3.0), {}), ((np.ones(3, np.float32), np.float32(3)), {}),
             ((np.ones(3, np.float32),), {"times": 2}), ((np.ones(3, np.float32),), {})]
    sizes = []
    for args, kwargs in calls:
        with jax.set_mesh(s.mesh):
            want = jf(*args, **kwargs)
        np.testing.assert_array_equal(pf(*args, **kwargs).result(60), want)
        sizes.append((jf._cache_size(), pf._cache_size()))
    assert [j for j, _ in sizes] == [p for _, p in sizes] == [1, 2, 3, 4, 5, 5]
    pf.clear_cache()
    assert pf._cache_size() == 0


def test_jax_clear_caches_clears_functions_and_programs_as_it_clears_jax_jits(ctl):
    """``jax.clear_caches()`` (what a notebook calls to see a changed global, or to give back
    executables' memory) clears every ``jax.jit``'s traces; it cleared no ``pw.function``'s,
    ``@pw.program``'s, nor the executables identical computations share, so they kept
    computing with the old global."""
    from pwkernel.runtime import compiled

    scale, values, (jf, pf, outer_jit, outer) = _reading_a_global(ctl)

    assert values() == [1.0] * 4
    assert compiled.kept() > 0
    scale["now"] = 2.0
    jax.clear_caches()
    assert compiled.kept() == 0
    assert values() == [2.0] * 4


def test_keep_unused_and_inline_as_jax_jit_takes_them(ctl):
    s = ctl.slice(2)
    x = np.ones((2, 4), np.float32)

    def f(x, unused):
        return x * 2

    def params(text: str) -> int:
        return text.split("func.func public @main(")[1].split(")")[0].count("%arg")

    with jax.set_mesh(s.mesh):
        want = [params(jax.jit(f, keep_unused=k).lower(x, x).as_text()) for k in (False, True)]
    kept = pw.function(f, slice=s, keep_unused=True)
    got = [params(pw.function(f, slice=s).lower(x, x).as_text()), params(kept.lower(x, x)
                                                                         .as_text())]
    assert got == want == [1, 2]
    assert kept(x, x).result(60).tolist() == (x * 2).tolist()
    # called on JAX tracers: inline=True puts the body's equations in the caller's trace
    # (JAX before 0.11), or keeps the call with its inline mode (later JAX inlines it later)
    def eqns(jaxpr):
        return [(e.primitive.name, e.params.get("inline")) for e in jaxpr.eqns]

    seen = []
    for inline in (False, True):
        jf, pf = jax.jit(jnp.sin, inline=inline), pw.function(jnp.sin, slice=s, inline=inline)
        want, got = jax.make_jaxpr(jf)(1.0), jax.make_jaxpr(lambda v, pf=pf: pf(v))(1.0)
        assert eqns(got) == eqns(want)
        seen.append(eqns(got))
    assert seen[0] != seen[1] and seen[0][0][0] == "jit"  # (so inline= reached the trace)
    with pytest.raises(ValueError, match="keep_unused must be True or False"):
        pw.function(f, slice=s, keep_unused="yes")


@pytest.mark.parametrize("option, fix", [
    ("device", "choose the devices with the slice"),
    ("backend", "choose the devices with the slice"),
    ("compiler_options", r"fn.lower\(\*args\).compile\(compiler_options\)"),
])
def test_jit_options_that_cannot_apply_say_what_to_use(ctl, option, fix):
    value = {"device": jax.devices()[0], "backend": "cpu",
             "compiler_options": {"xla_cpu_enable_fast_math": False}}[option]
    with pytest.raises(pw.ProgramError, match=f"{option}.*{fix}"):
        pw.function(jnp.sin, slice=ctl.slice(2), **{option: value})


def test_a_programs_eval_shape_and_why_it_has_no_lower(ctl):
    a = pw.function(lambda v: v * 2, slice=ctl.slice(2, island=0))
    b = pw.function(lambda v: (v + 1).astype(jnp.int32), slice=ctl.slice(2, island=1))

    @pw.program
    def f(v):
        x = a(v)
        return {"x": x, "y": b(x)}

    v = np.arange(4.0, dtype=np.float32)
    before = len(ctl.trace.events())
    shapes = f.eval_shape(v)
    assert len(ctl.trace.events()) == before  # nothing ran
    out = f(v)
    for struct, fut in zip(jax.tree.leaves(shapes), jax.tree.leaves(out), strict=True):
        assert (struct.shape, struct.dtype, struct.sharding) == \
            (fut.shape, fut.dtype, fut.sharding)
    assert jax.tree.map(lambda s: s.dtype, shapes) == jax.tree.map(
        lambda s: s.dtype, jax.eval_shape(lambda v: {"x": v * 2, "y": (v * 2 + 1).astype(
            jnp.int32)}, v))
    with pytest.raises(pw.ProgramError, match=r"not one computation.*fn.lower\(\*args\)"):
        f.lower(v)


def test_a_programs_trace_is_its_graph_and_says_so(ctl):
    """``prog.trace(*args)`` is the program's dataflow graph (a public contract); asked for
    what ``jax.jit``'s ``Traced`` has, it says where that is."""
    f = pw.function(jnp.sin, slice=ctl.slice(2))
    graph = pw.program(lambda v: f(v)).trace(np.ones(4, np.float32))
    assert any(isinstance(n, pw.runtime.graph.ComputeNode) for n in graph.nodes)
    with pytest.raises(AttributeError, match=r"dataflow graph.*fn.trace\(\*args\).jaxpr"):
        getattr(graph, "jaxpr")  # noqa: B009 - the attribute a Traced has
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(graph, "nope")  # noqa: B009


def test_a_programs_jit_options_are_refused_with_where_they_go(ctl):
    """Donation and shardings belong to the pw.functions a program calls; a misspelt keyword
    is Python's TypeError."""
    with pytest.raises(ValueError, match=r"donate_argnums= does not apply to a program.*"
                                         r"pw.function\(fn, slice=..., donate_argnums=...\)"):
        pw.program(lambda v: v, donate_argnums=0)
    with pytest.raises(ValueError, match="in_shardings= does not apply"):
        pw.program(in_shardings=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'static_argnum'"):
        pw.program(lambda v: v, static_argnum=0)


@pytest.mark.parametrize("dispatch", ["sequential", "parallel"])
def test_clear_cache_leaves_a_submitted_call_its_executable(ctl, dispatch):
    """A call already submitted runs what it was traced and compiled with, as a ``jax.jit``
    call in flight does: ``clear_cache()`` meanwhile does not run the function's Python
    again (in the dispatcher's thread) to launch it."""
    s = ctl.slice(2, island=0)
    entered, release = threading.Event(), threading.Event()
    first = pw.function(gate(entered, release, s.mesh), slice=s, in_specs=pw.BATCH)
    traced = []

    def double(x):
        traced.append(x.shape)
        return x * 2

    f = pw.function(double, slice=s)
    out = pw.program(lambda x: f(first(x)))(np.ones(4, np.float32), dispatch=dispatch)
    assert entered.wait(60)
    f.clear_cache()
    release.set()
    assert out.result(60).tolist() == [2.0] * 4
    assert len(traced) == 1


def test_eval_shape_and_trace_inside_a_program_as_inside_jax_jit(ctl):
    """Inside a program, ``fn.eval_shape``/``fn.trace``/``prog.eval_shape`` on concrete
    arrays or on the program's own values give what they give outside, as ``jax.jit``'s
    stages do inside an outer ``jax.jit``, and the program's trace goes on after them
    (it was lost: the next call inside the program was refused as given a ``Value``)."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    inc = pw.function(lambda x: x + 1, slice=s0)
    wide = pw.function(lambda x: jnp.concatenate([x, x]), slice=s1)

    @pw.program
    def pair(x):
        return inc(x), wide(x)

    seen = {}

    @pw.program
    def f(x):
        seen["host"] = inc.eval_shape(np.ones(3, np.int32))
        y = inc(x)
        seen["value"] = wide.eval_shape(y)
        seen["traced"] = wide.trace(y).out_info
        seen["program"] = pair.eval_shape(y)
        return wide(y)

    out = f(np.arange(2.0, dtype=np.float32))
    np.testing.assert_array_equal(out.result(), [1.0, 2.0, 1.0, 2.0])
    assert (seen["host"].shape, seen["host"].dtype) == ((3,), np.int32)
    for struct in (seen["value"], seen["traced"], seen["program"][1]):
        assert (struct.shape, struct.dtype, struct.sharding) == (
            out.shape, out.dtype, out.sharding)
    assert seen["program"][0].shape == (2,)
    # (its two calls and their inputs' moves: the stages added nothing to its graph)
    assert len(f.trace(np.arange(2.0, dtype=np.float32)).nodes) == 4


def test_stages_on_jax_tracers_as_jax_jits_take_them(ctl):
    """Inside ``jax.jit`` (on tracers) a ``pw.function``'s and a program's ``eval_shape``
    give the types the call gives there, as a nested ``jax.jit``'s does; ``trace``/``lower``
    say why they have nothing to give there (all raised a bare, empty ``Traced``)."""
    double = pw.function(lambda x: x * 2, slice=ctl.slice(2))
    prog = pw.program(lambda x: double(x))
    seen = {}

    def body(x):
        seen["fn"], seen["program"] = double.eval_shape(x), prog.eval_shape(x)
        seen["jit"] = jax.jit(lambda v: v * 2).eval_shape(x)
        for stage in (double.trace, double.lower, prog.trace):
            with pytest.raises(ValueError, match="given JAX tracers.*outside the transfor"):
                stage(x)
        return double(x)

    np.testing.assert_array_equal(jax.jit(body)(np.arange(3.0)), [0.0, 2.0, 4.0])
    for what in ("fn", "program"):
        assert (seen[what].shape, seen[what].dtype) == (seen["jit"].shape, seen["jit"].dtype)

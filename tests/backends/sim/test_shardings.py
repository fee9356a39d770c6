"""Output layouts on simulated chips: what a future's sharding says (and the bytes the
simulator counts on each chip) is what a real backend's compiled executable gives."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.backends.sim.program import propagated_specs

NESTED = {"a": P("data"), "b": {"c": P(None, "model"), "d": [P(("data", "model")), P()]}}


def layer(x):
    return {"a": x * 2, "b": {"c": x + 1, "d": [x - 1, x.sum()]}}


def run(ctl, how: str, types="auto"):
    """The outputs' specs and the bytes on island 0's chips once they exist."""
    s = ctl.slice((2, 2), island=0, axis_names=("data", "model"), axis_types=types)
    if how == "nested call":  # specs given per leaf, on a pw.function called inside another
        inner = pw.function(layer, slice=s, out_specs=NESTED)
        fn = pw.function(lambda x: inner(x), slice=s)
    elif how == "out_shardings":
        fn = pw.function(layer, slice=s, out_shardings=jax.tree.map(
            lambda p: NamedSharding(s.mesh, p), NESTED, is_leaf=lambda p: isinstance(p, P)))
    else:  # nothing given: the input's layout reaches the outputs (propagation)
        fn = pw.function(layer, slice=s, in_specs=P("data"))
    out = fn(np.ones((8, 8), np.float32))
    ctl.wait()
    specs = [tuple(o.sharding.spec) for o in jax.tree.leaves(out)]
    used = ctl.memory()
    return specs, [used[d] for d in ctl.islands[0].devices]


@pytest.mark.parametrize("how", ["nested call", "out_shardings", "inferred"])
def test_simulated_outputs_are_laid_out_as_on_a_real_backend(how):
    with pw.Controller(islands=(4, 4)) as real, pw.Controller(backend="sim") as simulated:
        want, got = run(real, how), run(simulated, how)
    assert got == want
    if how != "inferred":  # halves of two 8 x 8 float32s, a quarter of one, the sum
        assert want == ([("data",), (None, "model"), (("data", "model"),), ()],
                        [4 * (32 + 32 + 16 + 1)] * 4)
    else:
        assert want == ([("data",)] * 3 + [()], [4 * (32 * 3 + 1)] * 4)


def test_mixed_axis_types_lay_outputs_out_as_on_a_real_backend():
    """Explicit ``data``, auto ``model``: the types' spec where it says the same as XLA's
    propagation (``P('data', None)``), the propagated one where the auto axis adds to it."""
    with pw.Controller(islands=(4, 4)) as real, pw.Controller(backend="sim") as simulated:
        want, got = (run(c, "inferred", ("explicit", "auto")) for c in (real, simulated))
    assert got == want and want[0][0] == ("data", None)


def test_propagation_gives_xlas_layouts_and_none_where_it_leaves_one_open():
    """(``lower_for_chips`` replicates those, as the scalars above are.)"""
    mesh = jax.sharding.AbstractMesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((8, 8), np.float32, sharding=NamedSharding(mesh, P("x")))
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(lambda x: (x.T, x.sum(), np.float32(1))).trace(x).lower(
            lowering_platforms=("tpu",))
    assert propagated_specs(lowered, ("x",)) == [P(None, "x"), None, None]


def test_estimate_reads_batch_and_inferred_specs_as_pw_function_does():
    """``pw.sim.estimate``'s specs are "as in pw.function", but pw.BATCH and pw.INFERRED
    (at the top or as leaves of nested specs) failed with AttributeError: 'Batch' object has
    no attribute 'partitions'."""
    cluster = pw.sim.Cluster.preset("tpu-v4", chips=8)
    x = jax.ShapeDtypeStruct((512, 256), np.float32)

    def cost(in_specs, out_specs=None):
        return pw.sim.estimate(layer, x, cluster=cluster, mesh=4, in_specs=in_specs,
                               out_specs=out_specs)

    assert cost(pw.BATCH) == cost(P("x"))
    assert cost(P("x"), pw.INFERRED) == cost(P("x"))
    nested = {"a": pw.BATCH, "b": {"c": pw.INFERRED, "d": [P("x"), pw.BATCH]}}
    assert cost(P("x"), nested) == cost(P("x"), {"a": P("x"), "b": {"c": None,
                                                                    "d": [P("x"), P()]}})
    with pytest.raises(pw.sim.SimError, match="pw.BATCH.*size 6.*not divisible by 4"):
        pw.sim.estimate(layer, jax.ShapeDtypeStruct((6, 4), np.float32), cluster=cluster,
                        mesh=4, in_specs=pw.BATCH)


@pytest.mark.parametrize("fn", [lambda v: -v, lambda v: v, lambda v: v * 2],
                         ids=["negate", "identity", "times 2"])
def test_a_host_value_under_in_shardings_lays_outputs_out_as_on_a_real_backend(fn):
    """On explicit axes it is placed as in_shardings say and typed by itself (replicated), as
    jax.jit does: an output left to XLA keeps that placement or not (``-v`` keeps it)."""
    x = np.ones((8, 4), np.float32)
    got = []
    with pw.Controller(islands=(4, 4)) as real, pw.Controller(backend="sim") as simulated:
        for ctl in (real, simulated):
            f = pw.function(fn, slice=ctl.slice(4, island=0), in_shardings=P("x"))
            got.append((tuple(f(x).sharding.spec), tuple(f.eval_shape(x).sharding.spec)))
    assert got[0] == got[1] and len(set(got[0])) == 1


def _named_mesh_step(s, named: bool):
    """A psum in ``shard_map`` and a constraint, written with the slice's own ``Mesh``
    (``named``) or with none (the ambient one)."""
    mesh = {"mesh": s.mesh} if named else {}
    where = NamedSharding(s.mesh, P("data")) if named else P("data")

    def step(x):
        y = jax.shard_map(lambda u: jax.lax.psum(u, "model"), in_specs=P(None, "model"),
                          out_specs=P(), **mesh)(x)
        return jax.lax.with_sharding_constraint(y * 2, where)
    return pw.function(step, slice=s, in_specs=P(None, "model"))


def test_a_function_naming_the_slices_mesh_runs_as_one_naming_none():
    """``shard_map(..., mesh=slice.mesh)`` and ``NamedSharding(slice.mesh, ...)`` put the
    slice's ``Mesh`` of ``SimDevice``s in the traced equations; lowering it asked the
    stand-ins for a backend, so the function was refused ("'SimDevice' object has no attribute
    'client'", give sim_cost=). Now it is lowered on the slice's abstract mesh: the same
    layouts as on real chips, and the same duration as the function naming no mesh."""
    x = np.ones((8, 8), np.float32)
    specs, spans, values = [], [], []
    with pw.Controller(islands=(4, 4)) as real, pw.Controller(backend="sim") as simulated:
        for ctl in (real, simulated):
            s = ctl.slice((2, 2), island=0, axis_names=("data", "model"), axis_types="auto")
            for named in (True, False):
                out = _named_mesh_step(s, named)(x)
                ctl.wait()
                specs.append(tuple(out.sharding.spec))
                if ctl is real:
                    values.append(np.asarray(out.result()))
                else:
                    e = [e for e in ctl.trace.events() if e.kind == "compute"][-1]
                    spans.append(e.t_end - e.t_start)
        launch = simulated.executor.cluster.chip.launch_overhead
    assert specs == [("data",)] * 4 and np.allclose(values, 4.0)
    assert spans[0] == pytest.approx(spans[1], rel=1e-9) and spans[0] > launch


def test_estimate_types_its_mesh_as_asked():
    """estimate's axes are auto unless axis_types= says otherwise: a function written for a
    slice's default, explicit axes (a matmul with out_sharding=) is estimated with
    axis_types="explicit" (there was no way to ask)."""
    import jax.numpy as jnp

    from pwkernel.backends import sim

    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)

    def f(a, b):
        return jnp.matmul(a, b, out_sharding=P("data", "model"))

    kw = dict(cluster="tpu-v4", mesh=(2, 4), axis_names=("data", "model"),
              in_specs=(P("data"), P(None, "model")))
    assert sim.estimate(f, x, x, axis_types="explicit", **kw).flops == pytest.approx(
        2 * 1024**3 / 8)
    with pytest.raises(sim.SimError, match="could not lower f"):
        sim.estimate(f, x, x, **kw)
    with pytest.raises(pw.SliceError, match="must be 'explicit' or 'auto'"):
        sim.estimate(f, x, x, axis_types="manual", **kw)

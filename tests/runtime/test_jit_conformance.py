"""``pw.function(fn, slice=s)`` is ``jax.jit(fn)`` under ``jax.set_mesh(s.mesh)``: for every
plain function of ``tests/helpers/jit_cases.py`` (no sharding annotations), on 1-D and 2-D
slices with explicit and auto axes, the same values, dtypes, JAX types and shardings, or the
same error.

Each function runs on host (NumPy) inputs, which both replicate, and on inputs already laid
out on the slice's mesh (``P("x")`` on the leading axis, where it divides): jax.Arrays, and
pw.Futures, which both keep their sharding. Where JAX refuses a function (a sharding-in-types
error on explicit axes), pw.function refuses it with a ProgramError that carries JAX's cause;
``JAX_REFUSES`` lists those, so a change on either side shows up here.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from tests.helpers.jit_cases import CASES, inputs

SLICES = {  # the keyword arguments of ctl.slice
    "1d-explicit": dict(shape=4),
    "2d-explicit": dict(shape=(2, 2), axis_names=("x", "y")),
    "1d-auto": dict(shape=4, axis_types="auto"),
    "2d-auto": dict(shape=(2, 2), axis_names=("x", "y"), axis_types="auto"),
}
HOST, PLACED, FUTURES = "host", "placed", "futures"  # how the inputs come
# Host inputs on every slice; inputs on the mesh once per axis type (compiles are the cost)
VARIANTS = [(where, HOST) for where in SLICES] + [("2d-auto", PLACED), ("2d-explicit", FUTURES)]

# What plain jax.jit refuses with the data sharded P("x") on explicit axes (JAX's first words),
# on both explicit slices unless named.
_DOT = "dot_general operation with inputs"  # the result would use axis x twice
_RESHAPE = "This reshape is not supported"
_REFUSED = {
    "gram": _DOT,
    "gram_t": "Contracting dimensions are sharded and it is ambiguous",
    "tanh_chain": _DOT,
    "running_sum": "0th dimension of all xs should be replicated",
    "power_iteration": "scan body function carry input and carry output must have equal types",
    "first_row": "slicing on sharded dims",
    "cumsum0": "Input should be unsharded over the axis being reduced",
    "sorted0": "Arguments to sort must be unsharded over the sorting dimension",
    "reshaped": _RESHAPE,
    "transposed": (_RESHAPE, ("1d-explicit",)),  # (8@x, 8) -> (2, 4, 8) only divides on x=2
    "shaped": _RESHAPE,
    "affine": "mul operation with inputs",  # x[8@x, 8] * v[8@x]
    "gathered": "Use `.at[...].get(out_sharding=)`",
}
JAX_REFUSES = {
    (name, where, how): cause
    for name, refused in _REFUSED.items()
    for cause, wheres in [refused if isinstance(refused, tuple)
                          else (refused, ("1d-explicit", "2d-explicit"))]
    for where in wheres for how in (PLACED, FUTURES)
    if (where, how) in VARIANTS}

DATA = ("x", "v", "y", "i", "i8", "tree", "pair", "state")  # not weights, states or keys


@pytest.fixture(scope="module")
def slices():
    controller = pw.Controller(islands=(4, 4))
    try:
        yield {where: controller.slice(**kw) for where, kw in SLICES.items()}
    finally:
        controller.close()


def place(values: dict, mesh) -> dict:
    """The data on ``mesh``: each array leaf of the inputs named in ``DATA`` whose leading
    axis divides over mesh axis "x", as P("x")."""
    def put(leaf):
        if np.ndim(leaf) and np.shape(leaf)[0] % mesh.shape["x"] == 0:
            return jax.device_put(leaf, NamedSharding(mesh, P("x")))
        return leaf
    return {k: jax.tree.map(put, v) if k in DATA else v for k, v in values.items()}


@pytest.fixture(scope="module")
def laid_out(slices):
    """``laid_out(where, how)``: the inputs for that variant (made once per slice): host
    arrays, the data placed on the slice's mesh, or those as pw.Futures of a function on the
    slice (one identity over all the data, compiled once)."""
    host = inputs()  # here, not at import: collecting the tests starts no JAX backend
    made: dict = {}

    def get(where: str, how: str) -> dict:
        if how == HOST:
            return host
        if (where, how) not in made:
            s = slices[where]
            values = place(host, s.mesh)
            if how == FUTURES:
                data = {k: values[k] for k in DATA}
                values = {**values, **pw.function(lambda d: d, slice=s)(data)}
                assert all(isinstance(leaf, pw.Future) for leaf in jax.tree.leaves(
                    {k: values[k] for k in DATA}))
            made[where, how] = values
        return made[where, how]
    return get


def _params() -> list:
    """One test per function x (slice, inputs), with readable ids."""
    out = []
    for case in CASES:
        for where, how in VARIANTS:
            out.append(pytest.param(case, where, how, id=f"{case.name}-{where}-{how}"))
    return out


def check_leaf(what: str, fut, want) -> None:
    """One output: a Future whose metadata and value agree with plain jax.jit's array."""
    assert isinstance(fut, pw.Future), f"{what}: should be a pw.Future, is {type(fut)}"
    assert (fut.shape, fut.dtype) == (want.shape, want.dtype), (
        f"{what}: future is {fut.dtype}{list(fut.shape)}; jax.jit gives "
        f"{want.dtype}{list(want.shape)}")
    got = fut.result(timeout=60)
    assert isinstance(got, jax.Array), f"{what}: result() gave {type(got)}"
    assert jax.typeof(got) == jax.typeof(want), (
        f"{what}: type {jax.typeof(got)}; jax.jit gives {jax.typeof(want)}")
    for which, sharding in (("future", fut.sharding), ("result", got.sharding)):
        assert sharding.is_equivalent_to(want.sharding, want.ndim), (
            f"{what}: {which} laid out as {sharding}; jax.jit gives {want.sharding}")
    if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):  # a typed key: its key data
        got, want = jax.random.key_data(got), jax.random.key_data(want)
    if np.issubdtype(want.dtype, np.inexact):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=1e-5, atol=1e-5, err_msg=what)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=what)


@pytest.mark.parametrize("case, where, how", _params())
def test_pw_function_is_jit_on_the_slice(slices, laid_out, case, where, how):
    s = slices[where]
    values = laid_out(where, PLACED if how == FUTURES else how)  # jax.jit's inputs
    args, kwargs = case.call(values)
    static = dict(static_argnums=case.static_argnums, static_argnames=case.static_argnames)
    try:
        with jax.set_mesh(s.mesh):
            want = jax.jit(case.fn, **static)(*args, **kwargs)
    except Exception as e:  # what JAX refuses, pw.function must refuse the same way
        cause = JAX_REFUSES.get((case.name, where, how))
        assert cause is not None, f"jax.jit refused {case.source()} unexpectedly: {e}"
        first = str(e).strip().splitlines()[0]
        assert first.startswith(cause), first
        f = pw.function(case.fn, slice=s, **static)
        with pytest.raises(pw.ProgramError) as info:
            f(*args, **kwargs)
        assert type(e).__name__ in str(info.value) and first in str(info.value), (
            f"pw.function's error should carry JAX's cause {first!r}; got {info.value}")
        return
    assert (case.name, where, how) not in JAX_REFUSES, "jax.jit no longer refuses this case"
    if how == FUTURES:  # the same inputs, now as futures of a function on the slice
        args, kwargs = case.call(laid_out(where, how))
    got = pw.function(case.fn, slice=s, **static)(*args, **kwargs)
    assert jax.tree.structure(got) == jax.tree.structure(want), (
        f"{case.source()}: pytree {jax.tree.structure(got)}; jax.jit gives "
        f"{jax.tree.structure(want)}")
    for (path, fut), leaf in zip(jax.tree_util.tree_leaves_with_path(got),
                                 jax.tree.leaves(want), strict=True):
        check_leaf(f"{case.source()} on {where} ({how}){jax.tree_util.keystr(path)}", fut, leaf)


def test_the_table_covers_the_issue():
    """At least 30 functions, and the known refusals and bugs name real cases."""
    names = {case.name for case in CASES}
    assert len(names) == len(CASES) >= 30
    assert set(_REFUSED) <= names

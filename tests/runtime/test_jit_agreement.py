"""Corners where pw.function and @pw.program must do what jax.jit does under
``jax.set_mesh(slice.mesh)``: each test runs plain jax.jit on the same arguments beside them
and compares values, dtypes, weak types, shardings, or the kind of error."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw


def _jit(fn, mesh, args, **options):
    """What jax.jit gives under the slice's mesh: the result, or the error's type."""
    try:
        with jax.set_mesh(mesh):
            return jax.jit(fn, **options)(*args)
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e)


def _type(a) -> str:
    return str(jax.typeof(a))


def _arange(n=8):
    return np.arange(float(n), dtype=np.float32)


# (what the argument is, how to make it on (slice, other slice), in_shardings); each committed
# to a layout in_shardings disagrees with (devices aside, as jax.jit compares them)
DISAGREE = {
    "sharded, asked replicated": (lambda s, o: jax.device_put(
        _arange(), NamedSharding(s.mesh, P("x"))), P()),
    "replicated, asked sharded": (lambda s, o: jax.device_put(
        _arange(), NamedSharding(s.mesh, P())), P("x")),
    "on one device, asked sharded": (lambda s, o: jax.device_put(
        _arange(), s.mesh.devices.flat[0]), P("x")),
    "sharded on another slice, asked replicated": (lambda s, o: jax.device_put(
        _arange(), NamedSharding(o.mesh, P("x"))), P()),
}


@pytest.mark.parametrize("case", sorted(DISAGREE))
def test_in_shardings_that_disagree_with_a_committed_array_are_refused(ctl, case):
    s, o = ctl.slice(2, island=0), ctl.slice(2, island=1)
    make, spec = DISAGREE[case]
    x = make(s, o)
    assert x.committed
    assert issubclass(_jit(lambda v: v * 2, s.mesh, (x,), in_shardings=spec), ValueError)
    f = pw.function(lambda v: v * 2, slice=s, in_shardings=spec)
    with pytest.raises(ValueError, match=r"committed to its layout.*in_shardings asks for "
                       r".*jax.device_put\(x, NamedSharding\(slice.mesh, .*leave this "
                       r"argument's in_shardings out"):
        f(x)
    with pytest.raises(pw.SpecError):  # (a NamedSharding, as jax.jit's own example gives it)
        pw.function(lambda v: v * 2, slice=s, in_shardings=NamedSharding(s.mesh, spec))(x)
    moved = jax.device_put(x, NamedSharding(s.mesh, spec))  # the fix the error names
    assert np.array_equal(f(moved).result(60), _arange() * 2)


def test_a_future_is_committed_as_a_jax_jit_output_is(ctl):
    s = ctl.slice(2)
    y = pw.function(lambda v: v + 1, slice=s, out_shardings=P("x"))(_arange())
    jy = _jit(lambda v: v + 1, s.mesh, (_arange(),), out_shardings=P("x"))
    assert issubclass(_jit(lambda v: v * 2, s.mesh, (jy,), in_shardings=P()), ValueError)
    with pytest.raises(pw.SpecError, match="committed to its layout"):
        pw.function(lambda v: v * 2, slice=s, in_shardings=P())(y)


# arguments jax.jit takes with in_shardings P("x"): agreeing committed ones, and the ones it
# may move (uncommitted, host), typed as it types them
AGREE = {
    "numpy": lambda s, o: _arange(),
    "uncommitted": lambda s, o: jnp.arange(8.0),
    "sharded here": lambda s, o: jax.device_put(_arange(), NamedSharding(s.mesh, P("x"))),
    "sharded on another slice": lambda s, o: jax.device_put(
        _arange(), NamedSharding(o.mesh, P("x"))),
}


@pytest.mark.parametrize("case, spec", [(case, P("x")) for case in sorted(AGREE)]
                         + [("numpy", P()), ("uncommitted", P())])
def test_arrays_jax_jit_places_are_placed_and_typed_as_it_does(ctl, case, spec):
    s, o = ctl.slice(2, island=0), ctl.slice(2, island=1)
    x = AGREE[case](s, o)
    want = _jit(lambda v: v * 2, s.mesh, (x,), in_shardings=spec)
    value = pw.function(lambda v: v * 2, slice=s, in_shardings=spec)(x).result(60)
    assert np.array_equal(value, want)
    assert _type(value) == _type(want), (case, spec)
    assert value.sharding.spec == want.sharding.spec


# bodies whose output layout XLA chooses, from a host value placed by in_shardings P("x")
# and typed by itself (replicated): some keep the placement (float32[8@x,4]), some do not
LEFT_TO_XLA = {"negate": lambda v: -v, "sin": jnp.sin, "identity": lambda v: v,
               "times 2": lambda v: v * 2, "sum of rows": lambda v: v.sum(0)}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("case", sorted(LEFT_TO_XLA))
def test_a_host_value_under_in_shardings_is_placed_as_jax_jit_places_it(ctl, case, n):
    s, fn = ctl.slice(n, island=0), LEFT_TO_XLA[case]
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    want = _jit(fn, s.mesh, (x,), in_shardings=P("x"))
    f = pw.function(fn, slice=s, in_shardings=P("x"))
    value = f(x).result(60)
    np.testing.assert_array_equal(value, want)
    assert _type(value) == _type(want), (case, n)
    assert value.sharding.spec == want.sharding.spec, (case, n)
    told = f.eval_shape(x)  # (what the call's future says at once)
    assert (told.shape, told.dtype, told.sharding.spec) == (want.shape, want.dtype,
                                                            want.sharding.spec)
    with jax.set_mesh(s.mesh):  # traced and placed as jax.jit traces and places it
        jitted = jax.jit(fn, in_shardings=P("x"))
        assert f.trace(x).jaxpr.in_avals == jitted.trace(x).jaxpr.in_avals
        placed = jitted.lower(x).compile().input_shardings
    assert f.lower(x).compile().input_shardings == placed


def test_a_program_returns_a_float0_argument_as_jax_jit_does(ctl):
    """A float0 leaf (an int's gradient: no data) given to a program and returned as it is
    comes back as jax.jit gives it: a host array of float0 of its shape."""
    a = pw.function(lambda x: x * 2, slice=ctl.slice(2))
    t = np.zeros((3,), jax.dtypes.float0)
    want = jax.jit(lambda x, t: (x * 2, t))(_arange(3), t)
    y, u = pw.program(lambda x, t: (a(x), t))(_arange(3), t)
    assert np.array_equal(y.result(60), want[0])
    assert u.dtype == want[1].dtype == jax.dtypes.float0 and u.shape == want[1].shape
    value = u.result(60)
    assert value.dtype == jax.dtypes.float0 and value.shape == (3,)
    assert isinstance(value, np.ndarray) and not isinstance(value, jax.Array)
    assert value is not t
    # that future (no layout: float0 has no data) goes on into in_shardings as jax.jit's does
    g = pw.function(lambda x, t: (x, t), slice=ctl.slice(2), in_shardings=P())
    _, again = g(_arange(4), u)
    assert again.result(60).dtype == jax.dtypes.float0 and again.shape == (3,)


CONSTANTS = {
    "python float": lambda: 1.0,
    "python int": lambda: 3,
    "python bool": lambda: True,
    "python complex": lambda: 2j,
    "numpy scalar": lambda: np.float32(2.5),
    "numpy array": lambda: np.arange(3),
    "jax array": lambda: jnp.ones((2,), jnp.bfloat16),
}


@pytest.mark.parametrize("case", sorted(CONSTANTS))
def test_a_program_returns_constants_as_jax_jit_does(ctl, case):
    """A constant in a program's result (``return y, 1.0``) is an array, as jax.jit returns
    it: its dtype, weak type (a Python scalar's) and device."""
    a = pw.function(lambda x: x * 2, slice=ctl.slice(2))
    c = CONSTANTS[case]()
    want = jax.jit(lambda x: {"y": x * 2, "c": c})(_arange(2))["c"]
    got = pw.program(lambda x: {"y": a(x), "c": c})(_arange(2))["c"]
    assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)  # known at once
    value = got.result(60)
    assert isinstance(value, jax.Array)
    assert np.array_equal(value, want) and _type(value) == _type(want)
    assert value.sharding == want.sharding
    assert value is not c  # a new array, as jax.jit's (never the captured one)


def test_a_program_still_refuses_what_jax_jit_cannot_return(ctl):
    a = pw.function(lambda x: x * 2, slice=ctl.slice(2))
    with pytest.raises(pw.ProgramError, match="returned str 'label'"):
        pw.program(lambda x: (a(x), "label"))(_arange(2))


def test_a_weakly_typed_future_is_weak_wherever_jax_reads_its_type(ctl):
    """A future of a weakly typed value (``f(2.0)``) is weak where jnp reads the weak type of
    an argument (its ``aval``, as a jax.Array's): ``jnp.asarray`` keeps it, and it promotes
    as jax.jit's result does (a bfloat16 operand wins)."""
    s = ctl.slice(2)
    with jax.set_mesh(s.mesh):
        want = jax.jit(lambda x: x + 1)(2.0)
    got = pw.function(lambda x: x + 1, slice=s)(2.0)
    assert want.weak_type and got.weak_type
    assert jnp.result_type(got, jnp.bfloat16) == jnp.result_type(want, jnp.bfloat16)
    assert jnp.asarray(got).weak_type and jnp.array(got).weak_type
    assert _type(jnp.asarray(got)) == _type(jnp.asarray(want))
    key = pw.function(jax.random.split, slice=s)(jax.random.key(0))
    sharded = pw.function(lambda x: x * 2, slice=s, out_specs=P("x"))(_arange(4))
    for fut in (got, key, sharded):  # known before the value, and the value's own type
        assert fut.aval == jax.typeof(fut.result(60)), fut


# NumPy arrays of dtypes JAX has no type for: (dtype, what the error's fix says)
UNTYPED = {
    "big-endian float": (">f4", r"x\.astype\(x\.dtype\.newbyteorder\('='\)\)"),
    "big-endian int": (">i8", r"x\.astype\(x\.dtype\.newbyteorder\('='\)\)"),
    "long double": (np.longdouble, r"x\.astype\(np\.float64\)"),
    "object": (object, "static_argnums=0"),
    "datetime": ("datetime64[D]", "static_argnums=0"),
}


@pytest.mark.parametrize("case", sorted(UNTYPED))
def test_a_numpy_array_of_a_dtype_jax_does_not_take_is_named_with_its_fix(ctl, case):
    """jax.jit refuses a NumPy array of a dtype JAX has no type for (a TypeError), before
    tracing; so does pw.function, naming the argument, the dtype and the fix, whatever its
    body does with it (before, the body was traced and failed inside, or ran)."""
    dtype, fix = UNTYPED[case]
    x = np.zeros(4, dtype)
    with pytest.raises(TypeError):
        jax.jit(lambda a: a)(x)
    said = rf"a NumPy array of dtype {re.escape(str(x.dtype))}, which JAX has no type for"
    for body in (lambda a: a, lambda a: a * 2):
        f = pw.function(body, slice=ctl.slice(2))
        with pytest.raises(pw.ProgramError, match=rf"argument 0 is {said}.*{fix}"):
            f(x)
        with pytest.raises(pw.ProgramError, match=rf"argument 0 is {said}.*{fix}"):
            _calling(f)(x)
        if "static" not in fix:  # (a constant a program captures: no argument to make static)
            with pytest.raises(pw.ProgramError, match=rf"got an argument that is {said}.*{fix}"):
                _calling(f, x)(_arange(4))


def _calling(f, constant=None):
    """A program that calls ``f`` on its argument, or on ``constant`` (which it captures)."""
    return pw.program(lambda a: f(a if constant is None else constant))


def test_single_device_shardings_on_a_one_device_slice_are_taken_as_jax_jit_takes_them(ctl):
    """``jax.jit`` takes a ``SingleDeviceSharding`` on a one-device mesh (and refuses it on a
    larger one, as pwkernel does with a ``ValueError``); it was refused on any slice."""
    s = ctl.slice(1, island=0)
    one = jax.sharding.SingleDeviceSharding(s.mesh.devices.flat[0])
    for options in ({"out_shardings": one}, {"in_shardings": one}):
        y = pw.function(lambda v: v * 2, slice=s, **options)(_arange()).result()
        jy = _jit(lambda v: v * 2, s.mesh, (_arange(),), **options)
        assert np.array_equal(y, jy) and y.sharding.is_equivalent_to(jy.sharding, 1)
    two = ctl.slice(2, island=0)
    jerr = _jit(lambda v: v * 2, two.mesh, (_arange(),), out_shardings=one)
    with pytest.raises(jerr):
        pw.function(lambda v: v * 2, slice=two, out_shardings=one)(_arange())


@pytest.mark.parametrize("spec", [P(), P("x")])
def test_an_array_on_the_slices_devices_in_another_order_is_moved_onto_its_mesh(ctl, spec):
    # (not on the slice's mesh, so moved and replicated as from another slice; it raised
    # JAX's "incompatible devices" from pwkernel's own copy, which named no argument)
    s = ctl.slice(2, island=0)
    flipped = jax.make_mesh((2,), ("x",), devices=list(s.mesh.devices.flat)[::-1],
                            axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(_arange(), NamedSharding(flipped, P("x")))
    y = pw.function(lambda v: v * 2, slice=s, in_specs=spec)(x).result(60)
    np.testing.assert_array_equal(y, _arange() * 2)
    assert y.sharding.mesh == s.mesh and not x.is_deleted()
    assert y.sharding.is_equivalent_to(NamedSharding(s.mesh, spec), 1)

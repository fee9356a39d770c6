"""A future used as an index and through the array protocols other libraries read
(``runtime/arraylike.py``): what the jax.Array it holds gives, on a real controller."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from tests.helpers.programs import gate

TIMEOUT = 60.0


def test_a_future_indexes_a_jax_array_as_the_array_it_holds_does(ctl):
    """``x[i]``, ``x[mask]``, ``x[i, :]``, ``x.at[i].set(v)`` with ``i`` or ``mask`` a future,
    ``x`` a jax.Array or another future: the values the arrays give (before, JAX's indexing
    took a future for no index: an IndexError, or a bare AssertionError for a mask). One
    device: JAX mixes arrays on a mesh of more with ``x`` (on one) only under ``jax.set_mesh``."""
    s = ctl.slice(1)
    ident = pw.function(lambda a: a, slice=s)
    x = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)
    i, idx, mask = ident(np.int32(2)), ident(np.array([3, 0], np.int32)), ident(
        np.array([True, False, True, False]))
    fx = ident(np.asarray(x))
    cases = [(lambda a, k: a[k], i), (lambda a, k: a[k], idx), (lambda a, k: a[k], mask),
             (lambda a, k: a[k, 1:], i), (lambda a, k: a[:, 1][k], mask),
             (lambda a, k: a.at[k].set(-1.0), i), (lambda a, k: a.at[k].add(5.0), idx)]
    for index, key in cases:
        want = index(x, key.result())
        for arr in (x, fx):
            got = index(arr, key)
            assert isinstance(got, jax.Array)
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.arange(4)[i], 2)  # (NumPy takes its __index__ already)


def test_the_dlpack_and_array_api_surface_is_the_values(ctl):
    """``np.from_dlpack``, ``jax.dlpack.from_dlpack``, ``__array_namespace__``, ``device``,
    ``on_device_size_in_bytes``: what the jax.Array gives (before, an AttributeError)."""
    s = ctl.slice(1)
    fut = pw.function(lambda a: a * 2, slice=s)(np.arange(6, dtype=np.float32))
    value = fut.result()
    np.testing.assert_array_equal(np.from_dlpack(fut), np.from_dlpack(value))
    np.testing.assert_array_equal(jax.dlpack.from_dlpack(fut), value)
    assert fut.__array_namespace__() is value.__array_namespace__()
    assert fut.device == value.device
    assert fut.on_device_size_in_bytes() == value.on_device_size_in_bytes()
    assert fut.__dlpack_device__() == value.__dlpack_device__()


def test_a_failed_future_used_as_an_index_raises_its_error(ctl):
    s = ctl.slice(2)

    def fail(a):
        raise ValueError("no index here")

    bad = pw.function(lambda a: jax.pure_callback(fail, jax.ShapeDtypeStruct((), np.int32), a),
                      slice=s)(np.int32(1))
    with pytest.raises(ValueError, match="no index here"):
        jnp.arange(4)[bad]


def test_a_jax_operation_on_a_running_future_does_not_wait_for_it():
    """As JAX dispatches ``a + 1`` on an array still being computed, an operation on a future
    whose computation is launched (``total + loss``, ``jnp.mean``, a method, ``jax.jit``)
    returns at once, a ``jax.Array`` computed behind it: a training loop summing its losses
    runs ahead (before, each waited for its step). What gives a Python value still waits."""
    with pw.Controller(islands=(4,)) as c:
        s = c.slice(4)
        entered, release = threading.Event(), threading.Event()
        held = pw.function(gate(entered, release, s.mesh), slice=s, in_specs=pw.BATCH)(
            np.ones(4, np.float32))
        y = pw.function(lambda v: v * 2, slice=s, name="double")(held)  # launched behind it
        assert entered.wait(TIMEOUT)
        total = 0.0 + y          # each returns while the gate holds (before: they waited,
        m, k = jnp.mean(y), jax.jit(lambda v: v - 1)(y)  # and the gate timed out)
        r, big = y.sum(), y > 1.0
        assert not y.done() and all(isinstance(v, jax.Array) for v in (total, m, k, r, big))
        release.set()
        assert total.tolist() == [2.0] * 4 and float(m) == 2.0 and float(r) == 8.0
        assert k.tolist() == [1.0] * 4 and big.tolist() == [True] * 4
        assert float(y.sum() + 1) == 9.0  # (done by now: the value itself)


def test_an_operation_on_a_future_whose_host_callback_fails_raises_its_error():
    """A computation with host callbacks fails only at its end, so an operation on its
    future waits for it, and raises its error, as JAX's raises the callback's."""
    def fail(v):
        raise ValueError("callback failed")

    with pw.Controller(islands=(2,)) as c:
        bad = pw.function(lambda a: jax.pure_callback(
            fail, jax.ShapeDtypeStruct(a.shape, a.dtype), a), slice=c.slice(1))(np.ones(3))
        with pytest.raises(ValueError, match="callback failed"):
            bad + 1
        with pytest.raises(ValueError, match="callback failed"):
            jnp.sum(bad)

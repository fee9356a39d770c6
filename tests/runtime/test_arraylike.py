"""A future used as an index and through the array protocols other libraries read
(``runtime/arraylike.py``): what the jax.Array it holds gives, on a real controller."""

from __future__ import annotations

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw

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


def _slow(v):
    """A computation without host callbacks that keeps 4 CPU devices busy for a second or
    more: what a training step is to the host (its launch returns at once)."""
    return jax.lax.fori_loop(0, 150_000_000, lambda i, a: a * 1.0000001 + 1e-7, v)


def test_a_jax_operation_on_a_running_future_does_not_wait_for_it():
    """As JAX dispatches ``a + 1`` on an array still being computed, an operation on a future
    whose computation is launched (``total + loss``, ``jnp.mean``, a method, ``jax.jit``)
    returns at once, a ``jax.Array`` computed behind it: a training loop summing its losses
    runs ahead (before, each waited for its step). Its values are ``jax.jit``'s."""
    ops = (lambda v: 0.0 + v, jnp.mean, jax.jit(lambda v: v - 1), lambda v: v.sum(),
           lambda v: v > 1.0)
    x = np.ones(4, np.float32)
    with pw.Controller(islands=(4,)) as c:
        f = pw.function(_slow, slice=c.slice(4), in_specs=pw.BATCH)
        warm = f(x)
        jax.block_until_ready([op(warm) for op in ops])  # (compiled: the ops below dispatch)
        y = f(x)
        got = [op(y) for op in ops]
        assert not y.done() and y.lent  # each returned while the step ran
        assert all(isinstance(v, jax.Array) for v in got)
        want = [op(jax.jit(_slow)(x)) for op in ops]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_an_array_an_operation_returns_as_it_is_survives_its_future_and_controller():
    """``jnp.asarray(fut)``, ``fut.astype(fut.dtype)`` and ``fut[...]`` while the computation
    runs return the very array it launched, as JAX's do; it is the user's from then on, as
    ``result()``'s is: neither the future's going nor ``close()`` deletes it (before: both
    did, "Array has been deleted")."""
    x = np.ones(4, np.float32)
    want = np.asarray(jax.jit(_slow)(x))
    c = pw.Controller(islands=(4,))
    f = pw.function(_slow, slice=c.slice(4), in_specs=pw.BATCH)
    y = f(x)
    same = [jnp.asarray(y), y.astype(y.dtype), y[...]]
    assert y.lent
    z = f(x)
    kept = jnp.asarray(z)
    del y
    gc.collect()
    for a in same:
        np.testing.assert_array_equal(np.asarray(a), want)
    c.close()
    np.testing.assert_array_equal(np.asarray(kept), want)


def test_an_operation_behind_a_failing_host_callback_raises_its_error():
    """A computation launched behind one with host callbacks computes on the zeros pwkernel
    gives XLA if a callback fails (its failure shows only at its end), so an operation on its
    future waits and raises that error, as JAX's raises the callback's (before: a value of
    zeros, silently, while the future itself raised)."""
    entered, release = threading.Event(), threading.Event()

    def fail(v):
        entered.set()
        release.wait(TIMEOUT)
        raise ValueError("callback failed")

    with pw.Controller(islands=(4,)) as c:
        s = c.slice(4)
        spec = P(s.mesh.axis_names)
        bad = jax.shard_map(lambda a: jax.pure_callback(
            fail, jax.ShapeDtypeStruct(a.shape, a.dtype), a), mesh=s.mesh, in_specs=spec,
            out_specs=spec)
        loaded = pw.function(bad, slice=s, in_specs=pw.BATCH)(np.ones(4, np.float32))
        y = pw.function(lambda v: v * 2 + 5, slice=s)(loaded)
        assert entered.wait(TIMEOUT)
        y.on_launch(lambda _: release.set())  # (launched behind it, or failed with it)
        with pytest.raises(ValueError, match="callback failed"):
            y + 1
        with pytest.raises(ValueError, match="callback failed"):
            jnp.mean(y)


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

"""JAX's configuration around pw.function calls, as jax.jit reads it: transfer guards."""

from __future__ import annotations

import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from tests.helpers.programs import gate


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
@pytest.mark.parametrize("level", ["disallow", "disallow_explicit"])
def test_a_transfer_guard_refuses_the_implicit_transfers_jax_jit_refuses(ctl, dispatch, level):
    """Under jax.transfer_guard("disallow"), jax.jit refuses a host argument (NumPy, a Python
    scalar) and an uncommitted array it would move onto its devices; so does pw.function, in
    either dispatch mode (the runtime's own uploads are explicit device_puts, made in other
    threads under sequential dispatch), and nothing is submitted. Placed arguments pass."""
    s = ctl.slice(2)
    f = pw.function(lambda x: x * 2, slice=s)
    keep = pw.program(lambda a, b: (f(a), b))
    x = np.arange(4.0, dtype=np.float32)
    placed = jax.device_put(x, NamedSharding(s.mesh, P()))
    f(x, dispatch=dispatch).result(60)  # (traced and compiled outside the guard)
    with jax.transfer_guard(level):
        for arg in (x, 2.0, jnp.arange(4.0)):
            with jax.set_mesh(s.mesh), pytest.raises(jax.errors.JaxRuntimeError) as jit:
                jax.jit(lambda v: v * 2)(arg)
            with pytest.raises(type(jit.value), match="Disallowed .* transfer.*argument leaf 0"):
                f(arg, dispatch=dispatch)
        with pytest.raises(jax.errors.JaxRuntimeError, match="host-to-device.*leaf 1"):
            keep(placed, x, dispatch=dispatch)  # a host argument returned as it is
        np.testing.assert_array_equal(f(placed, dispatch=dispatch).result(60), x * 2)
        np.testing.assert_array_equal(f(f(placed), dispatch=dispatch).result(60), x * 4)
    assert not ctl.runs() or ctl.wait(60)
    np.testing.assert_array_equal(f(x, dispatch=dispatch).result(60), x * 2)


def test_a_logging_transfer_guard_logs_a_host_argument_as_jax_jit_does(ctl, caplog):
    s = ctl.slice(2)
    f = pw.function(lambda x: x + 1, slice=s)
    with jax.transfer_guard("log"), caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(f(np.zeros(2, np.float32)).result(60), np.ones(2))
    assert any("host-to-device transfer" in r.getMessage() for r in caplog.records)


def test_copies_between_slices_under_a_guard_fail_at_the_call_whatever_thread_copies(ctl):
    """The runtime's copies between slices are explicit transfers (jax.device_put's): let
    through under "disallow", refused under "disallow_explicit" at the call, even where
    the copy would start later from another thread (its source still running), where the
    caller's guard is not set and the copy went through."""
    s0, s1 = ctl.slice(1), ctl.slice(2, island=1)
    entered, release = threading.Event(), threading.Event()
    slow = pw.function(gate(entered, release), slice=s0)
    g = pw.function(lambda v: v + 1, slice=s1)
    prog = pw.program(lambda v: g(slow(v)))
    x = jax.device_put(np.arange(4.0, dtype=np.float32), NamedSharding(s0.mesh, P()))
    release.set()
    np.testing.assert_array_equal(prog(x).result(60), x + 1)
    release.clear()
    with jax.transfer_guard("disallow"):
        y = prog(x)  # (its copy starts when slow ends, in another thread)
    release.set()
    np.testing.assert_array_equal(y.result(60), x + 1)
    release.clear()
    entered.clear()
    try:
        with jax.transfer_guard("disallow_explicit"):
            with pytest.raises(jax.errors.JaxRuntimeError,
                               match="device-to-device.*a copy between slices"):
                prog(x)
        assert not entered.is_set()  # nothing of it ran
    finally:
        release.set()

"""A computation that fails while it runs (not when it is launched) fails its futures.

XLA's CPU client reports such an error only on the launch's outputs: they are *ready*, and
reading them raises. The cumulative sum below asks for a temporary buffer larger than any
address space (2**48 bytes), so the allocation fails on every machine, at run time (the call
itself returns at once)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw

TIMEOUT = 60.0


def too_big(x):
    return jnp.cumsum(jnp.full((2**45,), x[0]))[-1:] + x


def test_plain_jax_fails_this_at_run_time_not_at_the_call():
    out = jax.jit(too_big)(np.ones(1, np.float32))  # (the premise of the tests below)
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        out.block_until_ready()


@pytest.mark.parametrize("devices", [1, 4])
def test_a_run_time_failure_fails_the_future_and_the_controller_carries_on(ctl, devices):
    s = ctl.slice(devices, island=0)
    f = pw.function(too_big, slice=s, name="too_big")
    for _ in range(3):  # (the fast path, and the watcher's, whichever sees it)
        fut = f(np.ones(1, np.float32))
        assert fut.wait(TIMEOUT)
        assert isinstance(fut.exception(), jax.errors.JaxRuntimeError)
        with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
            fut.result()
    double = pw.function(lambda x: x * 2, slice=s)
    assert double(np.ones(4, np.float32)).result(TIMEOUT).tolist() == [2.0] * 4


def test_a_run_time_failure_fails_what_reads_it_in_a_program(ctl):
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    f = pw.function(too_big, slice=s0, name="too_big")
    g = pw.function(lambda y: y + 1, slice=s1, name="g")

    @pw.program
    def prog(x):
        y = f(x)
        return y, g(y)

    y, z = prog(np.ones(1, np.float32))
    # (``z``'s copy of ``y`` fails with XLA's own wording of the same error when ``y`` was
    # seen ready at once, its error read only from its outputs)
    for fut in (y, z):
        with pytest.raises(jax.errors.JaxRuntimeError, match="Out of memory allocating"):
            fut.result(TIMEOUT)
    assert y.run.wait(TIMEOUT)

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
from pwkernel.backends.local import LocalBackend

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


def too_big_with_siblings(x, n):
    """A float0 (the gradient of an int: a host value no launch computes) first, then two
    outputs of the failing launch."""
    zero = jax.grad(lambda n: jnp.float32(0.0), allow_int=True)(n)
    y = too_big(x)
    return zero, y, y * 2


@pytest.mark.parametrize("devices", [1, 4])
def test_every_output_of_a_launch_that_failed_while_it_ran_fails(ctl, devices):
    f = pw.function(too_big_with_siblings, slice=ctl.slice(devices, island=0), name="f")
    for _ in range(3):  # (the fast path, and the watcher's, whichever sees it)
        zero, y, y2 = f(np.ones(1, np.float32), np.int32(3))
        assert zero.wait(TIMEOUT)  # asked first (a host value says nothing of the launch;
        zero.exception()  # failed with it where its end was seen on the launch's fence)
        for fut in (y, y2):
            with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
                fut.result(TIMEOUT)
            assert isinstance(fut.exception(), jax.errors.JaxRuntimeError)


class AskCounting(LocalBackend):
    """The local backend, counting how often the runtime asks a value for its error."""

    asked = 0

    def failure(self, value):
        AskCounting.asked += 1
        return LocalBackend.failure(value)


def test_a_launch_is_asked_for_its_error_once_not_once_per_output():
    # A training step's state has dozens of outputs, all read when a loop waits for its step:
    # asking each waits on it, letting the GIL go and taking it back, per output.
    ctl = pw.Controller(backend=AskCounting(islands=(4, 4)))
    try:
        step = pw.function(lambda tree: jax.tree.map(lambda v: v + 1, tree),
                           slice=ctl.slice(4, island=0))
        state = step({str(i): np.zeros(8, np.float32) for i in range(20)})
        AskCounting.asked = 0
        values = [fut.result(TIMEOUT) for fut in state.values()]
        assert [float(v[0]) for v in values] == [1.0] * 20
        assert AskCounting.asked == 1
    finally:
        ctl.close()


def test_too_few_accelerators_names_every_way_out():
    """``pw.Controller()`` (islands (4, 4)) on one GPU: the error says islands=None, a size
    that fits, and JAX_PLATFORMS=cpu for virtual CPU devices (the tutorials' two islands)."""
    from pwkernel.backends.local.devices import _too_few_accelerators

    says = _too_few_accelerators((4, 4), 1, "gpu")
    assert says.startswith("islands=(4, 4) need 8 gpu devices but this process sees 1.")
    for way in ("islands=None", "islands=(1,)", "PWKERNEL_ISLANDS=1", "JAX_PLATFORMS=cpu"):
        assert way in says, way

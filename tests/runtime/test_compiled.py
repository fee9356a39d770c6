"""XLA compiles an identical computation once (``runtime/compiled.py``): a function made again,
or a cell run again, reuses the executable; anything that changes the computation, its
constants, its devices or its types compiles anew."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime import compiled

kept = compiled.kept


def test_a_function_made_again_reuses_its_executable_and_nothing_else_does(ctl):
    compiled.clear()
    s, other = ctl.slice(2, island=0), ctl.slice(2, island=1)
    x = np.arange(4.0, dtype=np.float32)

    def make(c, where=s):
        return pw.function(lambda v: v * c + 1, slice=where)

    assert make(2.0)(x).result(60).tolist() == [1.0, 3.0, 5.0, 7.0]
    assert kept() == 1
    assert make(2.0)(x).result(60).tolist() == [1.0, 3.0, 5.0, 7.0]  # made again: reused
    assert kept() == 1
    assert make(3.0)(x).result(60).tolist() == [1.0, 4.0, 7.0, 10.0]  # another constant
    assert make(2.0, other)(x).result(60).tolist() == [1.0, 3.0, 5.0, 7.0]  # other devices
    assert kept() == 3
    weak, strong = make(2.0)(3.0), make(2.0)(jnp.float32(3.0))  # the same HLO, other types
    assert weak.result(60).weak_type and not strong.result(60).weak_type
    assert float(weak) == float(strong) == 7.0


def test_layouts_spelled_differently_keep_their_own_executables(ctl):
    # P() and P(None, None) lower to the same HLO; the executable gives its outputs the
    # spelling it was compiled with, and jax.jit's result has the one its out_shardings say
    compiled.clear()
    s = ctl.slice(2, island=0)
    x = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    for spec in (P(), P(None, None), P("x"), P("x", None)):
        y = pw.function(lambda v: v + 1, slice=s, in_specs=spec, out_specs=spec)(x)
        assert y.sharding.spec == spec
        assert y.result(60).sharding.spec == spec  # as jax.jit(..., out_shardings=) gives it


def test_an_executable_is_named_after_its_function_as_jax_jit_names_it(ctl, caplog):
    """XLA's module, what jax.log_compiles, profiler traces and the persistent compilation
    cache show, is jit_<name> as under jax.jit (every pw.function compiled as 'fenced')."""
    compiled.clear()
    s = ctl.slice(2, island=0)

    def my_step(v):
        return jnp.tanh(v) * 2

    def with_callback(v):
        jax.debug.callback(lambda _: None, v)
        return v + 1

    x = np.arange(4.0, dtype=np.float32)
    with jax.log_compiles(), caplog.at_level("WARNING"):
        pw.function(my_step, slice=s)(x).result(60)
        pw.function(with_callback, slice=s)(x).result(60)
    said = caplog.text
    assert "Finished XLA compilation of jit(my_step)" in said, said
    assert "Finished XLA compilation of jit(with_callback)" in said, said
    assert "jit(fenced)" not in said and "jit(guarded)" not in said

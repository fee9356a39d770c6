"""A long run's mishaps: a NaN under ``jax_debug_nans``, against plain JAX's losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw
from tests.train.test_train import plain_jax_losses

LR = 0.1


def layer(n: int):
    return pw.train.Stage(init=lambda key: {"w": jax.random.normal(key, (n, n)) / n},
                          apply=lambda p, x: jnp.tanh(x @ p["w"]))


def mse(out, y):
    return jnp.mean((out - y) ** 2)


@pytest.fixture
def debug_nans():
    jax.config.update("jax_debug_nans", True)
    try:
        yield
    finally:
        jax.config.update("jax_debug_nans", False)


@pytest.mark.parametrize("kind", ["spmd", "pipeline"])
def test_a_nan_under_jax_debug_nans_fails_the_step_and_training_goes_on(tctl, debug_nans,
                                                                          kind):
    """Under ``jax_debug_nans`` a step whose values turn NaN fails with ``FloatingPointError``,
    as a ``jax.jit`` step does, also once tracing has entered a ``jax.debug_nans(False)``
    block on the launching thread (JAX's own check is then skipped there: before, the loss
    came back NaN and the NaN state trained on); the state it was given trains on (JAX does
    not donate under ``jax_debug_nans``) with plain JAX's losses."""
    stages = [layer(4), layer(4)]
    if kind == "spmd":
        trainer = pw.train.SPMD(stages, tctl.slice(2, island=0), loss=mse,
                                optimizer=optax.sgd(LR), name="dbgnan")
    else:
        trainer = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                                    loss=mse, optimizer=optax.sgd(LR), microbatches=2,
                                    name="dbgnanpipe")
    rng = np.random.default_rng(0)
    good = [(rng.standard_normal((4, 4), np.float32), rng.standard_normal((4, 4), np.float32))
            for _ in range(2)]
    bad = (good[1][0].copy(), good[1][1])
    bad[0][1, 1] = np.nan
    with jax.debug_nans(False):  # (as jnp.var's, jnp.sort's or jaxpr_as_fun's traces do)
        pass
    state = pw.train.wait(trainer.init(0))
    params0 = jax.device_get(pw.train.fetch(state.params))
    state, loss0 = trainer.step(state, good[0])
    state = pw.train.wait(state)
    failed, loss_bad = trainer.step(state, bad)
    with pytest.raises(FloatingPointError, match="nan"):
        loss_bad.result(timeout=60)
    state, loss1 = trainer.step(state, good[1])
    want, _ = plain_jax_losses(stages, params0, good, opt=optax.sgd(LR), loss=mse)
    np.testing.assert_allclose([float(loss0), float(loss1)], want, rtol=1e-5)

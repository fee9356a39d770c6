"""A pipeline stage's running gradient sum over microbatches: one gradient's bytes, not two.

Each backward after a stage's first donates the running sum it adds to (the step's own
value, never the user's: the first backward is given the parameters for their shapes only,
and does not donate them), so XLA writes the new sum over the old one. The losses stay plain
``jax.jit``'s (tests/train/test_train.py compares them on the tests' Transformer).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pwkernel as pw
from tests.train.test_train import plain_jax_losses

W = 256  # a stage is one (W, W) float32 matrix: 256 KiB, its gradient's size
GRAD = W * W * 4
M = 4
STEPS = 3


def stages():
    def layer():
        return pw.train.Stage(init=lambda key: {"w": jax.random.normal(key, (W, W)) / W},
                              apply=lambda p, x: jnp.tanh(x @ p["w"]))
    return [layer(), layer()]


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def data():
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(8, W)).astype(np.float32),
             rng.normal(size=(8, W)).astype(np.float32)) for _ in range(STEPS)]


def pipeline_losses(budget):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a second controller over the test's devices)
        ctl = pw.Controller(islands=(4, 4), memory_budget=budget, dispatch="sequential")
    with ctl:
        pipe = pw.train.Pipeline(stages(), [ctl.slice(1, island=0), ctl.slice(1, island=1)],
                                 loss=mse, optimizer=optax.sgd(0.5), microbatches=M,
                                 schedule="gpipe")
        state = pw.train.wait(pipe.init(0))
        params = jax.device_get(pw.train.fetch(state.params))
        losses = []
        for batch in data():
            state, loss = pipe.step(state, batch)
            losses.append(float(loss))
        return losses, params


def test_a_stage_sums_its_microbatch_gradients_in_one_gradients_bytes():
    """Per device: the stage's parameters (the state, one gradient's bytes), the running
    sum, and a few KiB of microbatches and activations. A budget of 2.5 gradients has room
    for the sum once, not for a second sum beside it: before, each backward after the first
    made a new sum while the old one was still held, and the step failed with
    MemoryBudgetError; now it trains to plain ``jax.jit``'s losses, as without a budget."""
    free, params = pipeline_losses(None)
    tight, _ = pipeline_losses(GRAD * 5 // 2)
    want, _ = plain_jax_losses(stages(), params, data(), optax.sgd(0.5), loss=mse)
    np.testing.assert_allclose(free, want, rtol=1e-5)
    np.testing.assert_array_equal(tight, free)

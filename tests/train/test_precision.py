"""pw.train in bfloat16: a pipeline's microbatch sums (gradients, losses) against plain
``jax.jit`` on the whole batch, which rounds such a sum once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pwkernel as pw

M = 128  # many microbatches of one example each: a long sum of small terms
BF16_TOL = 2.0 ** -7  # two of bfloat16's steps (8 significant bits), relative to the largest


def keep_gradients() -> optax.GradientTransformation:
    """An optimizer that updates nothing and keeps the step's gradients as its state: what
    the optimizer was given, read back with ``fetch``."""
    return optax.GradientTransformation(
        lambda params: jax.tree.map(jnp.zeros_like, params),
        lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))


def bf16_stages():
    def layer(n_in, n_out):
        return pw.train.Stage(
            init=lambda key: {"w": (jax.random.normal(key, (n_in, n_out)) / np.sqrt(n_in))
                              .astype(jnp.bfloat16)},
            apply=lambda p, x: jnp.tanh(x @ p["w"]))
    return [layer(8, 16), layer(16, 4)]


def mse(out, y):
    return jnp.mean((out - y) ** 2)  # bfloat16 in, bfloat16 out


def off_by(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_bf16_microbatch_gradients_and_loss_are_summed_as_wide_as_jax_jits(tctl):
    stages = bf16_stages()
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=mse, optimizer=keep_gradients(), microbatches=M,
                             name="bf16")
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((M, 8))).astype(jnp.bfloat16)
    y = np.full((M, 4), 3.0, jnp.bfloat16)  # every example pulls the same way: no cancelling
    state = pipe.init(0)
    params = jax.device_get(pw.train.fetch(state.params))
    new, loss = pipe.step(state, (x, y))
    got = jax.device_get(pw.train.fetch(new.opt_state))  # the gradients the optimizer saw

    full = pw.train.model_loss(stages, mse)
    want_loss, want = jax.jit(jax.value_and_grad(full))(params, x, y)
    assert jax.tree.map(lambda g: g.dtype, got) == jax.tree.map(lambda p: p.dtype, params)
    assert loss.dtype == want_loss.dtype == jnp.bfloat16
    errors = [off_by(g, w) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                                           strict=True)]
    assert max(errors) < BF16_TOL, errors  # summed in bfloat16: 0.015 and 0.03
    assert off_by(loss.result(), want_loss) < BF16_TOL

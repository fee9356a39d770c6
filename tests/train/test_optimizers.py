"""Optax transformations that take more than gradients: ``value=`` (the step's loss), as a
plain optax loop passes it, on both trainers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw

RNG = np.random.default_rng(1)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.standard_normal((8, 2)).astype(np.float32)
STAGES = [pw.train.Stage(lambda key: {"w": jax.random.normal(key, (4, 8))},
                         lambda p, x: jnp.tanh(x @ p["w"])),
          pw.train.Stage(lambda key: {"w": jax.random.normal(key, (8, 2))},
                         lambda p, h: h @ p["w"])]


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def plateau():
    """A learning rate too large, halved at every step the loss does not improve."""
    return optax.chain(optax.sgd(2.0), optax.contrib.reduce_on_plateau(
        factor=0.5, patience=0, cooldown=0, rtol=1e-4, accumulation_size=1))


def scale(opt_state):
    return float(opt_state[-1].scale)


@pytest.mark.parametrize("trainer", ["pipeline", "spmd", "spmd-packed", "spmd-checked"])
def test_reduce_on_plateau_gets_the_steps_loss_as_in_plain_optax(tctl, trainer):
    opt = plateau()
    if trainer == "pipeline":
        t = pw.train.Pipeline(STAGES, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                              loss=mse, optimizer=opt, microbatches=2)
    else:
        t = pw.train.SPMD(STAGES, tctl.slice(2, island=0), loss=mse, optimizer=opt,
                          packed=trainer == "spmd-packed",
                          check_finite=trainer == "spmd-checked")
    state = t.init(0)
    params = jax.device_get(pw.train.fetch(state).params)
    full = pw.train.model_loss(STAGES, mse)

    @jax.jit
    def plain(params, opt_state):  # one optax chain per stage, as the trainers run it
        value, grads = jax.value_and_grad(full)(params, X, Y)
        new = [opt.update(g, o, p, value=value)
               for g, o, p in zip(grads, opt_state, params, strict=True)]
        return ([optax.apply_updates(p, u) for p, (u, _) in zip(params, new, strict=True)],
                [o for _, o in new], value)

    opt_state, want, got = [opt.init(p) for p in params], [], []
    for _ in range(6):
        params, opt_state, value = plain(params, opt_state)
        want.append(float(value))
        state, loss = t.step(state, (X, Y))
        got.append(float(loss))
    assert scale(opt_state[0]) < 1  # (the premise: the plateau cut the learning rate)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    opt_states = pw.train.fetch(state).opt_state
    assert [scale(o) for o in opt_states] == [scale(o) for o in opt_state]

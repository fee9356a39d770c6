"""What travels between pipeline stages: activations that are pytrees with integer and
boolean leaves (a mask, positions, token ids passed on), against plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.standard_normal((8, 2)).astype(np.float32)


def dense(fan_in, fan_out):
    return lambda key: {"w": jax.random.normal(key, (fan_in, fan_out)) / np.sqrt(fan_in)}


def masked_stages():
    """Stage 0 passes on an int32 mask and int32 positions, stage 1 a bool mask."""
    def first(p, x):
        return {"h": jnp.tanh(x @ p["w"]), "mask": (x[:, :1] > 0).astype(jnp.int32),
                "pos": jnp.floor(jnp.abs(x[:, 1]) * 3).astype(jnp.int32)}

    def middle(p, a):
        return {"h": jnp.tanh(a["h"] @ p["w"]) * a["mask"], "keep": a["pos"] % 3 > 0}

    def last(p, a):
        return (a["h"] @ p["w"]) * a["keep"][:, None]
    return [pw.train.Stage(dense(4, 8), first), pw.train.Stage(dense(8, 8), middle),
            pw.train.Stage(dense(8, 2), last)]


def mse(out, y):
    return jnp.mean((out - y) ** 2)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_integer_and_boolean_activations_cross_stages_as_in_plain_jax(tctl, schedule):
    stages, opt = masked_stages(), optax.sgd(0.3, momentum=0.9)
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(2, island=1),
                                      tctl.slice(1, island=1)],
                             loss=mse, optimizer=opt, schedule=schedule, microbatches=2)
    state = pipe.init(0)
    params = jax.device_get(pw.train.fetch(state.params))
    full = pw.train.model_loss(stages, mse)

    @jax.jit
    def plain(params, opt_state):
        value, grads = jax.value_and_grad(full)(params, X, Y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, want, got = opt.init(params), [], []
    for _ in range(3):
        params, opt_state, value = plain(params, opt_state)
        want.append(float(value))
        state, loss = pipe.step(state, (X, Y))
        got.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(pw.train.fetch(state.params)), jax.tree.leaves(params),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_stage_fed_only_token_ids_trains(tctl):
    """Stage 0 hands stage 1 integer ids alone: stage 1's input has no cotangent at all."""
    tokens = RNG.integers(0, 10, (8,), dtype=np.int32)
    stages = [pw.train.Stage(lambda key: {}, lambda p, t: (t + 3) % 10),
              pw.train.Stage(lambda key: {"e": jax.random.normal(key, (10, 2))},
                             lambda p, t: p["e"][t])]
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=mse, optimizer=optax.sgd(0.1), microbatches=2)
    spmd = pw.train.SPMD(stages, tctl.slice(1, island=0), loss=mse, optimizer=optax.sgd(0.1))
    a, b = pipe.init(0), spmd.init(0)
    for _ in range(2):
        a, la = pipe.step(a, (tokens, Y))
        b, lb = spmd.step(b, (tokens, Y))
        np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)

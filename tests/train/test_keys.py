"""PRNG keys in pw.train (docs/training.md, "Randomness: the key rule"): each stage's init
key from ``init(key)`` for keys of any implementation, and an optimizer state's keys (optax's
``add_noise``) made distinct per stage, so no two stages draw the same noise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pwkernel as pw

X = np.ones((4, 4), np.float32)
Y = np.zeros((4, 4), np.float32)


def zero_stage():
    return pw.train.Stage(lambda key: {"w": jnp.zeros((4, 4))}, lambda p, x: x @ p["w"])


def no_gradient(out, y):
    return jnp.mean(out * 0.0)  # (the update is the optimizer's noise alone)


def trainers(ctl, stages, opt, name):
    pipe = pw.train.Pipeline(stages, [ctl.slice(2, island=0), ctl.slice(2, island=1)],
                             loss=no_gradient, optimizer=opt, microbatches=2, name=f"{name}p")
    spmd = pw.train.SPMD(stages, ctl.slice(2), loss=no_gradient, optimizer=opt,
                         name=f"{name}s")
    return pipe, spmd


def test_an_optimizer_key_draws_other_noise_in_each_stage(tctl):
    """optax.noisy_sgd per stage: every stage's state held the same key, so two stages of one
    shape got the same noise at every step (jax.jit's one chain draws each leaf its own)."""
    opt = optax.noisy_sgd(1.0, eta=1.0, key=0)
    got = []
    for t in trainers(tctl, [zero_stage(), zero_stage()], opt, "noise"):
        state = t.init(0)
        for _ in range(2):
            state, _ = t.step(state, (X, Y))
        got.append(jax.device_get(pw.train.fetch(state.params)))
    for params in got:
        assert not np.array_equal(params[0]["w"], params[1]["w"])
    np.testing.assert_array_equal(got[0][1]["w"], got[1][1]["w"])  # (Pipeline == SPMD)
    # stage 0 keeps optax's own key: its noise is plain optax's on its parameters
    p = {"w": jnp.zeros((4, 4))}
    o = opt.init(p)
    for _ in range(2):
        u, o = opt.update(jax.tree.map(jnp.zeros_like, p), o, p)
        p = optax.apply_updates(p, u)
    np.testing.assert_allclose(got[0][0]["w"], p["w"], rtol=1e-5, atol=1e-6)


def stages_from_keys():
    return [pw.train.Stage(lambda key: {"w": jax.random.normal(key, (4, 4))},
                           lambda p, x: x @ p["w"]) for _ in range(2)]


def test_init_takes_a_typed_key_of_another_implementation(tctl):
    """init(jax.random.key(0, impl="rbg")) failed under the default threefry ("expected
    key_data.shape to end with (2,)"): each stage gets a typed rbg key split from it."""
    key = jax.random.key(0, impl="rbg")
    want = [np.asarray(jax.random.normal(k, (4, 4))) for k in jax.random.split(key, 2)]
    for t in trainers(tctl, stages_from_keys(), optax.sgd(0.1), "rbgkey"):
        params = jax.device_get(pw.train.fetch(t.init(key).params))
        for s in range(2):
            np.testing.assert_allclose(params[s]["w"], want[s], rtol=1e-6)
        t.step(t.init(key), (X, Y))[1].result()


def test_trainers_run_under_the_rbg_default_implementation(tctl):
    """Under jax_default_prng_impl="rbg" (raw keys of 4 words) every step failed: the state
    check traced each stage's init with a raw key of 2 words."""
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        want = [np.asarray(jax.random.normal(k, (4, 4)))
                for k in jax.random.split(jax.random.PRNGKey(3), 2)]
        for t in trainers(tctl, stages_from_keys(), optax.sgd(0.1), "rbgdefault"):
            state = t.init(3)
            params = jax.device_get(pw.train.fetch(state.params))
            for s in range(2):
                np.testing.assert_allclose(params[s]["w"], want[s], rtol=1e-6)
            assert np.isfinite(float(t.step(state, (X, Y))[1]))
    finally:
        jax.config.update("jax_default_prng_impl", "threefry2x32")

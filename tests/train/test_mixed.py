"""Mixed precision, states of another model, flax's mutable collections, padding masks and
dropout keys: pw.train against plain ``jax.jit`` steps written here, or the error that says
what to do."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw

RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 8)).astype(np.float32)
Y = (RNG.standard_normal((16, 4)) / 2).astype(np.float32)


def dense(n_in, n_out, compute=jnp.float32):
    """A tanh layer whose parameters are float32 and whose matmul runs in ``compute`` (flax's
    ``dtype=jnp.bfloat16`` with ``param_dtype=jnp.float32``): what travels on is ``compute``."""
    def init(key):
        return {"w": jax.random.normal(key, (n_in, n_out)) / np.sqrt(n_in),
                "b": jnp.zeros((n_out,))}
    return pw.train.Stage(init, lambda p, x: jnp.tanh(
        x.astype(compute) @ p["w"].astype(compute) + p["b"].astype(compute)))


def mse(out, y):
    return jnp.mean((out.astype(jnp.float32) - y) ** 2)


def plain_losses(stages, opt, params, x, y, steps):
    """Full-batch training under jax.jit, written out here."""
    def loss_fn(ps):
        h = x
        for st, p in zip(stages, ps, strict=True):
            h = st.apply(p, h)
        return mse(h, y)

    @jax.jit
    def step(ps, o):
        value, g = jax.value_and_grad(loss_fn)(ps)
        updates, o = opt.update(g, o, ps)
        return optax.apply_updates(ps, updates), o, value
    o, out = opt.init(params), []
    for _ in range(steps):
        params, o, value = step(params, o)
        out.append(float(value))
    return out, params


def test_float32_master_parameters_with_bfloat16_compute_train_as_jax_jit(tctl):
    stages = [dense(8, 16, jnp.bfloat16), dense(16, 16, jnp.bfloat16), dense(16, 4)]
    opt = optax.sgd(0.1, momentum=0.9)
    pipe = pw.train.Pipeline(stages, [tctl.slice(2, island=0), tctl.slice(1, island=0),
                                      tctl.slice(2, island=1)],
                             loss=mse, optimizer=opt, microbatches=2, name="mixed")
    state = pipe.init(0)
    want, want_params = plain_losses(stages, opt, jax.device_get(pw.train.fetch(state.params)),
                                     X, Y, 3)
    got = []
    for _ in range(3):
        state, loss = pipe.step(state, (X, Y))
        got.append(float(loss))
    params = jax.device_get(pw.train.fetch(state.params))
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(params))
    # bfloat16 matmuls over microbatches round where the whole batch's do not: a few of its
    # 2**-8 steps, no more
    np.testing.assert_allclose(got, want, rtol=5e-3)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(a, b, atol=5e-3)


@pytest.mark.parametrize("kind", ["pipeline", "spmd"])
def test_a_state_of_another_model_is_refused_with_where_it_differs(tctl, kind):
    """Before, a 3-stage state failed a 2-stage pipeline with "sub got incompatible shapes for
    broadcasting", and a state of other widths or another optimizer's state trained on."""
    def trainer(stages, opt, name):
        if kind == "pipeline":
            slices = [tctl.slice(1, island=i % 2) for i in range(len(stages))]
            return pw.train.Pipeline(stages, slices, loss=mse, optimizer=opt, microbatches=2,
                                     name=name)
        return pw.train.SPMD(stages, tctl.slice(2, island=0), loss=mse, optimizer=opt,
                             name=name)
    sgd = optax.sgd(0.1)
    ours = trainer([dense(8, 16), dense(16, 4)], sgd, f"{kind}-ours")
    others = {
        "3 stages' parameters": trainer([dense(8, 16), dense(16, 8), dense(8, 4)], sgd, "a"),
        r"stage 0's parameters hold \['b'\] of shape \(32,\), where its init makes "
        r"\(16,\)": trainer([dense(8, 32), dense(32, 4)], sgd, f"{kind}-wide"),
        r"stage 0's optimizer state holds 5 leaves \(\[0\].count": trainer(
            [dense(8, 16), dense(16, 4)], optax.adam(1e-2), f"{kind}-adam"),
    }
    state = ours.init(0)
    for why, other in others.items():
        with pytest.raises(Exception, match=why) as info:
            ours.step(other.init(0), (X, Y))
        assert "does not fit" in str(info.value)
    for why, other in list(others.items())[:2]:  # (evaluate reads the parameters alone)
        with pytest.raises(Exception, match=why) as info:
            ours.evaluate(other.init(0), (X, Y))
        assert "does not fit" in str(info.value)
    assert np.isfinite(float(ours.evaluate(others[list(others)[2]].init(0), (X, Y))))
    state, loss = ours.step(state, (X, Y))  # (its own state, untouched, trains on)
    assert np.isfinite(float(loss))


class Normed(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.BatchNorm(use_running_average=False)(nn.Dense(16)(x))


@pytest.mark.parametrize("kind", ["pipeline", "spmd"])
def test_flax_variables_with_batch_stats_are_refused_with_what_to_do(tctl, kind):
    """Before: BatchNorm's running statistics given as parameters were trained by the
    gradient (or, applied with mutable=['batch_stats'], "unsupported operand type(s) for @:
    'tuple' and 'LinearizeTracer'" from the next stage)."""
    module = Normed()
    stages = [pw.train.Stage(lambda key: module.init(key, X[:2]),
                             lambda v, x: module.apply(v, x, mutable=["batch_stats"])),
              dense(16, 4)]
    if kind == "pipeline":
        t = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                              loss=mse, optimizer=optax.sgd(0.1), microbatches=2, name="bn")
    else:
        t = pw.train.SPMD(stages, tctl.slice(2, island=0), loss=mse, optimizer=optax.sgd(0.1),
                          name="bn")
    with pytest.raises(Exception, match=r"'batch_stats' collection(.|\n)*variables\['params'\]"):
        t.step(t.init(0), (X, Y))


def test_a_padding_mask_weighted_per_example_gives_jax_jits_masked_mean(tctl):
    """docs/training.md, 'Padding masks': each microbatch's loss normalized by its own count
    is a mean of means; weights of mask * batch / count give the whole batch's."""
    stages = [dense(8, 16), dense(16, 4)]
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=lambda out, t: 0.0, optimizer=optax.sgd(0.1),
                             microbatches=4, name="masked")
    params = jax.device_get(pw.train.fetch(pipe.init(0).params))
    mask = (np.arange(16) % 5 != 0).astype(np.float32)
    mask[:4] = 0.0  # the first microbatch all padding: its own count would be 0

    def forward(ps, x):
        for st, p in zip(stages, ps, strict=True):
            x = st.apply(p, x)
        return x
    out = forward(params, X)
    per_example = np.asarray(jnp.mean((out - Y) ** 2, axis=-1))
    want = float((per_example * mask).sum() / mask.sum())  # jax.jit's masked mean

    def weighted(out, t):
        return jnp.mean(jnp.mean((out - t["y"]) ** 2, axis=-1) * t["weight"])
    weight = mask * len(mask) / mask.sum()
    for trainer in (
            pw.train.Pipeline(stages, pipe.slices, loss=weighted, optimizer=optax.sgd(0.1),
                              microbatches=4, name="weighted"),
            pw.train.SPMD(stages, tctl.slice(2, island=0), loss=weighted,
                          optimizer=optax.sgd(0.1), name="weighted-spmd")):
        np.testing.assert_allclose(
            float(trainer.evaluate(trainer.init(0), (X, {"y": Y, "weight": weight}))), want,
            rtol=1e-5)
        _, loss = trainer.step(trainer.init(0), (X, {"y": Y, "weight": weight}))
        np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_dropout_keys_per_example_in_the_inputs_give_jax_jits_losses(tctl):
    """docs/training.md, 'Dropout': one key per example, in the batch, travels with its
    example through the stages: the same masks as jax.jit's on the whole batch."""
    def dropped(p, xk):
        h, keys = xk
        h = jnp.tanh(h @ p["w"] + p["b"])
        keep = jax.vmap(lambda k: jax.random.bernoulli(k, 0.7, h.shape[-1:]))(keys)
        return jnp.where(keep, h / 0.7, 0.0), keys
    first = pw.train.Stage(dense(8, 16).init, dropped)
    last = pw.train.Stage(dense(16, 4).init, lambda p, xk: xk[0] @ p["w"] + p["b"])
    opt = optax.sgd(0.1, momentum=0.9)
    pipe = pw.train.Pipeline([first, last], [tctl.slice(2, island=0), tctl.slice(2, island=1)],
                             loss=mse, optimizer=opt, microbatches=2, name="dropout")
    state = pipe.init(0)
    params = jax.device_get(pw.train.fetch(state.params))
    got, want = [], []
    o = opt.init(params)
    for step in range(3):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(7), step), len(X))
        state, loss = pipe.step(state, ((X, keys), Y))
        got.append(float(loss))

        def loss_fn(ps, keys=keys):
            return mse(last.apply(ps[1], first.apply(ps[0], (X, keys))), Y)
        value, g = jax.jit(jax.value_and_grad(loss_fn))(params)
        updates, o = opt.update(g, o, params)
        params = optax.apply_updates(params, updates)
        want.append(float(value))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(set(np.round(got, 4))) == 3


def test_one_trainer_stepped_from_two_threads_gives_each_its_own_losses(tctl):
    pipe = pw.train.Pipeline([dense(8, 16), dense(16, 4)],
                             [tctl.slice(1, island=0), tctl.slice(1, island=1)], loss=mse,
                             optimizer=optax.sgd(0.1, momentum=0.9), microbatches=2,
                             name="threads")

    def train(seed):
        state, out = pipe.init(seed), []
        for _ in range(3):
            state, loss = pipe.step(state, (X, Y))
            out.append(float(loss))
        return out
    alone = [train(0), train(1)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(train, [0, 1]))
    assert together == alone
    assert alone[0] != alone[1]


def test_dropout_in_every_stage_is_the_same_under_both_schedules_and_jax_jit(tctl):
    """docs/training.md, 'Randomness: the key rule': each stage folds its index into the
    example's key, so the stages draw other masks; GPipe and 1F1B give the same bits, and
    both jax.jit's losses (the schedule does not change the numbers)."""
    def dropping(n_in, n_out, s):
        def apply(p, xk):
            h, keys = xk
            h = jnp.tanh(h @ p["w"] + p["b"])
            keep = jax.vmap(lambda k: jax.random.bernoulli(
                jax.random.fold_in(k, s), 0.7, h.shape[-1:]))(keys)
            return jnp.where(keep, h / 0.7, 0.0), keys
        return pw.train.Stage(dense(n_in, n_out).init, apply)
    stages = [dropping(8, 16, 0), dropping(16, 16, 1),
              pw.train.Stage(dense(16, 4).init, lambda p, xk: xk[0] @ p["w"] + p["b"])]
    pipe = pw.train.Pipeline(stages, [tctl.slice(2, island=0), tctl.slice(1, island=0),
                                      tctl.slice(2, island=1)],
                             loss=mse, optimizer=optax.sgd(0.1), microbatches=4, name="drops")
    full = jax.jit(jax.value_and_grad(pw.train.model_loss(stages, mse)))
    runs = {}
    for schedule in ("gpipe", "1f1b", "gpipe"):
        state, losses, want = pipe.init(0), [], []
        params = jax.device_get(pw.train.fetch(state.params))
        for step in range(2):
            keys = jax.random.split(jax.random.fold_in(jax.random.key(7), step), len(X))
            state, loss = pipe.step(state, ((X, keys), Y), schedule=schedule)
            losses.append(float(loss))
            value, g = full(params, (X, keys), Y)
            params = jax.tree.map(lambda p, d: p - 0.1 * d, params, g)
            want.append(float(value))
        np.testing.assert_allclose(losses, want, rtol=1e-5)
        runs.setdefault(schedule, []).append(losses)
    assert runs["gpipe"][0] == runs["1f1b"][0] == runs["gpipe"][1]  # (bit for bit)

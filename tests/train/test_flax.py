"""A flax researcher's pieces given to pw.train: flax.linen modules as stages (the same
losses as plain jax.jit), and the errors for a flax TrainState, an optax constructor not
called, or a module given where a Stage goes, each naming what to pass instead."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

import pwkernel as pw
from pwkernel.train.state import stage_keys

X = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
Y = np.sin(X[:, :1])


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def linen_stage(module, example):
    """A flax.linen module as a stage, as the error for a module given bare says."""
    return pw.train.Stage(init=lambda key: module.init(key, example)["params"],
                          apply=lambda params, x: module.apply({"params": params}, x))


STAGES = [linen_stage(nn.Sequential([nn.Dense(8), nn.tanh]), X[:1]),
          linen_stage(nn.Dense(1), np.zeros((1, 8), np.float32))]


def test_linen_stages_train_as_plain_jax_jit(tctl):
    opt = optax.chain(pw.train.clip_by_global_norm(1.0), optax.adam(1e-2))
    step = jax.jit(pw.train.train_step(STAGES, mse, opt))
    state = jax.jit(pw.train.init_state(STAGES, opt))(stage_keys(0, 2))
    plain = []
    for _ in range(3):
        state, loss = step(state, X, Y)
        plain.append(float(loss))
    pipe = pw.train.Pipeline(STAGES, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=mse, optimizer=opt, microbatches=2, name="linen")
    ours = pipe.init(0)
    for i in range(3):
        ours, loss = pipe.step(ours, (X, Y))
        np.testing.assert_allclose(float(loss), plain[i], rtol=1e-5)


def test_flax_pieces_given_to_pw_train_get_errors_that_name_the_fix(tctl):
    s = tctl.slice(1, island=0)
    with pytest.raises(TypeError, match=r"got the function adam\. Maybe you want optax\.adam"):
        pw.train.SPMD(STAGES, s, loss=mse, optimizer=optax.adam)
    with pytest.raises(TypeError, match=r"got the function sgd\. Maybe you want optax\.sgd"):
        pw.train.Pipeline(STAGES, [s, s], loss=mse, optimizer=optax.sgd)
    dense = nn.Dense(1)
    with pytest.raises(TypeError, match=r"A flax module is one as pw\.train\.Stage\(init="):
        pw.train.SPMD([dense], s, loss=mse, optimizer=optax.sgd(0.1))
    flax_state = train_state.TrainState.create(
        apply_fn=dense.apply, params=dense.init(jax.random.key(0), X)["params"],
        tx=optax.sgd(0.1))
    spmd = pw.train.SPMD(STAGES, s, loss=mse, optimizer=optax.sgd(0.1), name="flaxerr")
    pipe = pw.train.Pipeline(STAGES, [s, s], loss=mse, optimizer=optax.sgd(0.1),
                             microbatches=2, name="flaxerr2")
    for trainer in (spmd, pipe):
        with pytest.raises(TypeError, match=r"got flax\.training\.train_state\.TrainState\. "
                                            r"pw\.train's state is pw\.train\.TrainState\("):
            trainer.step(flax_state, (X, Y))
        state = trainer.init(0)
        with pytest.raises(TypeError, match=r"got tuple\. Maybe you want "
                                            r"pw\.train\.TrainState\(\*state\)"):
            trainer.step(tuple(state), (X, Y))
        trainer.step(pw.train.TrainState(*tuple(state)), (X, Y))[1].result()  # as it says


def test_a_loss_with_metrics_is_refused_with_what_to_return(tctl):
    def with_metrics(out, y):  # as jax.value_and_grad(..., has_aux=True) would take it
        return mse(out, y), {"mae": jnp.mean(jnp.abs(out - y))}
    s = tctl.slice(1, island=0)
    spmd = pw.train.SPMD(STAGES, s, loss=with_metrics, optimizer=optax.sgd(0.1), name="aux")
    pipe = pw.train.Pipeline(STAGES, [s, s], loss=with_metrics, optimizer=optax.sgd(0.1),
                             microbatches=2, name="aux2")
    for trainer in (spmd, pipe):
        with pytest.raises(TypeError, match=r"must return one scalar .* got a tuple of 2\. "
                                            r"pw\.train takes no auxiliary outputs"):
            trainer.step(trainer.init(0), (X, Y))


def test_an_nnx_step_trains_when_it_returns_its_model_as_under_jax_jit(tctl):
    """A pw.function is jax.jit, not nnx.jit: a step that updates its Module and Optimizer in
    place and returns the loss alone leaves them as they were (as jax.jit does); the same
    step returning them trains, with donation, step for step as the jax.jit loop."""
    from flax import nnx
    s = tctl.slice(2, island=0)

    def fresh():
        model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)),
                               nnx.BatchNorm(8, rngs=nnx.Rngs(1)),
                               nnx.Dropout(0.2, rngs=nnx.Rngs(dropout=2)),
                               nnx.Linear(8, 1, rngs=nnx.Rngs(3)))
        return model, nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    def in_place(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads)
        return loss

    def returned(model, optimizer, x, y):
        return model, optimizer, in_place(model, optimizer, x, y)

    first = mse(fresh()[0](X), Y)  # (nnx.jit-free: the loss before any update)
    model, optimizer = fresh()
    lost = [float(pw.function(nnx.jit(in_place), slice=s)(model, optimizer, X, Y))
            for _ in range(2)]
    np.testing.assert_allclose(lost, [first, first], rtol=1e-6)
    losses = {}
    for name, step in (("jit", jax.jit(returned, donate_argnums=(0, 1))),
                       ("pw", pw.function(returned, slice=s, donate_argnums=(0, 1)))):
        model, optimizer = fresh()
        losses[name] = []
        for _ in range(3):
            with jax.set_mesh(s.mesh):
                model, optimizer, loss = step(model, optimizer, X, Y)
            losses[name].append(float(loss))
    assert losses["jit"][0] == pytest.approx(float(first), rel=1e-6)
    assert len(set(losses["jit"])) == 3  # the model moved on each step
    np.testing.assert_allclose(losses["pw"], losses["jit"], rtol=1e-6)


def test_an_nnx_split_merge_step_returns_jax_jits_state_leaf_by_leaf(tctl):
    """``nnx.split`` outside, ``nnx.merge`` inside, the graph static and the state donated,
    on a 2 x 2 slice with ``nnx.with_partitioning`` weights: every leaf (parameters,
    BatchNorm statistics, Dropout's rng count and key, Adam's moments and step) comes back
    with ``jax.jit``'s value and layout, step after step."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P
    s = tctl.slice((2, 2), island=0, axis_names=("data", "model"), axis_types="auto")
    sharded = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)

    def split():
        model = nnx.Sequential(nnx.Linear(16, 8, use_bias=False, kernel_init=sharded,
                                          rngs=nnx.Rngs(0)),
                               nnx.BatchNorm(8, rngs=nnx.Rngs(1)),
                               nnx.Dropout(0.2, rngs=nnx.Rngs(dropout=2)),
                               nnx.Linear(8, 1, rngs=nnx.Rngs(3)))
        return nnx.split((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))

    def step(graphdef, state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    states = {}
    for name, compiled in (("jit", jax.jit(step, static_argnums=0, donate_argnums=1)),
                           ("pw", pw.function(step, slice=s, static_argnums=0,
                                              donate_argnums=1))):
        with jax.set_mesh(s.mesh):
            graphdef, state = split()
            states[name] = []
            for _ in range(3):
                state, loss = compiled(graphdef, state, x, np.sin(x[:, :1]))
                states[name].append((float(loss), jax.device_get(state)))
        assert state[0]["layers"][0]["kernel"][...].sharding.spec == P(None, "model")
        states[name].append(jax.tree.map(lambda v: v.sharding.spec, state))
    assert states["pw"][-1] == states["jit"][-1]
    for (loss, state), (want_loss, want) in zip(states["pw"][:-1], states["jit"][:-1],
                                                strict=True):
        assert loss == pytest.approx(want_loss, rel=1e-6)
        for (path, v), w in zip(jax.tree.leaves_with_path(state), jax.tree.leaves(want),
                                strict=True):
            if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
                v, w = jax.random.key_data(v), jax.random.key_data(w)
            np.testing.assert_allclose(v, w, rtol=1e-5, atol=1e-6,
                                       err_msg=jax.tree_util.keystr(path))


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return x + jnp.tanh(nn.Dense(8)(nn.LayerNorm()(x))), None


class _Scanned(nn.Module):  # nn.scan over rematerialized blocks, one stacked parameter tree
    @nn.compact
    def __call__(self, x):
        blocks = nn.scan(nn.remat(_Block), variable_axes={"params": 0},
                         split_rngs={"params": True}, length=3)
        return blocks()(x, None)[0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_scanned_remat_sequential_and_parameterless_stages_train_as_jax_jit(tctl, schedule):
    h = np.zeros((1, 8), np.float32)
    stages = [linen_stage(nn.Sequential([nn.Dense(8), nn.gelu]), X[:1]),
              pw.train.Stage(init=lambda key: {}, apply=lambda p, x: 2.0 * x),  # no params
              linen_stage(_Scanned(), h), linen_stage(nn.Dense(1), h)]
    opt = optax.adam(1e-2)
    step = jax.jit(pw.train.train_step(stages, mse, opt))
    plain = jax.jit(pw.train.init_state(stages, opt))(stage_keys(0, 4))
    pipe = pw.train.Pipeline(stages, [tctl.slice(2, island=s % 2) for s in range(4)],
                             loss=mse, optimizer=opt, microbatches=2, schedule=schedule,
                             name=f"scanned-{schedule}")  # (2 devices a stage: data parallel)
    ours = pipe.init(0)
    for _ in range(3):
        plain, want = step(plain, X, Y)
        ours, loss = pipe.step(ours, (X, Y))
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(pw.train.fetch(ours).params),
                    jax.tree.leaves(plain.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_embedding_gather_on_explicit_axes_says_what_to_do_and_trains_on_auto(tctl):
    tokens = np.random.default_rng(0).integers(0, 10, (8, 3)).astype(np.int32)
    embed = nn.Embed(10, 4)
    stages = [pw.train.Stage(init=lambda key: embed.init(key, tokens[:1])["params"],
                             apply=lambda p, t: embed.apply({"params": p}, t).sum(1)),
              linen_stage(nn.Dense(1), np.zeros((1, 4), np.float32))]
    y = np.ones((8, 1), np.float32)
    spmd = pw.train.SPMD(stages, tctl.slice(2, island=0), loss=mse, optimizer=optax.sgd(0.1))
    with pytest.raises(Exception, match=r"A gather .*axis_types='auto'"):  # (JAX's error too)
        spmd.step(spmd.init(0), (tokens, y))[1].result()
    opt = optax.sgd(0.1)
    step = jax.jit(pw.train.train_step(stages, mse, opt))
    plain = jax.jit(pw.train.init_state(stages, opt))(stage_keys(0, 2))
    pipe = pw.train.Pipeline(stages, [tctl.slice(2, island=0, axis_types="auto"),
                                      tctl.slice(2, island=1, axis_types="auto")],
                             loss=mse, optimizer=opt, microbatches=2, name="embed-auto")
    ours = pipe.init(0)
    for _ in range(2):
        plain, want = step(plain, tokens, y)
        ours, loss = pipe.step(ours, (tokens, y))
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)


class _BatchNormed(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        x = nn.BatchNorm(use_running_average=not train)(nn.Dense(8)(x))
        return nn.Dense(1)(nn.Dropout(0.3, deterministic=not train)(nn.relu(x)))


class _StatsState(train_state.TrainState):
    batch_stats: dict


def _optax_wrappers():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)
    return {
        "multisteps": optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0),
                                                   optax.adamw(schedule)), every_k_schedule=2),
        "inject": optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
        "multi": optax.multi_transform(
            {"adam": optax.adam(1e-2), "sgd": optax.sgd(0.1)},
            lambda p: {k: jax.tree.map(lambda _, label="sgd" if k == "Dense_1" else "adam":
                                       label, v) for k, v in p.items()}),
    }


@pytest.mark.parametrize("opt", ["multisteps", "inject", "multi"])
def test_a_linen_train_state_with_optax_wrappers_steps_as_jax_jit_on_a_sharded_batch(tctl, opt):
    """A flax ``TrainState`` with BatchNorm's ``batch_stats`` (``mutable=``), a dropout key
    per step, and optax's wrappers (``MultiSteps``' mini-step counter, ``inject_hyperparams``
    with the learning rate set from Python between steps, ``multi_transform``), donated, on
    a 4-device slice with the batch sharded (``pw.BATCH``): every leaf is ``jax.jit``'s with
    the same ``in_shardings``, step after step."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    s = tctl.slice(4, island=1, axis_types="auto")
    model, tx = _BatchNormed(), _optax_wrappers()[opt]

    def step(state, key, x, y):
        def loss(params):
            out, upd = state.apply_fn({"params": params, "batch_stats": state.batch_stats}, x,
                                      train=True, mutable=["batch_stats"],
                                      rngs={"dropout": jax.random.fold_in(key, state.step)})
            return mse(out, y), upd
        (value, upd), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads).replace(batch_stats=upd["batch_stats"]), value

    batch = NamedSharding(s.mesh, P("x"))
    runs, last = {}, {}
    for name, compiled in (
            ("jit", jax.jit(step, donate_argnums=0, in_shardings=(None, None, batch, batch))),
            ("pw", pw.function(step, slice=s, donate_argnums=0,
                               in_specs=(None, None, pw.BATCH, pw.BATCH)))):
        variables = model.init(jax.random.key(0), X, train=False)
        state = _StatsState.create(apply_fn=model.apply, params=variables["params"],
                                   batch_stats=variables["batch_stats"], tx=tx)
        runs[name] = []
        with jax.set_mesh(s.mesh):
            for i in range(4):
                if opt == "inject":
                    state.opt_state.hyperparams["learning_rate"] = 1e-2 / (i + 1)
                state, loss = compiled(state, jax.random.key(7), X, Y)
                runs[name].append((float(loss), jax.device_get(state)))
        last[name] = jax.tree.leaves(state)
    for v, w in zip(last["pw"], last["jit"], strict=True):
        assert v.sharding.is_equivalent_to(w.sharding, w.ndim), (v.sharding, w.sharding)
    if opt == "multisteps":
        assert int(runs["pw"][-1][1].opt_state.mini_step) == 0
        assert int(runs["pw"][-1][1].opt_state.gradient_step) == 2
    for (loss, state), (want_loss, want) in zip(runs["pw"], runs["jit"], strict=True):
        assert loss == pytest.approx(want_loss, rel=1e-6)
        for (path, v), w in zip(jax.tree.leaves_with_path(state), jax.tree.leaves(want),
                                strict=True):
            assert np.asarray(v).dtype == np.asarray(w).dtype, jax.tree_util.keystr(path)
            np.testing.assert_allclose(v, w, rtol=1e-6, atol=1e-7,
                                       err_msg=jax.tree_util.keystr(path))

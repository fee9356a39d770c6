"""A packed training state (``pw.train.SPMD(..., packed=True)``): the same values as a future per
leaf, a few futures a step, unpacked on demand, never consuming a state the user gave in."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer as T
from pwkernel.train.packed import Layout
from tests.helpers.train_memory import held_over_steps

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)


def same_bits(a, b) -> None:
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                 a, b)


def test_a_layout_packs_by_dtype_and_keeps_keys_and_weak_leaves_loose():
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "count": jnp.int32(4), "b": jnp.ones(3),
            "key": jax.random.key(1), "scale": 2.0, "steps": jnp.arange(3, dtype=jnp.int32)}
    layout = Layout(tree)
    packs, loose = jax.jit(layout.pack)(tree)
    assert sorted((p.dtype.name, p.shape) for p in packs) == [("float32", (9,)),
                                                               ("int32", (4,))]
    assert len(loose) == 2  # the typed key, the weakly typed Python float
    back = jax.jit(layout.unpack)((packs, loose))
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    assert back["scale"].weak_type and not back["w"].weak_type
    assert jax.random.key_data(back["key"]).tolist() == jax.random.key_data(tree["key"]).tolist()
    same_bits({k: v for k, v in back.items() if k != "key"},
              {k: v for k, v in tree.items() if k != "key"})
    assert layout.misfit(tree) is None
    assert "leaf" in layout.misfit({**tree, "b": jnp.ones(4)})
    assert "structure" in layout.misfit({"w": tree["w"]})


def trainers(tctl, optimizer, devices=4):
    stages = T.split(CFG, 2)
    kw = {"loss": T.cross_entropy, "optimizer": optimizer}
    return (pw.train.SPMD(stages, tctl.slice(devices, island=0), packed=True, name="packed",
                          **kw),
            pw.train.SPMD(stages, tctl.slice(devices, island=0), name="leaves", **kw))


def test_packed_steps_give_the_values_of_a_future_per_leaf(tctl):
    packed, leaves = trainers(tctl, optax.adam(1e-2))
    a, b = packed.init(0), leaves.init(0)
    assert isinstance(a, pw.train.PackedState) and isinstance(b, pw.train.TrainState)
    assert len(a.futures) == 2 and len(jax.tree_util.tree_leaves(b)) == 47  # f32, Adam's int32
    for i in range(4):
        batch = T.batch(CFG, 8, seed=i)
        a, loss_a = packed.step(a, batch)
        b, loss_b = leaves.step(b, batch)
        assert float(loss_a) == float(loss_b)
    same_bits(pw.train.fetch(a), pw.train.fetch(b))
    params, opt_state = a  # unpacks as a TrainState does
    same_bits(pw.train.fetch(params), pw.train.fetch(b.params))
    assert all(isinstance(f, pw.Future) for f in jax.tree_util.tree_leaves(a.opt_state))


def test_unpacked_futures_outlive_the_donation_of_their_packs(tctl):
    packed, _ = trainers(tctl, optax.sgd(0.1))
    state = packed.init(0)
    params = state.params  # unpacked now: read before the next step donates the packs
    before = pw.train.fetch(params)
    new, loss = packed.step(state, T.batch(CFG, 8))
    pw.train.wait((new, loss))
    assert all(f.result().is_deleted() for f in state.futures)  # the packs were donated
    same_bits(pw.train.fetch(params), before)  # its unpacked leaves were not


def test_a_train_state_given_in_is_packed_into_a_copy_and_not_consumed(tctl):
    packed, leaves = trainers(tctl, optax.sgd(0.1, momentum=0.9))
    mine = pw.train.wait(leaves.init(0))  # a TrainState of futures, e.g. from elsewhere
    new, loss = packed.step(mine, T.batch(CFG, 8))
    want_state, want_loss = leaves.step(pw.train.wait(leaves.init(0)), T.batch(CFG, 8))
    assert float(loss) == float(want_loss)
    same_bits(pw.train.fetch(new), pw.train.fetch(want_state))
    assert not any(f.result().is_deleted() for f in jax.tree_util.tree_leaves(mine))
    values = pw.train.fetch(mine)  # plain arrays in: packed as well
    again, _ = packed.step(values, T.batch(CFG, 8))
    same_bits(pw.train.fetch(again), pw.train.fetch(new))


def test_a_state_of_another_model_is_refused_with_what_fits(tctl):
    packed, _ = trainers(tctl, optax.sgd(0.1))
    other = pw.train.SPMD(T.split(T.Config(32, 8, 2, 2, 8), 2), tctl.slice(4, island=0),
                          loss=T.cross_entropy, optimizer=optax.sgd(0.1), packed=True,
                          name="other")
    with pytest.raises(ValueError, match="does not fit this trainer"):
        packed.step(other.init(0), T.batch(CFG, 8))
    with pytest.raises(ValueError, match=r"not one of .* leaf 0 is float32\[32, 8\]"):
        packed.step(pw.train.fetch(other.init(0)), T.batch(CFG, 8))
    with pytest.raises(TypeError, match="returned"):
        packed.step({"w": 1}, T.batch(CFG, 8))


def test_packed_state_memory_stays_flat_over_steps(tctl):
    packed, _ = trainers(tctl, optax.adam(1e-2), devices=1)
    held, state, loss = held_over_steps(tctl, packed, lambda i: T.batch(CFG, 8, seed=i % 2))
    assert len(set(held)) == 1, held
    kept = sum(f.result().nbytes for f in state.futures) + loss.result().nbytes
    assert held[0] == kept  # the packs and the loss: nothing else is left behind


def test_the_benchmarks_plain_jax_packed_step_is_the_packed_trainers_step(tctl):
    """``bench/packed_state.py`` compares pwkernel's packed step with plain JAX running the
    same packed step (``jax_trainer`` of a packed trainer): the same losses step by step."""
    from pwkernel.bench.train import Trainer, jax_trainer

    packed, _ = trainers(tctl, optax.adam(1e-2))
    batch = T.batch(CFG, 8, seed=3)
    ours = Trainer(packed.step, packed.init(0), packed.place(batch), 1, 1)
    plain = jax_trainer(packed, packed.init(0), batch, 1, 1)
    assert [leaf.dtype for leaf in jax.tree.leaves(plain.state)] == [
        f.dtype for f in ours.state.futures]  # its state is the packs, as arrays
    for _ in range(3):
        ours.state, loss_ours = ours.step(ours.state, ours.batch)
        plain.state, loss_plain = plain.step(plain.state, plain.batch)
        assert float(loss_ours) == float(loss_plain)


def test_a_learning_rate_set_in_the_unpacked_state_is_what_the_next_step_uses(tctl):
    """optax's way to change a learning rate between steps (``inject_hyperparams``, then
    ``opt_state.hyperparams["learning_rate"] = ...``) on a packed state: the step and the
    eval read the changed ``TrainState``, as a future per leaf does; before, they read the
    packs and the change was silently lost."""
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)
    packed, leaves = trainers(tctl, opt, devices=2)
    batch = T.batch(CFG, 8)
    for t in (leaves, packed):
        state, _ = t.step(t.init(0), batch)
        for o in state.opt_state:
            o.hyperparams["learning_rate"] = np.float32(0.0)
        before = jax.device_get(pw.train.fetch(state).params)
        state, _ = t.step(state, batch)  # a step that changes nothing
        same_bits(pw.train.fetch(state).params, before)
        state.params[1]["head"] = jnp.zeros_like(before[1]["head"])  # the eval reads it too
        np.testing.assert_allclose(float(t.evaluate(state, batch)), np.log(CFG.vocab),
                                   rtol=1e-5)
    state.params[0]["embed"] = jnp.zeros(3)  # (packed:) a leaf of another shape is refused
    with pytest.raises(ValueError, match=r"leaf \d+ is float32\[3\]"):
        packed.step(state, batch)


def test_a_pipeline_takes_a_packed_state_and_leaves_it_to_its_spmd(tctl):
    """A packed SPMD's state was refused by a Pipeline of the same stages ("takes the
    TrainState"), though an SPMD takes a Pipeline's; now it is unpacked afresh and not
    consumed, even with the stages on the SPMD's own slice (no copy between them)."""
    stages, s = T.split(CFG, 2), tctl.slice(2, island=0)
    kw = {"loss": T.cross_entropy, "optimizer": optax.adam(1e-2)}
    packed = pw.train.SPMD(stages, s, packed=True, name="topipe", **kw)
    pipe = pw.train.Pipeline(stages, [s, s], microbatches=2, name="frompacked", **kw)
    state, batch = packed.init(0), T.batch(CFG, 8)
    pw.train.fetch(state)  # (its unpacked TrainState made: the one a step must not consume)
    want = float(packed.evaluate(state, batch))
    np.testing.assert_allclose(float(pipe.evaluate(state, batch)), want, rtol=1e-5)
    new, loss = pipe.step(state, batch)
    _, again = pipe.step(state, batch)
    assert float(loss) == float(again)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    pw.train.fetch(state)  # still whole: packs and unpacked leaves
    assert not any(leaf.result().is_deleted() for leaf in jax.tree.leaves(state.unpacked()))
    _, from_packs = packed.step(state, batch)
    np.testing.assert_allclose(float(from_packs), want, rtol=1e-5)

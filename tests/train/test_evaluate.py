"""An eval step without update (``t.evaluate(state, batch)``) on both trainers: the value of
``model_loss`` under plain ``jax.jit``, reading the state without consuming it."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.train import transformer as T

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)


@pytest.mark.parametrize("trainer", ["spmd", "spmd-packed", "pipeline"])
def test_evaluate_is_model_loss_and_leaves_the_state_to_the_next_step(tctl, trainer):
    stages = T.split(CFG, 2)
    opt = optax.sgd(0.3, momentum=0.9)
    if trainer == "pipeline":
        t = pw.train.Pipeline(stages, [tctl.slice(2, island=0), tctl.slice(2, island=1)],
                              loss=T.cross_entropy, optimizer=opt, microbatches=2)
    else:
        t = pw.train.SPMD(stages, tctl.slice(4, island=0), loss=T.cross_entropy,
                          optimizer=opt, packed=trainer == "spmd-packed")
    train, held_out = T.batch(CFG, 8, seed=0), T.batch(CFG, 4, seed=7)  # (another size)
    state, _ = t.step(t.init(0), train)
    evaluated = t.evaluate(state, held_out)      # queued behind the step, not waited for
    again = t.evaluate(state, train)
    state_after, loss = t.step(state, train)     # the next step donates the state it read
    params = jax.device_get(pw.train.fetch(t.step(t.init(0), train)[0]).params)  # (again)
    want = jax.jit(pw.train.model_loss(stages, T.cross_entropy))
    np.testing.assert_allclose(float(evaluated), float(want(params, *held_out)), rtol=1e-5)
    np.testing.assert_allclose(float(again), float(loss), rtol=1e-5)  # the step's own loss
    assert np.isfinite(float(t.step(state_after, train)[1]))
    with pytest.raises(ValueError, match="divisible by"):
        t.evaluate(state_after, T.batch(CFG, 3, seed=1))


@pytest.mark.parametrize("trainer", ["spmd", "pipeline"])
def test_an_eval_here_or_on_another_island_reads_its_steps_params(
        tctl, trainer):
    """docs/training.md, 'Evaluation and metrics inside the training loop': an eval
    ``pw.function`` on a slice of another island, and ``evaluate``, read step n's parameters
    and are ``jax.jit``'s eval of ``jax.jit``'s step n, with step n+1 (which donates the
    parameters) submitted before either is read: a donating step waits for the earlier calls
    that read what it donates (``runtime/read_order.py``; before, an eval still waiting for
    its launch could be launched after the next step and fail as given a donated value)."""
    stages, opt = T.split(CFG, 2), optax.adam(1e-2)
    if trainer == "pipeline":
        t = pw.train.Pipeline(stages, [tctl.slice(2, island=0), tctl.slice(2, island=1)],
                              loss=T.cross_entropy, optimizer=opt, microbatches=2,
                              name="ev-pipe")
    else:
        t = pw.train.SPMD(stages, tctl.slice(4, island=0), loss=T.cross_entropy,
                          optimizer=opt, name="ev-spmd")
    full = pw.train.model_loss(stages, T.cross_entropy)
    on_other = pw.function(full, slice=tctl.slice(2, island=1))
    batches, held_out = [T.batch(CFG, 8, seed=i) for i in range(6)], T.batch(CFG, 8, seed=9)
    state = t.init(0)
    reference = jax.tree.map(np.asarray, jax.device_get(pw.train.fetch(state)))
    step, evaluate = (jax.jit(pw.train.train_step(stages, T.cross_entropy, opt)),
                      jax.jit(full))
    got, want = [], []
    if trainer == "pipeline":  # (inputs where the first stage reads them, targets the last)
        on_train = tuple(jax.device_put(v, NamedSharding(vs.mesh, P()))
                         for v, vs in zip(held_out, (t.slices[0], t.slices[-1]), strict=True))
    else:
        on_train = t.place(held_out)  # (on the trainer's slice, as its eval reads it)
    for batch in batches:
        state, _ = t.step(state, batch)
        got.append((on_other(state.params, *held_out),  # (NumPy: uploaded first)
                    t.evaluate(state, on_train)))  # queued
        reference, _ = step(reference, *batch)
        want.append(float(evaluate(reference.params, *held_out)))
    np.testing.assert_allclose([[float(v) for v in pair] for pair in got],
                               np.repeat(np.array(want)[:, None], 2, axis=1), rtol=2e-5)
    assert len(set(np.round(want, 3))) == len(want)   # each step's eval differs

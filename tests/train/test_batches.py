"""Batches the trainers refuse, with an error that says what to do instead of a wrong value."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer as T

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)


def trainer(ctl, name):
    stages, opt = T.split(CFG, 2), optax.sgd(0.1)
    if name == "pipeline":
        return pw.train.Pipeline(stages, [ctl.slice(1, island=0), ctl.slice(1, island=1)],
                                 loss=T.cross_entropy, optimizer=opt, microbatches=2)
    return pw.train.SPMD(stages, ctl.slice(2, island=0), loss=T.cross_entropy, optimizer=opt,
                         packed=name == "spmd-packed")


@pytest.mark.parametrize("name", ["pipeline", "spmd", "spmd-packed"])
def test_an_empty_batch_is_refused_and_the_state_trains_on(tctl, name):
    """0 examples divide over any microbatches and devices, but their mean loss is 0 / 0: a
    step on them wrote NaN into every parameter."""
    t = trainer(tctl, name)
    x, y = T.batch(CFG, 8)
    state, _ = t.step(t.init(0), (x, y))
    for call in (t.step, t.evaluate):
        with pytest.raises(ValueError, match="no examples"):
            call(state, (x[:0], y[:0]))
    state, loss = t.step(state, (x, y))
    assert np.isfinite(float(loss))
    assert all(np.isfinite(a).all() for a in jax.tree.leaves(pw.train.fetch(state).params))


def test_a_pipelines_evaluate_names_the_batch_it_takes_for_placed_microbatches(tctl):
    pipe = trainer(tctl, "pipeline")
    batch = T.batch(CFG, 8)
    state = pipe.init(0)
    with pytest.raises(TypeError, match=r"not pipe.place\(...\)'s microbatches"):
        pipe.evaluate(state, pipe.place(batch))
    want = float(pipe.evaluate(state, batch))
    _, loss = pipe.step(state, pipe.place(batch))  # (placed, they are step's)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_a_numpy_microbatch_count_is_taken_and_a_bool_is_not(tctl):
    """``microbatches = batch // per`` with NumPy sizes is a NumPy int: it was refused as
    "not a positive int"."""
    stages, slices = T.split(CFG, 2), [tctl.slice(1, island=0), tctl.slice(1, island=1)]
    pipe = pw.train.Pipeline(stages, slices, loss=T.cross_entropy, optimizer=optax.sgd(0.1),
                             microbatches=np.int64(8) // np.int64(4))
    assert pipe.microbatches == 2 and type(pipe.microbatches) is int
    with pytest.raises(ValueError, match="positive int, got True"):
        pw.train.Pipeline(stages, slices, loss=T.cross_entropy, optimizer=optax.sgd(0.1),
                          microbatches=True)


def test_microbatches_of_different_sizes_are_refused(tctl):
    """Cut by hand into microbatches of unequal sizes, a batch gave a loss (and gradients)
    that was not its mean, silently: each microbatch's mean loss weighs 1/M (for a small MLP,
    microbatches of 2 and 4 examples gave 1.61 where plain JAX's mean was 1.31)."""
    pipe = trainer(tctl, "pipeline")
    x, y = T.batch(CFG, 8)
    state = pipe.init(0)
    for xs, ys in [([x[:2], x[2:]], [y[:2], y[2:]]), ([x[:4], x[4:]], [y[:4], y[4:6]])]:
        with pytest.raises(ValueError, match=r"one leading \(batch\) size.*pipe.place"):
            pipe.step(state, pw.train.Microbatches((xs, ys)))
    with pytest.raises(ValueError, match="expected 2 microbatches, got 1 inputs"):
        pipe.step(state, pw.train.Microbatches(([x], [y])))
    want = float(pipe.evaluate(state, (x, y)))
    _, loss = pipe.step(state, pw.train.Microbatches(([x[:4], x[4:]], [y[:4], y[4:]])))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_stages_of_different_widths_name_each_slice_in_what_divides_the_batch(tctl):
    """Stages on 3 and 2 devices shard a microbatch over both, so it divides by lcm(3, 2) = 6:
    the error said "x 6 devices per stage slice", a slice size neither stage has."""
    stages = T.split(CFG, 2)
    pipe = pw.train.Pipeline(stages, [tctl.slice(3, island=0), tctl.slice(2, island=1)],
                             loss=T.cross_entropy, optimizer=optax.sgd(0.1), microbatches=2)
    x, y = T.batch(CFG, 8)
    state = pipe.init(0)
    with pytest.raises(ValueError, match=r"microbatches=2 x 6 \(the least common multiple of "
                       r"the stages' 3, 2 devices\) = 12.*batch of 12 examples"):
        pipe.step(state, (x, y))
    with pytest.raises(ValueError, match=r"divisible by 6 \(the least common multiple of the "
                       r"stages' 3, 2 devices\)"):
        pipe.evaluate(state, (x, y))
    x, y = T.batch(CFG, 12)
    want = float(pipe.evaluate(state, (x, y)))  # (before the step consumes the state)
    np.testing.assert_allclose(float(pipe.step(state, (x, y))[1]), want, rtol=1e-5)

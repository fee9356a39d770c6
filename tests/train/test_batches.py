"""Batches the trainers refuse, with an error that says what to do instead of a wrong value."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

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


@pytest.mark.parametrize("name", ["spmd", "spmd-packed"])
def test_an_spmd_given_a_pipelines_placed_microbatches_names_the_batch_it_takes(tctl, name):
    """An ``SPMD`` of the same stages given ``pipe.place(...)``'s microbatches (a research
    session switching trainers) traced their lists into the model and failed in its first
    layer: "unsupported operand type(s) for @: 'list' and 'LinearizeTracer'"."""
    pipe, spmd = trainer(tctl, "pipeline"), trainer(tctl, name)
    batch = T.batch(CFG, 8)
    placed = pipe.place(batch)
    state = spmd.init(0)
    for call, what in ((spmd.step, "spmd.step"), (spmd.evaluate, "spmd.evaluate")):
        with pytest.raises(TypeError, match=rf"{what} takes the batch whole.*"
                                            r"not pipe.place\(...\)'s microbatches.*"
                                            r"spmd.place\(\(x, y\)\)"):
            call(state, placed)
    want = float(spmd.evaluate(state, batch))  # (the state was neither consumed nor lost)
    _, loss = spmd.step(state, spmd.place(batch))
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


def _placed(ctl, pipe, x, y, how):
    """The batch as a loader hands it over ahead of the step: inputs on the first stage's
    slice, targets on the last's, by ``jax.device_put`` or as a preprocessing function's
    futures, sharded over each slice (``P('x')``) or replicated."""
    s0, s1 = pipe.slices[0], pipe.slices[-1]
    if how.startswith("device_put"):
        spec = P("x") if how.endswith("sharded") else P()
        return (jax.device_put(x, NamedSharding(s0.mesh, spec)),
                jax.device_put(y, NamedSharding(s1.mesh, spec)))
    specs = {"in_specs": pw.BATCH, "out_specs": pw.BATCH} if how.endswith("sharded") else {}
    return (pw.function(lambda v: v + 0, slice=s0, **specs)(x),
            pw.function(lambda v: v + 0, slice=s1, **specs)(y))


@pytest.mark.parametrize("how", ["device_put sharded", "device_put replicated",
                                 "futures sharded", "futures replicated"])
def test_a_pipeline_takes_a_batch_placed_on_its_stages(tctl, how):
    """A loader's prefetch, ``jax.device_put(batch, NamedSharding(s.mesh, P('x')))``, failed
    ``Pipeline.step`` and ``place`` with JAX's ShardingTypeError (the batch was cut into
    microbatches by eager indexing, a gather JAX cannot lay out on an explicit mesh). Now it
    is cut on the stage's slice: the losses are those of the NumPy batch, and the user's
    arrays are left as they were."""
    pipe = pw.train.Pipeline(T.split(CFG, 2), [tctl.slice(2, island=0), tctl.slice(2, island=1)],
                             loss=T.cross_entropy, optimizer=optax.sgd(0.1), microbatches=2)
    x, y = T.batch(CFG, 8)
    state = pipe.init(0)
    want = float(pipe.evaluate(state, (x, y)))
    for placing in (lambda b: b, pipe.place):
        batch = _placed(tctl, pipe, x, y, how)
        _, loss = pipe.step(jax.device_get(pw.train.fetch(state)), placing(batch))
        np.testing.assert_allclose(float(loss), want, rtol=1e-5)
        for given, host in zip(batch, (x, y), strict=True):
            np.testing.assert_array_equal(np.asarray(given), host)  # (not deleted, not changed)


@pytest.mark.parametrize("name", ["pipeline", "spmd"])
def test_a_batch_of_futures_is_not_waited_for_by_step_or_place(tctl, name):
    """A batch made by a preprocessing ``pw.function`` (futures) that is still running: a
    ``Pipeline``'s step cut it by indexing the futures and ``place`` (both trainers') put
    them with ``jax.device_put``, which waited for their values in the calling thread, so a
    loop could not launch step n + 1 before its batch was computed. The preprocessing here
    waits on a gate that opens only after the calls returned."""
    t = trainer(tctl, name)
    gate, timed_out = threading.Event(), []

    def held(v):
        if not gate.wait(30):
            timed_out.append(True)

    def prep(x, y):
        jax.debug.callback(held, jnp.sum(y))
        return x, y

    first = t.slices[0] if name == "pipeline" else t.slice
    pre = pw.function(prep, slice=first, in_specs=pw.BATCH, out_specs=pw.BATCH)
    x, y = T.batch(CFG, 8)
    state = t.init(0)
    want = float(t.evaluate(state, (x, y)))
    try:
        batch = pre(x, y)
        placed = t.place(batch)
        _, loss = t.step(jax.device_get(pw.train.fetch(state)), batch)  # (a copy)
        assert not loss.done() and not timed_out  # (returned with the gate still closed)
    finally:
        gate.set()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    _, loss = t.step(state, placed)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert not timed_out

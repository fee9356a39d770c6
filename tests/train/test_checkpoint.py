"""Saving a training state and resuming from it on a new controller, as after a kernel restart:
a packed state pickles, copies and goes to the host as its ``TrainState`` of values."""

from __future__ import annotations

import copy
import pickle

import jax
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer as T

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)


def trainer(ctl, devices=2):
    return pw.train.SPMD(T.split(CFG, 2), ctl.slice(devices, island=0), loss=T.cross_entropy,
                         optimizer=optax.adam(1e-2), packed=True, name="ckpt")


def test_a_packed_state_pickles_as_its_values_and_resumes_on_a_new_controller():
    """``pickle.dumps(state)`` of a packed trainer's state (its step still running) gives its
    ``TrainState`` of values, as a future pickles as its array, and ``copy.deepcopy`` gives
    such a copy; before, both failed with "cannot pickle 'Device' object". The pickled
    state resumes on a new controller (the first one closed, as by a kernel restart) with
    the losses of training on."""
    batches = [T.batch(CFG, 8, seed=i) for i in range(4)]
    first = pw.Controller(islands=(4, 4))
    try:
        spmd = trainer(first)
        state, _ = spmd.step(spmd.init(0), batches[0])
        saved = pickle.dumps(state)                   # (the step need not have ended)
        kept = copy.deepcopy(state)
        assert isinstance(kept, pw.train.TrainState)
        going_on = []
        for batch in batches[1:]:
            state, loss = spmd.step(state, batch)
            going_on.append(float(loss))
    finally:
        first.close()
    second = pw.Controller(islands=(4, 4))
    try:
        resumed, again = trainer(second, devices=4), []
        state = pickle.loads(saved)
        assert isinstance(state, pw.train.TrainState)
        for batch in batches[1:]:
            state, loss = resumed.step(state, batch)
            again.append(float(loss))
    finally:
        second.close()
    np.testing.assert_allclose(again, going_on, rtol=1e-5)
    assert len(jax.tree.leaves(jax.device_get(kept))) == 47  # (the copy is the user's)


def test_a_packed_state_is_no_array_and_says_how_to_take_its_values(tctl):
    """``np.asarray``, ``jax.tree.map(np.asarray, state)`` and ``jax.device_get(state)`` on a
    packed state say that it is a whole state and what gives its values; before,
    ``jax.device_get`` returned the live state itself (whose packs the next step donates:
    no checkpoint at all) and ``np.asarray`` failed on "an inhomogeneous shape".
    ``jax.block_until_ready`` waits for it, as for a future."""
    spmd = trainer(tctl)
    state, _ = spmd.step(spmd.init(0), T.batch(CFG, 8, seed=0))
    for take in (np.asarray, lambda s: jax.tree.map(np.asarray, s), jax.device_get):
        with pytest.raises(TypeError, match=r"jax\.device_get\(pw\.train\.fetch\(state\)\)"):
            take(state)
    assert jax.block_until_ready(state) is state
    assert all(f.done() for f in state.futures)

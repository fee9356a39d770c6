"""A model split into stages of different sizes (1 / 2 / 1 blocks), pipelined, against the
same stages trained whole in plain ``jax.jit`` + optax."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer as T
from tests.train.test_train import plain_jax_losses

CFG = T.Config(vocab=16, width=8, heads=2, layers=4, seq=4)


def test_a_transformer_splits_into_stages_of_given_sizes_and_trains_as_plain_jax(tctl):
    stages = T.split(CFG, (1, 2, 1))
    sizes = [len(s.init(jax.random.PRNGKey(0))["blocks"]) for s in stages]
    assert sizes == [1, 2, 1]
    opt = optax.adam(1e-2)
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=0),
                                      tctl.slice(1, island=1)],
                             loss=T.cross_entropy, optimizer=opt, microbatches=2,
                             name="uneven")
    state = pipe.init(0)
    params = jax.device_get(pw.train.fetch(state).params)
    data = [T.batch(CFG, 4, seed=i) for i in range(3)]
    got = []
    for batch in data:
        state, loss = pipe.step(state, batch)
        got.append(float(loss))

    want, _ = plain_jax_losses(stages, params, data, opt)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("blocks, why", [(3, "do not split into 3 equal stages"),
                                         ((1, 2), "sum to 3, not the 4 layers"),
                                         ((2, -1, 3), "non-negative"),
                                         ((), "at least one stage")])
def test_a_split_that_does_not_fit_the_layers_says_what_does(blocks, why):
    with pytest.raises(ValueError, match=why):
        T.split(CFG, blocks)

"""Weights tied across a Pipeline's stages (``tied=``, ``pwkernel/train/tied.py``): a GPT-2
style model whose input embedding and output head share one table, the table in the first
stage and in the last, trains as plain ``jax.jit`` trains the model with ONE table."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import transformer as T
from tests.helpers.train_memory import held_over_steps

CFG = T.Config(vocab=16, width=8, heads=2, layers=4, seq=6)


def stage(blocks: int, first: bool, last: bool) -> pw.train.Stage:
    """A stage of ``blocks`` Transformer blocks; the first holds the embedding, the last the
    head, which is the embedding transposed (each holds its own copy of ``embed``)."""
    def init(key):
        k = jax.random.split(key, blocks + 1)
        p = {"blocks": [T.init_block(k[i], CFG.width) for i in range(blocks)]}
        if first or last:
            p["embed"] = jax.random.normal(k[-1], (CFG.vocab, CFG.width)) * 0.3
        if last:
            p["bias"] = jnp.zeros(CFG.vocab)
        return p

    def apply(p, h):
        if first:
            h = jax.nn.one_hot(h, CFG.vocab) @ p["embed"]
        for bp in p["blocks"]:
            h = T.block(bp, h, CFG.heads)
        return h @ p["embed"].T + p["bias"] if last else h
    return pw.train.Stage(init, apply)


def stages(n: int) -> list:
    per = [CFG.layers // n] * n
    per[0] += CFG.layers - sum(per)
    return [stage(b, s == 0, s == n - 1) for s, b in enumerate(per)]


def one_table(params: list) -> dict:
    """The same model with one table (the first stage's): what jax.jit trains."""
    return {"embed": params[0]["embed"], "bias": params[-1]["bias"],
            "blocks": [b for p in params for b in p["blocks"]]}


def model_loss(p, x, y):
    h = jax.nn.one_hot(x, CFG.vocab) @ p["embed"]
    for bp in p["blocks"]:
        h = T.block(bp, h, CFG.heads)
    return T.cross_entropy(h @ p["embed"].T + p["bias"], y)


def reference(optimizer):
    @jax.jit
    def step(p, o, x, y):
        value, g = jax.value_and_grad(model_loss)(p, x, y)
        updates, o = optimizer.update(g, o, p)
        return optax.apply_updates(p, updates), o, value
    return step


@pytest.mark.parametrize("schedule,n,devices,clip", [("gpipe", 3, 1, False),
                                                     ("1f1b", 4, 2, True)])
def test_a_tied_embedding_trains_as_jax_jit_with_one_table(tctl, schedule, n, devices, clip):
    """Losses and the table step by step against jax.jit of the model with one table (the
    copies' gradients summed, each copy updated alike); the copies stay equal. With
    pw.train.clip_by_global_norm (clipping every step here), the norm counts the table once."""
    optimizer = optax.adam(3e-2)
    if clip:
        optimizer = optax.chain(pw.train.clip_by_global_norm(0.5), optimizer)
    slices = [tctl.slice(devices, island=s * 2 // n) for s in range(n)]
    pipe = pw.train.Pipeline(stages(n), slices, loss=T.cross_entropy, optimizer=optimizer,
                             schedule=schedule, microbatches=4,
                             tied=[[(0, "embed"), (n - 1, "embed")]])
    state = pipe.init(0)
    start = jax.device_get(pw.train.fetch(state.params))
    assert np.array_equal(start[0]["embed"], start[-1]["embed"])  # (the first stage's init)
    ref = one_table(start)
    opt_state, step = optimizer.init(ref), reference(optimizer)
    for i in range(4):
        x, y = T.batch(CFG, 8, seed=i)
        state, loss = pipe.step(state, (x, y))
        ref, opt_state, want = step(ref, opt_state, x, y)
        got = jax.device_get(pw.train.fetch(state.params))
        np.testing.assert_allclose(float(loss), float(want), rtol=2e-6)
        np.testing.assert_allclose(got[0]["embed"], ref["embed"], atol=2e-6)
        np.testing.assert_allclose(got[-1]["embed"], ref["embed"], atol=2e-6)
        # each stage compiles its own update: Adam's arithmetic may round 1 ulp apart
        np.testing.assert_allclose(got[0]["embed"], got[-1]["embed"], rtol=0, atol=3e-7)


def test_a_tied_pipelines_memory_stays_flat_and_the_copies_equal(tctl):
    slices = [tctl.slice(1, island=s // 2) for s in range(3)]
    pipe = pw.train.Pipeline(stages(3), slices, loss=T.cross_entropy,
                             optimizer=optax.sgd(0.1), microbatches=2,
                             tied=[(0, "embed"), (2, ("embed",))])  # (one group, bare)
    held, state, _ = held_over_steps(tctl, pipe, lambda i: T.batch(CFG, 4, seed=i % 2))
    assert len(set(held)) == 1, held
    p = jax.device_get(pw.train.fetch(state.params))
    assert np.array_equal(p[0]["embed"], p[2]["embed"])  # (SGD: bit for bit)


@pytest.mark.parametrize("tied,match", [
    ([[(0, "embed"), (5, "embed")]], "stages 0 to 2"),
    ([[(0, "embed"), (2, "head")]], "no such leaf.*blocks/0/ln1"),
    ([[(0, "embed"), (2, "bias")]], r"differ: float32\[16, 8\] against float32\[16\]"),
    ([[(0, "embed"), (0, "blocks/0/qkv")]], "names stage 0 twice"),
    ([[(0, "embed")]], "two or more"),
    ([[(0, "blocks/0/out"), (1, "blocks/0/out")], [(1, "blocks/0/out"), (2, "blocks/0/out")]],
     "tied twice"),
    ([[(0, "blocks/0/out"), (1, "['blocks'][0]['qkv']")]], r"float32\[8, 8\] against"),
    ("embed", "list of groups"),
])
def test_bad_tied_specs_are_refused_with_what_is_wrong(tctl, tied, match):
    slices = [tctl.slice(1, island=0) for _ in range(3)]
    with pytest.raises((ValueError, TypeError), match=match):
        pw.train.Pipeline(stages(3), slices, loss=T.cross_entropy, optimizer=optax.sgd(0.1),
                          tied=tied)


def test_a_tied_dtype_mismatch_is_refused(tctl):
    first, mid, last = stages(3)
    wide = pw.train.Stage(lambda k: jax.tree.map(lambda a: a.astype(jnp.bfloat16)
                                                 if a.ndim == 2 and a.shape[0] == 16 else a,
                                                 last.init(k)), last.apply)
    slices = [tctl.slice(1, island=0) for _ in range(3)]
    with pytest.raises(ValueError, match=r"float32\[16, 8\] against bfloat16\[16, 8\]"):
        pw.train.Pipeline([first, mid, wide], slices, loss=T.cross_entropy,
                          optimizer=optax.sgd(0.1), tied=[[(0, "embed"), (2, "embed")]])

"""A small decoder-only Transformer in plain JAX, split into pipeline stages by layers.

Token embedding, ``layers`` pre-norm blocks (causal self-attention, then an MLP), a final norm
and a language-model head. The first stage holds the embedding, the last the norm and head;
the blocks are dealt evenly, or as many to each stage as
``split`` is told. The embedding is a one-hot matmul (not a gather): its sharding is
unambiguous on explicit mesh axes, with the batch sharded over a slice.

>>> cfg = Config(vocab=32, width=16, heads=2, layers=2, seq=8)
>>> stages = split(cfg, 2)
>>> x, y = batch(cfg, 4, seed=0)
>>> x.shape, y.shape, len(stages)
((4, 8), (4, 8), 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .stage import Stage


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    width: int = 128
    heads: int = 4
    layers: int = 4
    seq: int = 64


def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def block(p: dict, h, heads: int):
    """One pre-norm decoder block: causal self-attention, then a GELU MLP."""
    b, t, d = h.shape
    q, k, v = jnp.split(_norm(h, p["ln1"]) @ p["qkv"], 3, axis=-1)

    def heads_first(a):
        return a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)

    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1) @ v
    h = h + att.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["out"]
    return h + jax.nn.gelu(_norm(h, p["ln2"]) @ p["up"]) @ p["down"]


def init_block(key, d: int) -> dict:
    """One block's parameters: its four matrices cut from one normal draw (one random call
    per block keeps the init's compile short), each scaled by 1/sqrt(fan-in)."""
    shapes = {"qkv": (d, 3 * d), "out": (d, d), "up": (d, 4 * d), "down": (4 * d, d)}
    flat = jax.random.normal(key, (sum(a * b for a, b in shapes.values()),), jnp.float32)
    p, at = {"ln1": jnp.ones(d), "ln2": jnp.ones(d)}, 0
    for name, (n_in, n_out) in shapes.items():
        p[name] = flat[at:at + n_in * n_out].reshape(n_in, n_out) / np.sqrt(n_in)
        at += n_in * n_out
    return p


def split(cfg: Config, stages: int | Sequence[int]) -> list[Stage]:
    """The model as ``stages`` stages of ``cfg.layers / stages`` blocks each, or, given a
    sequence, as stages of those many blocks (``split(cfg, (1, 2, 1))``: 4 layers, the
    middle stage holding two; a first or last stage of 0 blocks holds the embedding or the
    head alone)."""
    if cfg.width % cfg.heads:
        raise ValueError(f"width {cfg.width} is not divisible by heads {cfg.heads}.")
    if isinstance(stages, int | np.integer):
        if stages < 1 or cfg.layers % stages:
            raise ValueError(f"{cfg.layers} layers do not split into {stages} equal stages; "
                             f"use a number of stages that divides {cfg.layers}, or blocks "
                             f"per stage that sum to it (split(cfg, (1, 2, 1)), say).")
        blocks = [cfg.layers // int(stages)] * int(stages)
    else:
        blocks = list(stages)
        if not blocks or any(not isinstance(b, int | np.integer) or b < 0 for b in blocks):
            raise ValueError(f"blocks per stage must be at least one stage of non-negative "
                             f"ints, got {stages!r}.")
        if sum(blocks) != cfg.layers:
            raise ValueError(f"blocks per stage {tuple(blocks)} sum to {sum(blocks)}, not the "
                             f"{cfg.layers} layers of the model. Maybe you want "
                             f"Config(..., layers={sum(blocks)}).")
    last = len(blocks) - 1
    return [_stage(cfg, int(n), s == 0, s == last, f"stage{s}") for s, n in enumerate(blocks)]


def _stage(cfg: Config, blocks: int, first: bool, last: bool, name: str) -> Stage:
    d = cfg.width

    def init(key):
        k = jax.random.split(key, blocks + 2)
        p = {"blocks": [init_block(k[i], d) for i in range(blocks)]}
        if first:
            p["embed"] = jax.random.normal(k[-2], (cfg.vocab, d), jnp.float32) * 0.02
        if last:
            p["ln_f"] = jnp.ones(d)
            p["head"] = jax.random.normal(k[-1], (d, cfg.vocab), jnp.float32) / np.sqrt(d)
        return p

    def apply(p, h):
        if first:
            h = jax.nn.one_hot(h, cfg.vocab, dtype=p["embed"].dtype) @ p["embed"]
        for bp in p["blocks"]:
            h = block(bp, h, cfg.heads)
        if last:
            h = _norm(h, p["ln_f"]) @ p["head"]
        return h

    return Stage(init, apply, name)


def cross_entropy(logits, targets):
    """The mean next-token cross-entropy of a microbatch (``targets``: token ids)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.sum(jax.nn.one_hot(targets, logits.shape[-1], dtype=logp.dtype) * logp, -1)
    return -jnp.mean(picked)


def batch(cfg: Config, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``size`` random sequences: inputs and next-token targets, ``int32[size, seq]`` each."""
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab, (size, cfg.seq + 1),
                                                  dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]

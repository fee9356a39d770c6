"""Pipelining a small decoder-only Transformer vs running it SPMD, in tokens per second.

- **SPMD**: one ``pw.function`` holding the whole model on an N-device slice, batch sharded
  over the slice, parameters replicated.
- **Pipelined**: the layers split into S stages, each a ``pw.function`` on its own slice of
  N/S devices of the same island (so both sides use the same N devices), the batch split into M
  microbatches, GPipe-style: every (microbatch, stage) call traced into one ``@pw.program``. The
  runtime's transfers move activations between stage slices; the island's gang scheduler runs
  stage s on microbatch m+1 while stage s+1 works on microbatch m.

The workload is the forward pass and the next-token loss (no backward pass: the paper measured
training, we measure the dispatch and overlap structure, which a forward pass already has).

>>> from pwkernel.bench import pipeline
>>> pipeline.run("tiny").ratios                 # doctest: +SKIP
{'pipeline_vs_spmd': 0.9}
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from .harness import Result, check_mode, interleave, paired_ratio, rate, summarize


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    width: int = 128
    heads: int = 4
    layers: int = 4
    seq: int = 64
    batch: int = 32


CONFIGS = {
    "tiny": {"model": ModelConfig(64, 32, 2, 2, 16, 8), "devices": 2, "stages": (2,),
             "microbatches": 2, "rounds": 1, "batches": 1},
    "quick": {"model": ModelConfig(), "devices": 4, "stages": (2, 4), "microbatches": 2,
              "rounds": 5, "batches": 2},
    "full": {"model": ModelConfig(512, 256, 8, 8, 128, 64), "devices": 4, "stages": (2, 4),
             "microbatches": 4, "rounds": 7, "batches": 4},
}


# --- the model ------------------------------------------------------------------------------
def init_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Embedding, ``layers`` pre-norm decoder blocks and an unembedding, as numpy arrays."""
    rng = np.random.default_rng(seed)
    d = cfg.width

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    blocks = [{"ln1": np.ones(d, np.float32), "qkv": w(d, 3 * d), "out": w(d, d),
               "ln2": np.ones(d, np.float32), "up": w(d, 4 * d), "down": w(4 * d, d)}
              for _ in range(cfg.layers)]
    return {"embed": w(cfg.vocab, d), "blocks": blocks, "unembed": w(d, cfg.vocab)}


def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def block(p: dict, h, heads: int):
    """One pre-norm decoder block: causal self-attention, then an MLP."""
    b, t, d = h.shape
    q, k, v = jnp.split(_norm(h, p["ln1"]) @ p["qkv"], 3, axis=-1)
    split = lambda a: a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1) @ v
    h = h + att.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["out"]
    return h + jax.nn.gelu(_norm(h, p["ln2"]) @ p["up"]) @ p["down"]


def _loss(unembed, h, tokens):
    logits = h[:, :-1] @ unembed
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0].mean(axis=-1)


def stage_fn(first: bool, last: bool, heads: int):
    """A stage's function: (params, tokens) for the first, (params, h[, tokens]) after."""
    def run_blocks(params, h):
        for p in params["blocks"]:
            h = block(p, h, heads)
        return h

    if first and last:
        return lambda params, tokens: _loss(params["unembed"],
                                            run_blocks(params, params["embed"][tokens]), tokens)
    if first:
        return lambda params, tokens: run_blocks(params, params["embed"][tokens])
    if last:
        return lambda params, h, tokens: _loss(params["unembed"], run_blocks(params, h), tokens)
    return run_blocks


def split_params(params: dict, stages: int) -> list[dict]:
    """The blocks dealt into ``stages`` contiguous groups; embed/unembed on the ends."""
    n = len(params["blocks"])
    if n % stages:
        raise ValueError(f"{n} layers do not split into {stages} equal stages; use a number of "
                         f"stages that divides {n}.")
    per = n // stages
    out = [{"blocks": params["blocks"][s * per:(s + 1) * per]} for s in range(stages)]
    out[0]["embed"] = params["embed"]
    out[-1]["unembed"] = params["unembed"]
    return out


# --- the two ways to run it -----------------------------------------------------------------
def _on(vs: pw.VirtualSlice, tree, spec: P):
    return jax.device_put(tree, NamedSharding(vs.mesh, spec))


def spmd_rate(ctl: pw.Controller, cfg: ModelConfig, devices: int, params: dict, tokens, batches):
    # The model is written for the compiler's sharding propagation (its embedding lookup
    # gathers with sharded token ids): auto axes.
    vs = ctl.slice(devices, island=0, axis_types="auto")
    fn = pw.function(stage_fn(True, True, cfg.heads), slice=vs, in_specs=(P(), P("x")),
                     out_specs=P("x"), name="spmd")
    p, toks = _on(vs, params, P()), _on(vs, tokens, P("x"))

    def once():
        outs = [fn(p, toks) for _ in range(batches)]
        for out in outs:
            out.result().block_until_ready()
    return lambda: rate(once, batches * cfg.batch * cfg.seq)


def stage_functions(cfg: ModelConfig, slices) -> list[pw.CompiledFunction]:
    """One compiled function per pipeline stage, each on its slice (batch sharded over it)."""
    last = len(slices) - 1
    return [pw.function(stage_fn(s == 0, s == last, cfg.heads), slice=vs,
                        in_specs=(P(), P("x"), P("x")) if 0 < s == last else (P(), P("x")),
                        out_specs=P("x"), name=f"stage{s}") for s, vs in enumerate(slices)]


def gpipe_program(fns: list[pw.CompiledFunction], name: str = "gpipe") -> pw.Program:
    """GPipe as one program: every stage on every microbatch, microbatch-major (the gang
    scheduler overlaps the stages on their own devices). Takes the stages' parameters and the
    microbatches; returns each microbatch's per-sequence losses."""

    @pw.program(name=name)
    def gpipe(ps, ts):
        losses = []
        for t in ts:
            h = fns[0](ps[0], t)
            for s in range(1, len(fns) - 1):
                h = fns[s](ps[s], h)
            losses.append(fns[-1](ps[-1], h, t))
        return losses

    return gpipe


def pipelined_rate(ctl: pw.Controller, cfg: ModelConfig, devices: int, stages: int, micro: int,
               params: dict, tokens, batches):
    per = devices // stages
    slices = [ctl.slice(per, island=0, axis_types="auto") for _ in range(stages)]
    if len({d for vs in slices for d in vs.device_ids}) != devices:
        raise RuntimeError("pipeline stages did not get disjoint slices; expected the resource "
                           f"manager to spread {stages} slices over {devices} devices.")
    gpipe = gpipe_program(stage_functions(cfg, slices), name=f"gpipe{stages}")
    params_on = [_on(vs, p, P()) for vs, p in zip(slices, split_params(params, stages),
                                                   strict=True)]
    mb = np.split(tokens, micro)
    toks = [_on(slices[0], t, P("x")) for t in mb]

    def once():
        outs = [gpipe(params_on, toks) for _ in range(batches)]
        for losses in outs:
            for loss in losses:
                loss.result().block_until_ready()
    return lambda: rate(once, batches * cfg.batch * cfg.seq)


def run(mode: str = "quick") -> Result:
    """Tokens per second, SPMD vs S-stage pipelines on the same devices, interleaved."""
    cfg = CONFIGS[check_mode(mode)]
    model: ModelConfig = cfg["model"]
    t0 = time.perf_counter()
    params = init_params(model)
    tokens = np.random.default_rng(1).integers(0, model.vocab, (model.batch, model.seq),
                                               dtype=np.int32)
    rows = []
    ctl = pw.Controller(islands=(4, 4))
    try:
        spmd = spmd_rate(ctl, model, cfg["devices"], params, tokens, cfg["batches"])
        for stages in cfg["stages"]:
            micro = cfg["microbatches"] * stages
            piped = pipelined_rate(ctl, model, cfg["devices"], stages, micro, params, tokens,
                               cfg["batches"])
            samples = interleave({"spmd": spmd, "pipelined": piped}, rounds=cfg["rounds"])
            rows.append({"devices": cfg["devices"], "stages": stages, "microbatches": micro,
                         "tokens_per_s": {k: summarize(v) for k, v in samples.items()},
                         "pipeline_vs_spmd": paired_ratio(samples, "pipelined", "spmd")})
    finally:
        ctl.close()
    notes = ["tokens_per_s: forward pass + loss, tokens per second (median, min, max).",
             "headline: the worst of the pipelines measured (S="
             + " and S=".join(map(str, cfg["stages"])) + ").",
             "config.microbatches is per stage: a pipeline of S stages runs S times as many "
             "(each row's microbatches)."]
    config = {**cfg, "model": model.__dict__}
    return Result("pipeline", mode, config, rows,
                  {"pipeline_vs_spmd": min(r["pipeline_vs_spmd"] for r in rows)}, notes,
                  time.perf_counter() - t0)

"""Training a small decoder-only Transformer through ``pw.train``: SPMD against plain
``jax.jit``, pipelined against SPMD, two islands against one, and 1F1B's memory against GPipe's.

All on one controller (the host as 2 islands x 4 devices), each comparison interleaved in
paired rounds (``harness.interleave``); a sample runs ``steps`` training steps, each step's
state flowing (donated) into the next, and is the tokens per second of those steps.

- ``train_spmd_vs_jax``: ``pw.train.SPMD`` on island 0's 4 devices (batch sharded, parameters
  replicated, state donated) against the same step (``pw.train.train_step``) compiled by plain
  ``jax.jit`` on the same mesh with the same shardings and donation.
  At each batch size of ``spmd_batches``; the headline is the worst.
- ``train_pipeline_vs_spmd``: a 2-stage 1F1B ``pw.train.Pipeline`` on the same 4 devices (2 per
  stage, microbatches sharded over them) against SPMD.
- ``train_two_islands_vs_one``: the same pipeline with its stages on two islands (activations
  and cotangents over the DCN) against both stages on island 0.
- ``train_1f1b_vs_gpipe_peak_memory``: the pipeline's peak activation memory under 1F1B over
  GPipe's (lower is better): ``ctl.memory()`` sampled during a step run with sequential
  dispatch, above what was held before it (``pw.train.MemorySampler``). Beside it: the same
  under parallel dispatch, where the control plane launches (and so allocates for) the whole
  step ahead and both schedules hold about as much; the residuals' peak read from the trace
  (``pw.train.peak_residuals``); and each schedule's bubble (``pw.train.bubble``).

The virtual devices share this machine's CPU cores, so stages cannot run at the same time as
on the paper's TPUs: the pipeline and two-island ratios show what the schedule and transfers
cost here, not the paper's gain.

>>> from pwkernel.bench import train
>>> sorted(train.run("tiny").ratios)                          # doctest: +SKIP
['train_1f1b_vs_gpipe_peak_memory', 'train_pipeline_vs_spmd', 'train_spmd_vs_jax', ...]
"""

from __future__ import annotations

import statistics
import time

import jax
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from ..train import (
    SPMD,
    MemorySampler,
    Pipeline,
    bubble,
    fetch,
    peak_residuals,
    train_step,
    wait,
)
from ..train import transformer as T
from ..train.measure import steps as step_runs
from .harness import Result, check_mode, interleave, paired_ratio, rate, summarize

CONFIGS = {
    "tiny": {"model": T.Config(32, 16, 2, 2, 8), "batch": 8, "spmd_batches": (8,),
             "microbatches": 4, "memory_microbatches": 4, "rounds": 1, "steps": 2},
    "quick": {"model": T.Config(128, 64, 4, 4, 32), "batch": 32, "spmd_batches": (4, 32, 128),
              "microbatches": 4, "memory_microbatches": 8, "rounds": 5, "steps": 8},
    "full": {"model": T.Config(256, 128, 4, 4, 64), "batch": 64, "spmd_batches": (64, 256),
             "microbatches": 8, "memory_microbatches": 16, "rounds": 7, "steps": 4},
}
LR = 1e-3
PER_STAGE = 2  # devices per pipeline stage; SPMD takes the 4 devices of island 0


class Trainer:
    """A state carried from sample to sample, and ``sample()``: ``steps`` steps, in tokens
    per second."""

    def __init__(self, step, state, batch, steps: int, tokens: int):
        self.step, self.state, self.batch, self.steps, self.tokens = (step, state, batch,
                                                                       steps, tokens)

    def once(self):
        loss = None
        for _ in range(self.steps):
            self.state, loss = self.step(self.state, self.batch)
        jax.block_until_ready(wait((self.state, loss)))  # (a packed state is not unpacked)

    def sample(self) -> float:
        return rate(self.once, self.steps * self.tokens)


def jax_trainer(spmd: SPMD, state, batch, steps: int, tokens: int) -> Trainer:
    """The SPMD step under plain ``jax.jit``: same function, mesh, shardings and donation.
    A packed trainer's (``state``: its ``init()``) is its packed step, on the packs."""
    mesh = spmd.slice.mesh
    rep = NamedSharding(mesh, P())
    data = NamedSharding(mesh, P(mesh.axis_names[0]))
    step = train_step(spmd.stages, spmd.loss, spmd.optimizer)
    if spmd.packed:
        step, state = spmd.layout.wrap(step), state.packed
    state = jax.device_put(fetch(state), rep)
    x, y = (jax.device_put(a, data) for a in batch)
    with jax.set_mesh(mesh):  # as pw.function compiles: under the slice's mesh
        compiled = jax.jit(step, in_shardings=(rep, data, data), out_shardings=rep,
                           donate_argnums=(0,)).lower(state, x, y).compile()

    def call(s, b):
        return compiled(s, *b)
    return Trainer(call, state, (x, y), steps, tokens)


def compare(rows: list, key: str, trainers: dict, rounds: int, **about) -> float:
    """Interleave two trainers (the first over the second), add the row, return the ratio."""
    (a, ta), (b, tb) = trainers.items()
    samples = interleave({a: ta.sample, b: tb.sample}, rounds=rounds)
    ratio = paired_ratio(samples, a, b)
    rows.append({"comparison": key, **about,
                 "tokens_per_s": {n: summarize(v) for n, v in samples.items()}, "ratio": ratio})
    return ratio


def spmd_rows(cfg: dict, spmd: SPMD, packed: SPMD, rows: list) -> dict[str, float]:
    """pw.train.SPMD (a future per state leaf, and packed) against plain jax.jit at each batch
    size, the three interleaved; returns each key's worst ratio."""
    model, k = cfg["model"], cfg["steps"]
    worst = {"train_spmd_vs_jax": float("inf"), "train_spmd_packed_vs_jax": float("inf")}
    for size in cfg["spmd_batches"]:
        batch, tokens = T.batch(model, size, seed=0), size * model.seq
        trainers = {"pw_spmd": Trainer(spmd.step, spmd.init(0), spmd.place(batch), k, tokens),
                    "pw_spmd_packed": Trainer(packed.step, packed.init(0), packed.place(batch),
                                              k, tokens),
                    "jax_spmd": jax_trainer(spmd, spmd.init(0), batch, k, tokens)}
        samples = interleave({n: t.sample for n, t in trainers.items()}, rounds=cfg["rounds"])
        jax_ms = round(1e3 * tokens / summarize(samples["jax_spmd"])["median"], 2)
        for key, name in (("train_spmd_vs_jax", "pw_spmd"),
                          ("train_spmd_packed_vs_jax", "pw_spmd_packed")):
            ratio = paired_ratio(samples, name, "jax_spmd")
            rows.append({"comparison": key, "batch": size, "jax_step_ms": jax_ms, "ratio": ratio,
                         "tokens_per_s": {n: summarize(samples[n])
                                          for n in (name, "jax_spmd")}})
            worst[key] = min(worst[key], ratio)
    return worst


def run(mode: str = "quick") -> Result:
    cfg = CONFIGS[check_mode(mode)]
    model: T.Config = cfg["model"]
    t0 = time.perf_counter()
    tokens, k = cfg["batch"] * model.seq, cfg["steps"]
    batch = T.batch(model, cfg["batch"], seed=0)
    stages = T.split(model, 2)
    rows, extra, ratios = [], {}, {}
    ctl = pw.Controller(islands=(4, 4))
    try:
        isl0, isl1 = (ctl.islands[i].device_ids for i in (0, 1))

        def pipeline(places, microbatches, name):
            slices = [ctl.slice(PER_STAGE, island=i, devices=ds) for i, ds in places]
            return Pipeline(stages, slices, loss=T.cross_entropy, optimizer=optax.adam(LR),
                            microbatches=microbatches, name=name)

        spmd, packed = (SPMD(stages, ctl.slice(4, island=0, devices=isl0), loss=T.cross_entropy,
                             optimizer=optax.adam(LR), packed=p, name=n)
                        for p, n in ((False, "spmd"), (True, "spmd_packed")))
        ratios.update(spmd_rows(cfg, spmd, packed, rows))
        extra["state_futures"] = len(jax.tree_util.tree_leaves(spmd.init(0)))
        extra["packed_state_futures"] = len(packed.init(0).futures)
        one = pipeline([(0, isl0[:2]), (0, isl0[2:])], cfg["microbatches"], "one_island")
        two = pipeline([(0, isl0[:2]), (1, isl1[:2])], cfg["microbatches"], "two_islands")
        piped = Trainer(one.step, one.init(0), one.place(batch), k, tokens)
        ratios["train_pipeline_vs_spmd"] = compare(
            rows, "train_pipeline_vs_spmd",
            {"pw_pipeline": piped,
             "pw_spmd": Trainer(spmd.step, spmd.init(0), spmd.place(batch), k, tokens)},
            cfg["rounds"], batch=cfg["batch"])
        ratios["train_two_islands_vs_one"] = compare(
            rows, "train_two_islands_vs_one",
            {"pw_pipeline_two_islands": Trainer(two.step, two.init(0), two.place(batch), k,
                                                tokens), "pw_pipeline": piped},
            cfg["rounds"], batch=cfg["batch"])
        memory = one if cfg["memory_microbatches"] == cfg["microbatches"] else pipeline(
            [(0, isl0[:2]), (0, isl0[2:])], cfg["memory_microbatches"], "memory")
        extra["memory"] = schedule_memory(ctl, memory, batch, cfg["rounds"])
        ratios["train_1f1b_vs_gpipe_peak_memory"] = extra["memory"]["ratio_sampled"]
    finally:
        ctl.close()
    steps_ms = [r["jax_step_ms"] for r in rows if r["comparison"] == "train_spmd_vs_jax"]
    notes = [
        f"tokens_per_s: training tokens per second (median, min, max), each sample {k} "
        f"steps; plain JAX's SPMD step takes {', '.join(f'{t:g}' for t in steps_ms)} ms at "
        f"batch {', '.join(map(str, cfg['spmd_batches']))}.",
        "train_spmd_vs_jax: the worst batch size (the target, 0.98, is for steps of 3 ms and "
        "more). Each step is submitted while the previous one runs, as under JAX's "
        "asynchronous dispatch; what is left is pwkernel's host CPU per step (submitting the "
        f"step, then making, resolving and freeing one future per leaf of the state: "
        f"{extra['state_futures']} here), which on a CPU-only machine the XLA computation "
        "itself needs (docs/training.md, Figures).",
        "train_spmd_packed_vs_jax: the same with packed=True (the state as "
        f"{extra['packed_state_futures']} flat arrays, one per dtype, packed inside the step): "
        "a few futures a step, for one more pass over the state on the devices, which on "
        "these CPU devices (four replicas of the state in one machine's memory) costs more "
        "than the futures it saves (docs/training.md, Packed state).",
        "train_pipeline_vs_spmd, train_two_islands_vs_one: reported, not expected to meet the "
        "paper's figures: the 8 virtual devices share this machine's CPU cores, so stages do "
        "not run at the same time and a pipeline only adds its calls and transfers.",
        "train_1f1b_vs_gpipe_peak_memory: ctl.memory() sampled during each step in sequential "
        "dispatch, the largest rise on one device over what was held before it, the most over "
        "the rounds (lower is better). In parallel dispatch ('ratio_sampled_parallel') the "
        "runtime launches the whole step ahead and a launched call's outputs count at once, "
        "so both schedules hold about as much; the residual peaks read from the trace "
        "('ratio_trace') and the bubbles are in 'memory'.",
    ]
    config = {**cfg, "model": model.__dict__, "stages": 2, "devices_per_stage": PER_STAGE,
              "spmd_batches": list(cfg["spmd_batches"])}
    return Result("train", mode, config, rows, ratios, notes,
                  time.perf_counter() - t0).with_extra(**extra)


def schedule_memory(ctl: pw.Controller, pipe: Pipeline, batch, rounds: int) -> dict:
    """GPipe and 1F1B on the same pipeline, one step at a time, alternating: the activation
    memory sampled during each step (the most over the rounds) in sequential and in parallel
    dispatch, the residual peak read from its trace, and its bubble (the median)."""
    state, placed = pipe.init(0), pipe.place(batch)
    seen: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in range(1 + rounds):  # the first round compiles; it is dropped
        for schedule in ("gpipe", "1f1b") if r % 2 == 0 else ("1f1b", "gpipe"):
            for dispatch in ("sequential", "parallel"):
                k = ctl.trace.next_index
                with MemorySampler(ctl) as mem:
                    state, loss = pipe.step(state, placed, schedule=schedule,
                                            dispatch=dispatch)
                    jax.block_until_ready(fetch((state, loss)))
                ctl.wait()
                if r == 0:
                    continue
                [run] = step_runs(ctl.trace.events(since=k),
                                  program=f"{pipe.name}.{schedule}")
                got = seen.setdefault((schedule, dispatch),
                                      {"sampled": [], "trace": [], "bubble": []})
                got["sampled"].append(mem.peak_above_baseline)
                got["trace"].append(max(peak_residuals(run, pipe.residual_bytes)))
                got["bubble"].append(bubble(run))
    # a peak is the most seen over the rounds (a sample can only miss a peak, never make one
    # up); the trace's is the same every round; the bubble is the median (parallel dispatch)
    out: dict = {}
    for schedule in ("gpipe", "1f1b"):
        seq, par = seen[schedule, "sequential"], seen[schedule, "parallel"]
        out[schedule] = {"sampled": max(seq["sampled"]), "sampled_parallel": max(par["sampled"]),
                         "trace": max(par["trace"]), "bubble": statistics.median(par["bubble"])}
    out["microbatches"] = pipe.microbatches
    out["residual_bytes_per_microbatch"] = list(pipe.residual_bytes)
    for key, field in (("ratio_sampled", "sampled"), ("ratio_sampled_parallel",
                                                      "sampled_parallel"),
                       ("ratio_trace", "trace")):
        out[key] = out["1f1b"][field] / out["gpipe"][field]
    return out

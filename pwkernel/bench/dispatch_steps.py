"""Chains of steps run three ways, and the dispatch benchmark's sweep over real steps (issue 25).

``chains`` builds the three ways of running ``n`` steps, each on the previous step's output,
that both sweeps of the dispatch benchmark share: pwkernel **OpByOp** (``n`` ``pw.function``
calls from Python), pwkernel **Chained** (the ``n`` calls traced into one ``@pw.program``) and
**JAX** OpByOp (``n`` asynchronous calls of the same step under ``jax.jit``, then a wait).

The steps sweep asks whether the controller's host cost stays the same as the work grows. A
step is ``tanh(x @ w) @ w.T`` on a data-parallel slice: ``w`` (``WIDTH`` x ``WIDTH``)
replicated, ``x`` (batch x ``WIDTH``) sharded on its batch axis; a sample is ``CALLS`` chained
calls. The batch is calibrated at run time so that the step under plain ``jax.jit`` (same
shardings, same devices) takes about 1, 3 and 10 ms, on slices of 1, 2 and 4 devices. Each row
has steps per second and process CPU time per step (``time.process_time``: every thread) of
each way, and the JAX step's own time as measured in the sweep.

>>> from pwkernel.bench import dispatch_steps
>>> rows, ratios = dispatch_steps.sweep(ctl, "tiny")         # doctest: +SKIP
>>> sorted(ratios)                                           # doctest: +SKIP
['chained_vs_jax_at_1ms', 'host_cpu_growth', 'opbyop_vs_jax_at_1ms']
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from .harness import interleave, paired_ratio, summarize

WAYS = ("pw_opbyop", "pw_chained", "jax_opbyop")
CALLS = 16  # chained calls per sample
WIDTH = 256  # w is WIDTH x WIDTH; the batch is what the calibration scales
TOLERANCE = 0.15  # the calibration stops within 15% of the target step time
CPU_FLOOR_US = 1.0  # host_cpu_growth: an excess below 1 us per step counts as 1 us
STEPS_CONFIGS = {
    # targets_ms: the JAX step times to calibrate to; passes: calibration re-measurements
    "tiny": {"slices": (1, 2), "targets_ms": (1.0,), "rounds": 1, "passes": 1, "repeats": 1},
    "quick": {"slices": (1, 2, 4), "targets_ms": (1.0, 3.0, 10.0), "rounds": 11, "passes": 3,
              "repeats": 5},
    "full": {"slices": (1, 2, 4), "targets_ms": (1.0, 3.0, 10.0), "rounds": 25, "passes": 4,
             "repeats": 5},
}


def jax_chain(jax_step: Callable, x0, n: int, *args) -> Callable[[], None]:
    """``n`` asynchronous calls of ``jax_step``, each on the previous output, then a wait."""
    def run():
        x = x0
        for _ in range(n):
            x = jax_step(x, *args)
        x.block_until_ready()
    return run


def chains(pw_step: pw.CompiledFunction, jax_step: Callable, x0, n: int,
           *args, program: Callable | None = None) -> dict[str, Callable[[], None]]:
    """OpByOp, Chained and JAX OpByOp: ``n`` steps from ``x0``, each on the previous step's
    output; ``args``, the step's other inputs, are the same at every step. ``program``: the
    ``pw.program`` of the runtime ``pw_step`` belongs to (``bench/ab.py`` runs another
    checkout's; default: this one's)."""
    @(program or pw.program)(name="chain")
    def chain(x, *rest):
        for _ in range(n):
            x = pw_step(x, *rest)
        return x

    def pw_opbyop():
        x = x0
        for _ in range(n):
            x = pw_step(x, *args)
        x.result().block_until_ready()

    def pw_chained():
        chain(x0, *args).result().block_until_ready()

    return {"pw_opbyop": pw_opbyop, "jax_opbyop": jax_chain(jax_step, x0, n, *args),
            "pw_chained": pw_chained}


def matmul_step(x, w):
    """One real step: two matrix products and a ``tanh`` (output shaped like ``x``)."""
    return jnp.tanh(x @ w) @ w.T


class Sampled:
    """Each call runs ``fn`` once and returns steps per second; ``cpu_us`` keeps the process
    CPU time (every thread) per step of each call, in microseconds."""

    def __init__(self, fn: Callable[[], None], steps: int):
        self.fn, self.steps, self.cpu_us = fn, steps, []

    def __call__(self) -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        self.fn()
        t1, c1 = time.perf_counter(), time.process_time()
        self.cpu_us.append((c1 - c0) / self.steps * 1e6)
        return self.steps / (t1 - t0)


class Slice:
    """A slice of ``devices`` devices with the step's shardings, its JAX step, and inputs."""

    def __init__(self, ctl: pw.Controller, devices: int):
        self.devices = devices
        self.slice = ctl.slice(devices, island=0)
        self.x_sharding = NamedSharding(self.slice.mesh, P("x"))
        self.w_sharding = NamedSharding(self.slice.mesh, P())
        self.jax_step = jax.jit(matmul_step, in_shardings=(self.x_sharding, self.w_sharding),
                                out_shardings=self.x_sharding)
        rng = np.random.default_rng(0)
        w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH)
        self.w = jax.device_put(w, self.w_sharding)

    def unit(self) -> int:
        """Batch sizes are multiples of this (8 rows per device)."""
        return 8 * self.devices

    def x0(self, batch: int):
        x = np.random.default_rng(1).uniform(-1, 1, (batch, WIDTH)).astype(np.float32)
        return jax.device_put(x, self.x_sharding)

    def jax_step_s(self, batch: int, repeats: int) -> float:
        """The JAX step's time at ``batch``: the fastest of ``repeats`` chains after a warm one
        (the least a shared machine's other work let it take, so calibration converges)."""
        run = jax_chain(self.jax_step, self.x0(batch), CALLS, self.w)
        run()  # compile and warm
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) / CALLS)
        return min(times)

    def calibrate(self, target_s: float, batch: int, passes: int,
                  repeats: int) -> tuple[int, float]:
        """The batch at which the JAX step takes about ``target_s``, starting from ``batch``
        and re-measuring up to ``passes`` times; returns it with the step's measured time."""
        batch = self.rounded(batch)
        t = self.jax_step_s(batch, repeats)
        for _ in range(passes):
            if abs(t / target_s - 1) <= TOLERANCE:
                break
            batch = self.rounded(batch * target_s / t)
            t = self.jax_step_s(batch, repeats)
        return batch, t

    def rounded(self, batch: float) -> int:
        """``batch`` to the nearest multiple of ``unit()`` (at least one)."""
        return max(self.unit(), round(batch / self.unit()) * self.unit())

    def ways(self, batch: int) -> dict[str, Sampled]:
        """The three ways of running ``CALLS`` steps at ``batch``, each a ``Sampled``."""
        pw_step = pw.function(matmul_step, slice=self.slice, in_specs=(P("x"), P()),
                              out_specs=P("x"), name="matmul_step")
        runs = chains(pw_step, self.jax_step, self.x0(batch), CALLS, self.w)
        return {name: Sampled(runs[name], CALLS) for name in WAYS}


def measure(sl: Slice, target_ms: float, batch: int, calibrated_s: float,
            rounds: int) -> dict:
    """One row: the three ways interleaved at ``batch``, steps/s and CPU per step."""
    ways = sl.ways(batch)
    samples = interleave(ways, rounds=rounds)
    cpu = {name: way.cpu_us[-rounds:] for name, way in ways.items()}  # the warm-up dropped
    jax_rate = summarize(samples["jax_opbyop"])["median"]
    return {
        "devices": sl.devices, "target_ms": target_ms, "batch": batch, "width": WIDTH,
        "calls": CALLS, "calibrated_ms": round(calibrated_s * 1e3, 3),
        "jax_step_ms": round(1e3 / jax_rate, 3),
        "steps_per_s": {name: summarize(samples[name]) for name in WAYS},
        "cpu_us_per_step": {name: summarize(cpu[name]) for name in WAYS},
        "chained_vs_jax": paired_ratio(samples, "pw_chained", "jax_opbyop"),
        "opbyop_vs_jax": paired_ratio(samples, "pw_opbyop", "jax_opbyop"),
        # pwkernel's CPU per step above JAX's: the median over rounds of the paired difference
        "cpu_excess_us": {name: round(statistics.median(
            a - b for a, b in zip(cpu[name], cpu["jax_opbyop"], strict=True)), 2)
            for name in ("pw_chained", "pw_opbyop")},
    }


def sweep(ctl: pw.Controller, mode: str) -> tuple[list[dict], dict[str, float]]:
    """Calibrate and measure every (slice, target) of ``mode``; returns the rows and the
    headline ratios (``chained_vs_jax_at_1ms``, ``opbyop_vs_jax_at_1ms``,
    ``host_cpu_growth``)."""
    cfg = STEPS_CONFIGS[mode]
    slices = [d for d in cfg["slices"] if d <= len(ctl.islands[0].devices)]
    rows: list[dict] = []
    guess = {t: 128 * t for t in cfg["targets_ms"]}  # a batch to start calibrating from
    for devices in slices:
        sl = Slice(ctl, devices)
        for target_ms in cfg["targets_ms"]:
            batch, t = sl.calibrate(target_ms / 1e3, guess[target_ms], cfg["passes"],
                                    cfg["repeats"])
            guess[target_ms] = batch
            rows.append(measure(sl, target_ms, batch, t, cfg["rounds"]))
    return rows, headline(rows, slices)


def headline(rows: list[dict], slices) -> dict[str, float]:
    """The worst over ``slices`` of the ratios at the smallest step; the CPU growth of the
    worse of Chained and OpByOp, each its excess averaged over ``slices``."""
    smallest, largest = min(r["target_ms"] for r in rows), max(r["target_ms"] for r in rows)
    at = {(r["devices"], r["target_ms"]): r for r in rows}

    def excess(target_ms: float, way: str) -> float:
        mean = statistics.mean(at[d, target_ms]["cpu_excess_us"][way] for d in slices)
        return max(mean, CPU_FLOOR_US)

    growth = [excess(largest, v) / excess(smallest, v) for v in ("pw_chained", "pw_opbyop")]
    return {
        "chained_vs_jax_at_1ms": min(at[d, smallest]["chained_vs_jax"] for d in slices),
        "opbyop_vs_jax_at_1ms": min(at[d, smallest]["opbyop_vs_jax"] for d in slices),
        "host_cpu_growth": round(max(growth), 3),
    }


NOTES = [
    "steps (extra): tanh(x @ w) @ w.T, w replicated, x sharded on its batch axis, 16 chained "
    "calls per sample; the batch calibrated so the JAX step takes about target_ms; "
    "jax_step_ms is JAX's step as measured in the sweep, calibrated_ms in the calibration.",
    "chained_vs_jax_at_1ms / opbyop_vs_jax_at_1ms: steps/s over JAX's (16 async jax.jit calls "
    "then a wait), paired median, at the smallest step (1 ms), worst of the slices.",
    "host_cpu_growth: a row's excess (cpu_excess_us) is the median over rounds of "
    "pwkernel's process CPU per step minus JAX's in the same round; for Chained and for "
    "OpByOp, the mean of the slices' excesses at the largest step (floored at 1 us) over the "
    "same at the smallest step; the worse of the two. 1: the host cost per computation does "
    "not grow with the work. At 10 ms steps the process CPU is ~20 ms a step, and its "
    "round-to-round noise is as large as the excess (tiny mode has one step size: 1).",
    "cpu_*_vs_jax_call: cpu_us_per_node_chained / _opbyop over JAX OpByOp's own process CPU "
    "per call (cpu_us_per_node, extra: jax_opbyop), same run, smallest elementwise step.",
]

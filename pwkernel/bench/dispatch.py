"""The paper's dispatch micro-benchmark: OpByOp, Chained and Fused, pwkernel beside bare JAX.

One step is an elementwise computation on an array sharded over a slice of 1, 2 or 4 devices.
A chain is ``n`` steps, each using the previous step's output:

- **OpByOp**: each step its own program (a ``pw.function`` called outside ``@pw.program``);
  JAX OpByOp is a Python loop of calls of the same step ``jax.jit``-ed with the same shardings.
- **Chained**: the ``n`` calls traced into one ``@pw.program`` (one submission).
- **Fused**: one ``pw.function`` whose body loops ``n`` times (``jax.lax.fori_loop``);
  JAX Fused is the same loop in one ``jax.jit``.

The figure of merit is steps per second. A computation's size is reported both as elements and
as its own run time (from JAX Fused, where dispatch costs nothing), like the paper's "the
smallest computation at which Pathways matches JAX".

>>> from pwkernel.bench import dispatch
>>> result = dispatch.run("tiny")          # doctest: +SKIP
>>> sorted(result.ratios)                  # doctest: +SKIP
['breakeven_us', 'chained_vs_jax_at_1ms', 'chained_vs_jax_opbyop', 'cpu_chained_vs_jax_call',
 'cpu_opbyop_vs_jax_call', 'cpu_us_per_node_chained', 'cpu_us_per_node_opbyop',
 'fused_vs_jax_fused', 'host_cpu_growth', 'opbyop_vs_jax', 'opbyop_vs_jax_at_1ms']

Beside the ratios, the cost of the controller itself: ``cpu_us_per_node_opbyop`` and
``cpu_us_per_node_chained`` are the process CPU time (every thread) per computation at the
smallest size on a 1-device slice, and ``breakeven_us`` is the smallest computation, in
microseconds of its own run time, at which Chained reaches 95% of JAX OpByOp and Fused 95% of
JAX Fused (whichever is larger; worst of the multi-device slices). ``cpu_chained_vs_jax_call``
and ``cpu_opbyop_vs_jax_call`` are those CPU figures over bare JAX OpByOp's own, same run.

Then the steps sweep (``dispatch_steps``, in ``extra["steps"]``): a real step calibrated to
take about 1, 3 and 10 ms under JAX, run OpByOp, Chained and as JAX OpByOp, with steps per
second and process CPU per step: ``chained_vs_jax_at_1ms``, ``opbyop_vs_jax_at_1ms`` and
``host_cpu_growth`` (whether the controller's CPU per computation grows with the work).
"""

from __future__ import annotations

import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from . import dispatch_steps
from .dispatch_steps import chains, jax_chain
from .harness import Result, check_mode, interleave, islands, paired_ratio, rate, summarize

VARIANTS = ("pw_opbyop", "jax_opbyop", "pw_chained", "pw_fused", "jax_fused")
CONFIGS = {
    # sizes: total elements of the array (split over the slice); chain: steps per chain
    "tiny": {"slices": (1, 2), "sizes": (256, 4096), "chain": 8, "rounds": 1, "fused_reps": 2,
             "cpu_repeats": 2},
    "quick": {"slices": (1, 2, 4), "sizes": (256, 4096, 65536, 2 ** 20, 2 ** 22), "chain": 64,
              "rounds": 3, "fused_reps": 4, "cpu_repeats": 20},
    "full": {"slices": (1, 2, 4), "sizes": tuple(4 ** k for k in range(4, 12)), "chain": 200,
             "rounds": 7, "fused_reps": 8, "cpu_repeats": 20},
}
MATCH = 0.95  # "pwkernel matches JAX" at 95% of its throughput


def step(x):
    """One computation: a few elementwise operations (memory- and compute-light)."""
    return jnp.tanh(x) * 0.5 + x * 0.5


def chain_length(base: int, size: int) -> int:
    # Large computations get shorter chains so that every size costs about the same time.
    return max(min(base, 8), min(base, int(base * 4096 / size)))


def _fused(n: int):
    def body(x):
        return jax.lax.fori_loop(0, n, lambda i, v: step(v), x)
    return body


def variants(ctl: pw.Controller, devices: int, size: int, n: int, reps: int) -> dict:
    """The five ways to run ``n`` steps, each returning steps per second."""
    vs = ctl.slice(devices, island=0)
    spec = P("x")
    sharding = NamedSharding(vs.mesh, spec)
    x0 = jax.device_put(np.linspace(-1, 1, size, dtype=np.float32), sharding)

    pw_step = pw.function(step, slice=vs, in_specs=spec, out_specs=spec, name="step")
    jax_step = jax.jit(step, in_shardings=sharding, out_shardings=sharding)
    pw_loop = pw.function(_fused(n), slice=vs, in_specs=spec, out_specs=spec, name="fused")
    jax_loop = jax.jit(_fused(n), in_shardings=sharding, out_shardings=sharding)

    ways = chains(pw_step, jax_step, x0, n)

    def pw_fused():
        x = x0
        for _ in range(reps):
            x = pw_loop(x)
        x.result().block_until_ready()

    jax_fused = jax_chain(jax_loop, x0, reps)

    return {
        "pw_opbyop": lambda: rate(ways["pw_opbyop"], n),
        "jax_opbyop": lambda: rate(ways["jax_opbyop"], n),
        "pw_chained": lambda: rate(ways["pw_chained"], n),
        "pw_fused": lambda: rate(pw_fused, n * reps),
        "jax_fused": lambda: rate(jax_fused, n * reps),
    }


def cpu_per_node(ctl: pw.Controller, size: int, n: int, repeats: int, rounds: int) -> dict:
    """Process CPU time (all threads) per computation, in microseconds, on a 1-device slice:
    OpByOp and Chained, with JAX OpByOp beside them (medians over ``rounds``)."""
    ways = variants(ctl, 1, size, n, 1)
    run = {"pw_opbyop": ways["pw_opbyop"], "pw_chained": ways["pw_chained"],
           "jax_opbyop": ways["jax_opbyop"]}
    for fn in run.values():  # warm: compile, first plans
        fn()
    samples: dict[str, list[float]] = {k: [] for k in run}
    for _ in range(rounds):
        for name, fn in run.items():
            c0 = time.process_time()
            for _ in range(repeats):
                fn()
            samples[name].append((time.process_time() - c0) / (repeats * n) * 1e6)
    return {k: round(statistics.median(v), 2) for k, v in samples.items()}


def breakeven(rows: list[dict], slices) -> tuple[float | None, dict]:
    """The smallest computation (us of its own run time) at which Chained reaches 95% of JAX
    OpByOp and Fused 95% of JAX Fused (and stay there at every larger size of the sweep),
    whichever is larger, worst of ``slices``; None when a slice never gets there (its entry
    then says ``reached: False`` with its largest computation: the break-even is beyond)."""
    how: dict[str, dict] = {}
    worst = None
    for devices in slices:
        mine = [r for r in rows if r["devices"] == devices]
        if not mine:
            continue
        largest = max(r["computation_us"] for r in mine)
        found = [_smallest_match(rows, devices, k)
                 for k in ("chained_vs_jax_opbyop", "fused_vs_jax_fused")]
        reached = all(f is not None for f in found)
        value = max(f["computation_us"] for f in found) if reached else largest
        how[str(devices)] = {"us": value, "reached": reached}
        worst = value if worst is None else max(worst, value)
    if not all(h["reached"] for h in how.values()):
        return None, how
    return worst, how


def _smallest_match(rows: list[dict], devices: int, key: str) -> dict | None:
    """The smallest computation on ``devices`` where ``key`` reaches 95% (and stays there)."""
    mine = sorted((r for r in rows if r["devices"] == devices), key=lambda r: r["size"])
    for i, row in enumerate(mine):
        if all(r[key] >= MATCH for r in mine[i:]):
            return {"size": row["size"], "computation_us": row["computation_us"]}
    return None


def run(mode: str = "quick") -> Result:
    """Run the sweep; ``mode`` is ``"tiny"``, ``"quick"`` or ``"full"``."""
    cfg = dict(CONFIGS[check_mode(mode)])
    t0 = time.perf_counter()
    rows: list[dict] = []
    ctl = pw.Controller(islands=islands())
    cfg["slices"] = tuple(d for d in cfg["slices"] if d <= len(ctl.islands[0].devices))
    try:
        for devices in cfg["slices"]:
            for size in cfg["sizes"]:
                size = math.lcm(size, devices)
                n = chain_length(cfg["chain"], size)
                reps = max(1, min(cfg["fused_reps"], cfg["fused_reps"] * 4096 // size))
                samples = interleave(variants(ctl, devices, size, n, reps),
                                     rounds=cfg["rounds"])
                jax_fused = summarize(samples["jax_fused"])["median"]
                rows.append({
                    "devices": devices, "size": size, "chain": n, "fused_calls": reps,
                    "computation_us": round(1e6 / jax_fused, 3),
                    "steps_per_s": {v: summarize(samples[v]) for v in VARIANTS},
                    "opbyop_vs_jax": paired_ratio(samples, "pw_opbyop", "jax_opbyop"),
                    "chained_vs_jax_opbyop": paired_ratio(samples, "pw_chained", "jax_opbyop"),
                    "fused_vs_jax_fused": paired_ratio(samples, "pw_fused", "jax_fused"),
                })
        smallest = min(cfg["sizes"])
        cpu = cpu_per_node(ctl, smallest, cfg["chain"], cfg["cpu_repeats"], cfg["rounds"])
        steps_rows, steps_ratios = dispatch_steps.sweep(ctl, mode)
    finally:
        ctl.close()
    ratios, by_devices = _headline(rows, cfg)
    multi = [d for d in cfg["slices"] if d > 1] or list(cfg["slices"])
    ratios["breakeven_us"], how = breakeven(rows, multi)
    ratios["cpu_us_per_node_opbyop"] = cpu["pw_opbyop"]
    ratios["cpu_us_per_node_chained"] = cpu["pw_chained"]
    ratios.update(steps_ratios)
    ratios["cpu_chained_vs_jax_call"] = round(cpu["pw_chained"] / cpu["jax_opbyop"], 3)
    ratios["cpu_opbyop_vs_jax_call"] = round(cpu["pw_opbyop"] / cpu["jax_opbyop"], 3)
    match = {str(d): {"opbyop": _smallest_match(rows, d, "opbyop_vs_jax"),
                      "chained": _smallest_match(rows, d, "chained_vs_jax_opbyop")}
             for d in cfg["slices"]}
    notes = [
        "steps_per_s: computation steps per second (median, min, max over rounds).",
        "ratios: median over rounds of the paired ratio; the headline is the smallest "
        "computation, worst of the 2- and 4-device slices (1-device beside it in by_devices).",
        "computation_us: one step's own run time, from JAX Fused.",
        "cpu_us_per_node_*: process CPU time (all threads) per computation, smallest size, "
        "1-device slice; cpu_us_per_node (extra) has JAX OpByOp's beside them.",
        "breakeven_us: where Chained and Fused reach 95% of JAX and stay there, worst "
        "multi-device slice; None when the sweep never got there (breakeven, extra, has "
        "each slice's, with the largest computation measured when not reached).",
        *dispatch_steps.NOTES,
    ]
    measured = sorted({r["devices"] for r in steps_rows})  # (the slices the islands allow)
    steps = {"config": {**dispatch_steps.STEPS_CONFIGS[mode], "slices": measured},
             "rows": steps_rows}
    return Result("dispatch", mode, cfg, rows, ratios, notes,
                  time.perf_counter() - t0).with_extra(by_devices=by_devices,
                                                       smallest_match=match,
                                                       cpu_us_per_node=cpu, breakeven=how,
                                                       steps=steps)


def _headline(rows: list[dict], cfg: dict) -> tuple[dict, dict]:
    """Ratios at each slice's smallest computation; the headline is the worst multi-device."""
    keys = ("opbyop_vs_jax", "chained_vs_jax_opbyop", "fused_vs_jax_fused")
    by_devices: dict[str, dict[str, float]] = {k: {} for k in keys}
    for devices in cfg["slices"]:
        mine = [r for r in rows if r["devices"] == devices]
        first = min(mine, key=lambda r: r["size"])
        for k in keys:
            by_devices[k][str(devices)] = first[k]
    multi = [str(d) for d in cfg["slices"] if d > 1] or [str(d) for d in cfg["slices"]]
    ratios = {k: min((by_devices[k][d] for d in multi), default=None) for k in keys}
    return ratios, by_devices

"""Data-parallel training across two islands (gradients over the emulated DCN) vs one island.

The model is a small two-layer MLP regression trained with SGD.

- **One island**: one ``pw.function`` train step on a 4-device slice, batch sharded; XLA
  all-reduces the gradients inside the island.
- **Two islands**: a 2-device slice on each island holds a replica of the parameters and half of
  the batch. Each step, each island computes its gradients; each island's update function takes
  its own gradients and the other island's, so the runtime inserts one DCN transfer per
  direction per step, held to ``pw.Link(bandwidth, latency)``'s time.

Several steps are traced into one ``@pw.program`` on both sides. One controller per bandwidth
(the link is a constructor argument); the two sides run interleaved on it.

>>> from pwkernel.bench import dcn
>>> dcn.run("tiny").ratios                      # doctest: +SKIP
{'two_islands_vs_one': 0.9}
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from .harness import Result, check_mode, interleave, paired_ratio, rate, summarize

CONFIGS = {
    "tiny": {"width": 64, "batch": 64, "steps": 2, "rounds": 1, "bandwidths": (1e9,),
             "latency": 20e-6},
    "quick": {"width": 256, "batch": 512, "steps": 4, "rounds": 5,
              "bandwidths": (1e8, 1e9, 1e10), "latency": 20e-6},
    "full": {"width": 512, "batch": 2048, "steps": 8, "rounds": 7,
             "bandwidths": (1e8, 1e9, 1e10, 1e11), "latency": 20e-6},
}
LR = 0.01


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def one_island_step(params, x, y):
    g = jax.grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, d: p - LR * d, params, g)


def local_grads(params, x, y):
    return jax.grad(loss)(params, x, y)


def apply_grads(params, mine, theirs):
    # Each island holds half the batch: the mean of the two islands' gradients is the
    # gradient of the full batch, the same update the one-island step makes.
    return jax.tree_util.tree_map(lambda p, a, b: p - LR * 0.5 * (a + b), params, mine, theirs)


def make_data(cfg: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = cfg["width"]
    params = {"w1": (rng.standard_normal((w, w)) / np.sqrt(w)).astype(np.float32),
              "w2": (rng.standard_normal((w, 1)) / np.sqrt(w)).astype(np.float32)}
    x = rng.standard_normal((cfg["batch"], w)).astype(np.float32)
    y = np.sin(x[:, :1]).astype(np.float32)
    return params, x, y


def variants(ctl: pw.Controller, cfg: dict) -> dict:
    params, x, y = make_data(cfg)
    steps, samples = cfg["steps"], cfg["batch"] * cfg["steps"]
    data_parallel = (P(), P("x"), P("x"))  # parameters replicated, batch sharded

    one = ctl.slice(4, island=0)
    step1 = pw.function(one_island_step, slice=one, in_specs=data_parallel, out_specs=P(),
                        name="train")
    put1 = lambda a, s: jax.device_put(a, NamedSharding(one.mesh, s))  # noqa: E731
    p1, x1, y1 = put1(params, P()), put1(x, P("x")), put1(y, P("x"))

    @pw.program(name="one_island")
    def train_one(p, xs, ys):
        for _ in range(steps):
            p = step1(p, xs, ys)
        return p

    halves = [ctl.slice(2, island=i) for i in (0, 1)]
    grads = [pw.function(local_grads, slice=s, in_specs=data_parallel, out_specs=P(),
                         name=f"grads{i}") for i, s in enumerate(halves)]
    applies = [pw.function(apply_grads, slice=s, in_specs=P(), out_specs=P(),
                           name=f"apply{i}") for i, s in enumerate(halves)]
    parts = [(jax.device_put(params, NamedSharding(s.mesh, P())),
              jax.device_put(xh, NamedSharding(s.mesh, P("x"))),
              jax.device_put(yh, NamedSharding(s.mesh, P("x"))))
             for s, xh, yh in zip(halves, np.split(x, 2), np.split(y, 2), strict=True)]

    @pw.program(name="two_islands")
    def train_two(a, b):
        (pa, xa, ya), (pb, xb, yb) = a, b
        for _ in range(steps):
            ga, gb = grads[0](pa, xa, ya), grads[1](pb, xb, yb)
            pa, pb = applies[0](pa, ga, gb), applies[1](pb, gb, ga)  # gb, ga cross the DCN
        return pa, pb

    def run_one():
        jax.block_until_ready(jax.tree_util.tree_map(lambda f: f.result(),
                                                     train_one(p1, x1, y1)))

    def run_two():
        jax.block_until_ready(jax.tree_util.tree_map(lambda f: f.result(),
                                                     train_two(parts[0], parts[1])))

    return {"one_island": lambda: rate(run_one, samples),
            "two_islands": lambda: rate(run_two, samples)}


def run(mode: str = "quick") -> Result:
    """Samples per second, two islands over each emulated DCN bandwidth vs one island."""
    cfg = CONFIGS[check_mode(mode)]
    t0 = time.perf_counter()
    rows = []
    for bandwidth in cfg["bandwidths"]:
        ctl = pw.Controller(islands=(4, 4), dcn=pw.Link(bandwidth=bandwidth,
                                                        latency=cfg["latency"]))
        try:
            samples = interleave(variants(ctl, cfg), rounds=cfg["rounds"])
            dcn_events = [e for e in ctl.trace.events() if e.link == "dcn"]
        finally:
            ctl.close()
        rows.append({"bandwidth_Bps": bandwidth, "latency_s": cfg["latency"],
                     "samples_per_s": {k: summarize(v) for k, v in samples.items()},
                     "dcn_transfers": len(dcn_events),
                     "dcn_bytes": sum(e.nbytes for e in dcn_events),
                     "two_islands_vs_one": paired_ratio(samples, "two_islands", "one_island")})
    notes = ["samples_per_s: training examples per second (median, min, max).",
             "headline: the highest emulated bandwidth (the paper's islands are joined by a "
             "fast data-center network); every bandwidth is in the rows."]
    best = max(rows, key=lambda r: r["bandwidth_Bps"])
    config = {**cfg, "bandwidths": list(cfg["bandwidths"])}
    return Result("dcn", mode, config, rows, {"two_islands_vs_one": best["two_islands_vs_one"]},
                  notes, time.perf_counter() - t0)

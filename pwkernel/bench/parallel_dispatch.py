"""Parallel vs sequential dispatch: a chain of small stages alternating between two islands.

Stage ``i`` is a ``pw.function`` on a 2-device slice of island ``i % 2``, so every edge of the
chain is a transfer between islands. The chain is traced into one ``@pw.program`` and run with
``ctl.dispatch = "parallel"`` (host-side work for every node done at submission) and
``"sequential"`` (a node is prepared only once its inputs exist), rounds interleaved.

The same chain runs on the Ray backend too (each island an actor process, so every node is a
remote call and every edge an actor-to-actor copy): there dispatch costs far more, which is the
regime the paper measured. The Ray row is skipped in ``tiny`` mode (its cluster takes ~20 s).

>>> from pwkernel.bench import parallel_dispatch
>>> parallel_dispatch.run("tiny").ratios        # doctest: +SKIP
{'parallel_vs_sequential': 1.4}
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
    "tiny": {"stages": 4, "sizes": (256,), "rounds": 1, "programs": 1, "ray_rounds": 0},
    "quick": {"stages": 16, "sizes": (256, 65536), "rounds": 9, "programs": 1, "ray_rounds": 5},
    "full": {"stages": 32, "sizes": (256, 16384, 262144), "rounds": 9, "programs": 1,
             "ray_rounds": 9},
}


def stage(x):
    return jnp.sin(x) + 0.5 * x


def variants(ctl: pw.Controller, stages: int, size: int, programs: int,
             host_input: bool = False) -> dict:
    slices = [ctl.slice(2, island=0), ctl.slice(2, island=1)]
    fns = [pw.function(stage, slice=slices[i % 2], in_specs=P("x"), out_specs=P("x"),
                       name=f"stage{i}") for i in range(stages)]

    @pw.program(name="alternating")
    def chain(x):
        for fn in fns:
            x = fn(x)
        return x

    x0 = np.ones(size, np.float32)
    if not host_input:  # already on the first slice: only the chain is measured
        x0 = jax.device_put(x0, NamedSharding(slices[0].mesh, P("x")))

    def go(mode: str):
        def once():
            ctl.dispatch = mode
            outs = [chain(x0) for _ in range(programs)]  # one program: the paper's setting
            for out in outs:
                out.result().block_until_ready()
        return lambda: rate(once, stages * programs)

    return {"parallel": go("parallel"), "sequential": go("sequential")}


def _ray_row(cfg: dict) -> dict:
    """The chain on the Ray backend (a local cluster), at the smallest stage size."""
    if not cfg["ray_rounds"]:
        return {"backend": "ray", "status": "skipped", "why": "not run in tiny mode"}
    size = min(cfg["sizes"])
    try:
        ctl = pw.Controller(backend="ray", islands=(4, 4))
    except Exception as e:  # noqa: BLE001 - no cluster here: say why, measure the rest
        return {"backend": "ray", "status": "not available", "why": str(e)}
    try:
        samples = interleave(variants(ctl, cfg["stages"], size, cfg["programs"],
                                      host_input=True), rounds=cfg["ray_rounds"])
    finally:
        ctl.close()
    return {"backend": "ray", "size": size, "stages": cfg["stages"],
            "stages_per_s": {k: summarize(v) for k, v in samples.items()},
            "parallel_vs_sequential": paired_ratio(samples, "parallel", "sequential")}


def run(mode: str = "quick") -> Result:
    """Stages per second under both dispatch modes, for each stage size."""
    cfg = CONFIGS[check_mode(mode)]
    t0 = time.perf_counter()
    rows: list[dict] = []
    ctl = pw.Controller(islands=(4, 4))
    try:
        for size in cfg["sizes"]:
            samples = interleave(variants(ctl, cfg["stages"], size, cfg["programs"]),
                                 rounds=cfg["rounds"])
            rows.append({"backend": "local", "size": size, "stages": cfg["stages"],
                         "stages_per_s": {k: summarize(v) for k, v in samples.items()},
                         "parallel_vs_sequential": paired_ratio(samples, "parallel",
                                                                "sequential")})
    finally:
        ctl.close()
    ray_row = _ray_row(cfg)
    rows.append(ray_row)
    smallest = min((r for r in rows if r["backend"] == "local"), key=lambda r: r["size"])
    ratios = {"parallel_vs_sequential": smallest["parallel_vs_sequential"]}
    if "parallel_vs_sequential" in ray_row:
        ratios["parallel_vs_sequential_ray"] = ray_row["parallel_vs_sequential"]
    notes = ["stages_per_s: pipeline stages completed per second (median, min, max).",
             "headline: the smallest stage size (where dispatch matters most)."]
    return Result("parallel-dispatch", mode, dict(cfg), rows, ratios, notes,
                  time.perf_counter() - t0)

"""Parallel vs sequential dispatch: a chain of small stages alternating between two islands.

Stage ``i`` is a ``pw.function`` on a 2-device slice of island ``i % 2``, so every edge of the
chain is a transfer between islands. The chain is traced into one ``@pw.program`` and run with
``ctl.dispatch = "parallel"`` (host-side work for every node done at submission) and
``"sequential"`` (a node is prepared only once its inputs exist), rounds interleaved.

Only the local backend exists today; the Ray backend's row says "not available" until
``pwkernel.backends.ray`` provides a controller this benchmark can drive (see ``_ray_row``).

>>> from pwkernel.bench import parallel_dispatch
>>> parallel_dispatch.run("tiny").ratios        # doctest: +SKIP
{'parallel_vs_sequential': 1.4}
"""

from __future__ import annotations

import importlib.util
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from .harness import Result, check_mode, interleave, paired_ratio, rate, summarize

CONFIGS = {
    "tiny": {"stages": 4, "sizes": (256,), "rounds": 1, "programs": 1},
    "quick": {"stages": 16, "sizes": (256, 65536), "rounds": 9, "programs": 1},
    "full": {"stages": 32, "sizes": (256, 16384, 262144), "rounds": 9, "programs": 1},
}


def stage(x):
    return jnp.sin(x) + 0.5 * x


def variants(ctl: pw.Controller, stages: int, size: int, programs: int) -> dict:
    slices = [ctl.slice(2, island=0), ctl.slice(2, island=1)]
    fns = [pw.function(stage, slice=slices[i % 2], in_specs=P("x"), out_specs=P("x"),
                       name=f"stage{i}") for i in range(stages)]

    @pw.program(name="alternating")
    def chain(x):
        for fn in fns:
            x = fn(x)
        return x

    x0 = jax.device_put(np.ones(size, np.float32), NamedSharding(slices[0].mesh, P("x")))

    def go(mode: str):
        def once():
            ctl.dispatch = mode
            outs = [chain(x0) for _ in range(programs)]  # one program: the paper's setting
            for out in outs:
                out.result().block_until_ready()
        return lambda: rate(once, stages * programs)

    return {"parallel": go("parallel"), "sequential": go("sequential")}


def _ray_row() -> dict:
    """The hook for the Ray backend: measured once it exists, reported as absent until then."""
    if importlib.util.find_spec("pwkernel.backends.ray") is None:
        return {"backend": "ray", "status": "not available",
                "why": "pwkernel.backends.ray does not exist yet"}
    return {"backend": "ray", "status": "not available",
            "why": "pwkernel.backends.ray exists; extend parallel_dispatch._ray_row to drive it"}


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
    rows.append(_ray_row())
    smallest = min((r for r in rows if r["backend"] == "local"), key=lambda r: r["size"])
    notes = ["stages_per_s: pipeline stages completed per second (median, min, max).",
             "headline: the smallest stage size (where dispatch matters most)."]
    return Result("parallel-dispatch", mode, dict(cfg), rows,
                  {"parallel_vs_sequential": smallest["parallel_vs_sequential"]}, notes,
                  time.perf_counter() - t0)

"""A call given N host leaves (NumPy arrays): repeat-call wall time of ``pw.function`` against
``jax.jit`` on one device, medians, rounds alternated in one process.

    .venv/bin/python bench/host_leaves.py [N ...]      # default: 1 10 100 1000

Each call uploads its host leaves (``jax.jit`` copies them in one batched call; pwkernel's
local backend in one ``host`` transfer of the call, ``Graph.upload``) and waits for the result.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # noqa: E402

import pwkernel as pw  # noqa: E402


def body(xs):
    return sum(x.sum() for x in xs)


def main(sizes: list[int]) -> None:
    ctl = pw.Controller(islands=(4,))
    f, j = pw.function(body, slice=ctl.slice(1)), jax.jit(body)
    for n in sizes:
        xs = [np.full((4,), i, np.float32) for i in range(n)]
        ways = {"pw": lambda xs=xs: f(xs).result(),
                "jit": lambda xs=xs: j(xs).block_until_ready()}
        for fn in ways.values():
            fn()
            fn()
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(30 if n <= 100 else 8):
            for name, fn in ways.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        pw_ms, jit_ms = (statistics.median(times[k]) * 1e3 for k in ("pw", "jit"))
        print(f"leaves {n:5d}  pw.function {pw_ms:8.3f} ms  jax.jit {jit_ms:8.3f} ms  "
              f"ratio {pw_ms / jit_ms:6.1f}", flush=True)
    ctl.close()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 10, 100, 1000])

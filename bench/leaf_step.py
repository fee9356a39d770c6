"""Host time of a step over a state of many small leaves, through pw.function and through
``jax.jit``, in the same run: what the runtime costs per leaf, in time rather than counted.

    .venv/bin/python bench/leaf_step.py                 # 83 leaves (bench train's state)
    .venv/bin/python bench/leaf_step.py --leaves 8 --rounds 7
    PYTHONPATH=<another checkout> .venv/bin/python bench/leaf_step.py   # that checkout's

The step is ``x * 0.9 + 0.1`` on every leaf (16 floats, replicated on island 0's 4 devices),
the state donated from step to step, ``--steps`` steps per round dispatched asynchronously and
waited for at the end, as a training loop does. The device work is next to nothing, so the
time per step is host time: pwkernel's runtime plus JAX's own dispatch, against JAX's alone.
Rounds alternate between the two; the medians and their ratio are printed as JSON (wall and
process CPU, microseconds per step).

It exists because ``bench/count_bytecodes.py train`` can mislead here: work moved from Python
loops into chains of C iterators lowers the count but not the time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import pwkernel as pw  # noqa: E402


def _step(state):
    return jax.tree_util.tree_map(lambda x: x * 0.9 + 0.1, state)


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--leaves", type=int, default=83)
    ap.add_argument("--steps", type=int, default=200, help="steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    for name in ("leaves", "steps", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    n, leaves = args.steps, args.leaves
    with pw.Controller(islands=(4, 4)) as ctl:
        s = ctl.slice(4, island=0)
        step = pw.function(_step, slice=s, donate_argnums=0, name="step")
        copy = pw.function(lambda x: x * 1, slice=s)
        pw_state = [copy(np.full(16, i, np.float32)) for i in range(leaves)]
        sharding = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("d",)), PartitionSpec())
        jit_step = jax.jit(_step, donate_argnums=0)
        jax_state = [jax.device_put(np.full(16, i, np.float32), sharding) for i in range(leaves)]

        def run_pw():
            nonlocal pw_state
            for _ in range(n):
                pw_state = step(pw_state)
            jax.block_until_ready([f.result() for f in pw_state])

        def run_jax():
            nonlocal jax_state
            for _ in range(n):
                jax_state = jit_step(jax_state)
            jax.block_until_ready(jax_state)

        runs = {"pw": run_pw, "jax": run_jax}
        for run in runs.values():  # compiled, warm
            run()
        seen: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                w0, c0 = time.perf_counter(), time.process_time()
                run()
                seen[name].append(((time.perf_counter() - w0) / n * 1e6,
                                   (time.process_time() - c0) / n * 1e6))
    out = {"leaves": leaves, "steps": n, "rounds": args.rounds, "pwkernel": pw.__file__}
    for name, rows in seen.items():
        out[f"{name}_wall_us"] = round(statistics.median(w for w, _ in rows), 1)
        out[f"{name}_cpu_us"] = round(statistics.median(c for _, c in rows), 1)
    out["pw_vs_jax_wall"] = round(out["pw_wall_us"] / out["jax_wall_us"], 2)
    out["pw_extra_wall_us_per_leaf"] = round(
        (out["pw_wall_us"] - out["jax_wall_us"]) / leaves, 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))

"""Where a computation's CPU time goes: the profile table of docs/architecture.md.

    .venv/bin/python bench/profile_dispatch.py chained   # or opbyop

64-step chains of a 256-element step on a 1-device slice. Prints JSON: process CPU time (every
thread) per computation, split into JAX's compiled call (bare JAX's cost, measured beside it)
and the runtime's Python by part (yappi, CPU clock, every thread, shares of what it saw). Run
it with PYTHONPATH=<another checkout> to profile that one (yappi is a dev dependency).
"""

from __future__ import annotations

import json
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import yappi  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.bench.dispatch import variants  # noqa: E402

N, REPS = 64, 40  # steps per chain, chains per sample
#: (part, predicate on a profiled function's module path and name), first match wins
PARTS = [
    ("gang scheduler", lambda m, f: m.endswith("scheduler.py")),
    ("launch order, executor, seeing ends",
     lambda m, f: m.endswith(("islands.py", "executor.py")) or (m.endswith("dispatch.py") and any(
         k in f for k in ("IslandExecutor", "_Watcher", "_launch", "_finish", "_watch", "post",
                          "_soon", "_spawn")))),
    ("task life: readiness, end, failure",
     lambda m, f: m.endswith("tasks.py") or (m.endswith("dispatch.py") and any(
         k in f for k in ("Task", "complete", "fail", "_go", "_watch_inputs", "arrived",
                          "ProgramRun", "record")))),
    ("submission: program call, plan, run",
     lambda m, f: m.endswith(("program.py", "controller.py", "dispatcher.py", "plan.py",
                              "dispatch.py"))),
    ("futures and object store", lambda m, f: m.endswith("objects.py")),
    ("trace", lambda m, f: m.endswith("trace.py")),
    ("threads and locks", lambda m, f: m.endswith("threading.py")),
]


def cpu_per_node(fn) -> float:
    """Median over five batches of process CPU us per computation."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(5):
        c0 = time.process_time()
        for _ in range(REPS):
            fn()
        samples.append((time.process_time() - c0) / (REPS * N) * 1e6)
    return sorted(samples)[2]


def main(kind: str) -> dict:
    ctl = pw.Controller(islands=(4, 4))
    ways = variants(ctl, 1, 256, N, 1)  # the dispatch benchmark's own, one call per sample
    bare, opbyop, chained = ways["jax_opbyop"], ways["pw_opbyop"], ways["pw_chained"]
    fn = {"opbyop": opbyop, "chained": chained}[kind]
    jax_us, total = cpu_per_node(bare), cpu_per_node(fn)
    yappi.set_clock_type("cpu")
    yappi.start()
    for _ in range(REPS):
        fn()
    yappi.stop()
    seen = dict.fromkeys([p for p, _ in PARTS] + ["other Python"], 0.0)
    for s in yappi.get_func_stats():
        if "jax/_src/stages" in s.module and "__call__" in s.name:
            continue  # the compiled call: JAX's cost, measured above
        part = next((p for p, match in PARTS if match(s.module, s.name)), "other Python")
        seen[part] += s.tsub
    python = sum(seen.values()) or 1.0
    ctl.close()
    out = {"JAX's compiled call": round(jax_us, 1)}
    out |= {p: round(v / python * (total - jax_us), 1) for p, v in seen.items()}
    return {kind: out | {"total": round(total, 1)}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "chained")))

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

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import yappi  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import pwkernel as pw  # noqa: E402

N, REPS = 64, 40
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
    vs = ctl.slice(1, island=0)
    sh = NamedSharding(vs.mesh, P("x"))
    x0 = jax.device_put(np.linspace(-1, 1, 256, dtype=np.float32), sh)

    def step(x):
        return jnp.tanh(x) * 0.5 + x * 0.5

    f = pw.function(step, slice=vs, in_specs=P("x"), out_specs=P("x"), name="step")
    jf = jax.jit(step, in_shardings=sh, out_shardings=sh)

    @pw.program(name="chain")
    def chain(x):
        for _ in range(N):
            x = f(x)
        return x

    def bare():
        x = x0
        for _ in range(N):
            x = jf(x)
        x.block_until_ready()

    def opbyop():
        x = x0
        for _ in range(N):
            x = f(x)
        x.result().block_until_ready()

    def chained():
        chain(x0).result().block_until_ready()

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

"""Where a computation's CPU time goes: the profile table of docs/architecture.md.

    .venv/bin/python bench/profile_dispatch.py chained   # or opbyop
    .venv/bin/python bench/profile_dispatch.py chained --large [--batch 1408]

Small steps (the default): 64-step chains of a 256-element step on a 1-device slice. Large
step (``--large``): the dispatch benchmark's real step (``pwkernel/bench/dispatch_steps.py``),
``tanh(x @ w) @ w.T`` on a 4-device data-parallel slice, 16 chained calls, its batch calibrated
so that bare JAX takes about 3 ms a step (or given with ``--batch``, to compare checkouts at one
size). Prints JSON: process CPU time (every thread) per computation, split into JAX's compiled
call (bare JAX's cost, measured beside it in the same run: for the large step, in paired rounds,
the rest being the median over rounds of pwkernel's CPU per step minus JAX's) and the runtime's
Python by part (yappi, CPU clock, every thread, shares of what it saw). Run it with
PYTHONPATH=<another checkout> to profile that one (yappi is a dev dependency); parts match
modules by file name, so older checkouts with fewer modules are split the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)

import yappi  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.bench import dispatch_steps  # noqa: E402
from pwkernel.bench.dispatch import variants  # noqa: E402

N, REPS = 64, 40  # small steps: steps per chain, chains per sample
LARGE_DEVICES, LARGE_MS, LARGE_ROUNDS = 4, 3.0, 21  # the large step: slice, JAX step, rounds
#: (part, the modules it holds as "package/file.py" path ends); first match wins
PARTS = [
    ("gang scheduler", ("runtime/scheduler.py", "runtime/events.py", "runtime/clients.py")),
    ("launch order, executor, seeing ends",
     ("runtime/islands.py", "runtime/executor.py", "runtime/ends.py", "runtime/transfer.py",
      "runtime/callbacks.py", "local/executor.py", "local/devices.py", "local/__init__.py")),
    ("task life: readiness, end, failure",
     ("runtime/tasks.py", "runtime/slots.py", "runtime/owner.py", "runtime/deferred.py",
      "runtime/read_order.py", "runtime/effects_order.py")),
    ("submission: program call, plan, run",
     ("runtime/program.py", "runtime/controller.py", "runtime/dispatcher.py", "runtime/plan.py",
      "runtime/specialization.py", "runtime/arguments.py", "runtime/specs.py",
      "runtime/graph.py", "runtime/executable.py", "runtime/resources.py",
      "runtime/compiled.py", "runtime/jax_caches.py", "runtime/interrupts.py",
      "runtime/stages.py", "runtime/exits.py", "runtime/placements.py", "runtime/registry.py",
      "runtime/sizes.py", "runtime/guards.py", "runtime/intake.py")),
    ("futures and object store", ("runtime/objects.py", "runtime/hooks.py", "runtime/store.py",
                                  "runtime/lending.py",
                                  "runtime/budget.py", "runtime/dtypes.py", "runtime/arraylike.py",
                                  "runtime/done_callbacks.py", "runtime/awaiting.py")),
    ("trace", ("runtime/trace.py", "runtime/device_groups.py")),
    ("read side, errors, units", ("runtime/snapshot.py", "runtime/errors.py",
                                  "runtime/units.py", "runtime/keywords.py",
                                  "runtime/__init__.py")),
    ("threads and locks", ("/threading.py",)),
]
OWN = ("pwkernel/runtime/", "pwkernel/backends/local/")  # every module here is in some part
UNMATCHED = "unmatched (runtime modules in no part)"


def part_of(module: str) -> str | None:
    """The part a profiled function's module path belongs to (None: none)."""
    path = module.replace("\\", "/")
    return next((p for p, ends in PARTS if path.endswith(ends)), None)


def unmatched_modules() -> list[str]:
    """The runtime's and the local backend's modules, in the checkout imported, in no part."""
    root = Path(pw.__file__).parent
    files = [*(root / "runtime").glob("*.py"), *(root / "backends" / "local").glob("*.py")]
    return sorted(str(f.relative_to(root.parent)) for f in files if part_of(str(f)) is None)


def generated_code() -> dict[str, str]:
    """Where the methods a dataclass generates come from (yappi names their module
    ``<string>``): the class's qualified name to its module's file, for the runtime's and the
    local backend's dataclasses (events, tasks, records: three or four made per computation)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(("pwkernel.runtime.", "pwkernel.backends.local")):
            continue
        for cls in vars(module).values():
            if (isinstance(cls, type) and cls.__module__ == name
                    and hasattr(cls, "__dataclass_fields__")):
                found[cls.__qualname__] = module.__file__
    return found


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


def profile(fn, reps: int) -> dict[str, float]:
    """yappi's CPU time (every thread) of ``reps`` calls of ``fn``, by part; JAX's compiled
    call is left out (it is measured on bare JAX instead)."""
    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.start()
    for _ in range(reps):
        fn()
    yappi.stop()
    seen = dict.fromkeys([p for p, _ in PARTS] + [UNMATCHED, "other Python"], 0.0)
    generated = generated_code()
    for s in yappi.get_func_stats():
        if "jax/_src/stages" in s.module and "__call__" in s.name:
            continue  # the compiled call: JAX's cost, measured beside it
        module = s.module.replace("\\", "/")
        if module == "<string>":  # a dataclass's __init__, __eq__, ...: its class's module
            module = generated.get(s.name.rpartition(".")[0], module)
        part = part_of(module)
        if part is None:
            part = UNMATCHED if any(o in module for o in OWN) else "other Python"
        seen[part] += s.tsub
    return seen


def split(seen: dict[str, float], jax_us: float, total: float) -> dict[str, float]:
    """``total - jax_us`` shared out by what the profile saw of each part."""
    python = sum(seen.values()) or 1.0
    out = {"JAX's compiled call": round(jax_us, 1)}
    return out | {p: round(v / python * (total - jax_us), 1) for p, v in seen.items()}


def small(kind: str) -> dict:
    ctl = pw.Controller(islands=(4, 4))
    ways = variants(ctl, 1, 256, N, 1)  # the dispatch benchmark's own, one call per sample
    bare, opbyop, chained = ways["jax_opbyop"], ways["pw_opbyop"], ways["pw_chained"]
    fn = {"opbyop": opbyop, "chained": chained}[kind]
    jax_us, total = cpu_per_node(bare), cpu_per_node(fn)
    seen = profile(fn, REPS)
    ctl.close()
    return {kind: split(seen, jax_us, total) | {"total": round(total, 1)}}


def large(kind: str, batch: int | None) -> dict:
    """The large step: CPU per step of JAX and pwkernel in paired rounds (the dispatch
    benchmark's ``measure``), then a profile of the pwkernel way."""
    way = {"opbyop": "pw_opbyop", "chained": "pw_chained"}[kind]
    ctl = pw.Controller(islands=(4, 4))
    sl = dispatch_steps.Slice(ctl, LARGE_DEVICES)
    if batch is None:
        batch, t = sl.calibrate(LARGE_MS / 1e3, 1408, passes=3, repeats=5)
    else:
        t = sl.jax_step_s(sl.rounded(batch), repeats=5)
        batch = sl.rounded(batch)
    row = dispatch_steps.measure(sl, LARGE_MS, batch, t, LARGE_ROUNDS)
    jax_us = row["cpu_us_per_step"]["jax_opbyop"]["median"]
    total = jax_us + row["cpu_excess_us"][way]
    seen = profile(sl.ways(batch)[way], 20)
    ctl.close()
    ratio = row["chained_vs_jax" if kind == "chained" else "opbyop_vs_jax"]
    return {kind: split(seen, jax_us, total) | {"total": round(total, 1)},
            "large_step": {"devices": LARGE_DEVICES, "batch": batch,
                           "jax_step_ms": row["jax_step_ms"], "steps_vs_jax": ratio,
                           "cpu_us_per_step": {k: round(v["median"], 1) for k, v in
                                               row["cpu_us_per_step"].items()}}}


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", nargs="?", default="chained", choices=("chained", "opbyop"))
    ap.add_argument("--large", action="store_true",
                    help="the 3 ms matmul step on 4 devices instead of the small steps")
    ap.add_argument("--batch", type=int, default=None,
                    help="the large step's batch (default: calibrated to a 3 ms JAX step)")
    args = ap.parse_args(argv)
    if args.batch is not None and not args.large:
        ap.error("--batch is for --large only")
    if args.batch is not None and args.batch < 1:
        ap.error(f"--batch must be a positive number of rows, got {args.batch}")
    print(f"profiling pwkernel at {Path(pw.__file__).parent}", file=sys.stderr)
    missing = unmatched_modules()
    if missing:
        print(f"modules in no part of PARTS: {missing}", file=sys.stderr)
    out = large(args.kind, args.batch) if args.large else small(args.kind)
    return out | ({"modules in no part": missing} if missing else {})


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))

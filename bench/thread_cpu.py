"""Which thread pays the host cost: the steps sweep's three ways, CPU per step split by thread.

    .venv/bin/python bench/thread_cpu.py [--devices 1] [--ms 1 10] [--seconds 6] [--rounds 2]

The dispatch benchmark's real step (``pwkernel/bench/dispatch_steps.py``: ``tanh(x @ w) @ w.T``,
16 chained calls a sample) on a slice of ``--devices``, its batch calibrated so that plain
``jax.jit`` takes about each ``--ms``; pwkernel OpByOp, pwkernel Chained and JAX run in turn
for ``--seconds`` each, ``--rounds`` times. Prints, per way, steps per second and the CPU time
per step of: the main thread (the caller), pwkernel's watcher threads (``pw-island*-watch-*``:
they see the launches end), pwkernel's other threads, and every thread that is not Python's
(XLA's). Read from ``/proc/self/task/*/stat``, whose clock ticks are 10 ms: a sample of N steps
resolves 10 ms / N per step.

A fourth way, ``jax_watched``, is plain JAX with a stand-in for pwkernel's watcher: a Python
thread that waits for each step's output as it is dispatched and then spends ``--watch-us``
microseconds of its own CPU (the order of what pwkernel's watcher spends per computation;
its CPU is counted as a watcher's). It tells what any per-step host work costs the step on
these cores, with no pwkernel in it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import statistics
import threading
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import pwkernel as pw  # noqa: E402
from pwkernel.bench import dispatch_steps as steps  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def kind(tid: int, python: dict[int, str]) -> str:
    """The group a thread's CPU counts in."""
    name = python.get(tid)
    if name is None:
        return "xla_and_other"
    if name == "MainThread":
        return "main"
    return "pw_watchers" if name.startswith("pw-island") and "-watch-" in name else "pw_other"


def sample(fn, seconds: float) -> dict:
    before, t0, n = thread_cpu(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    wall, after = time.perf_counter() - t0, thread_cpu()
    python = {t.native_id: t.name for t in threading.enumerate()}
    per = collections.Counter()
    for tid, cpu in after.items():
        per[kind(tid, python)] += cpu - before.get(tid, 0.0)
    count = n * steps.CALLS
    return {"steps_per_s": round(count / wall, 1),
            "cpu_us_per_step": {k: round(v / count * 1e6, 1) for k, v in sorted(per.items())}}


def watched(sl: steps.Slice, batch: int, watch_us: float):
    """Plain JAX's chain with a Python thread that waits on each step and then works."""
    todo: queue.Queue = queue.Queue()

    def watcher() -> None:
        clock, budget = time.thread_time, watch_us / 1e6
        while (y := todo.get()) is not None:
            y.block_until_ready()
            start = clock()
            while clock() - start < budget:
                pass

    thread = threading.Thread(target=watcher, name="pw-island0-watch-standin", daemon=True)
    thread.start()
    x0, step, w = sl.x0(batch), sl.jax_step, sl.w

    def run() -> None:
        x = x0
        for _ in range(steps.CALLS):
            x = step(x, w)
            todo.put(x)
        x.block_until_ready()

    return run, lambda: todo.put(None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1, help="the slice (island 0 of 4)")
    ap.add_argument("--ms", type=float, nargs="+", default=[1.0, 10.0],
                    help="JAX step times to calibrate to, in ms")
    ap.add_argument("--seconds", type=float, default=6.0, help="per way and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--watch-us", type=float, default=100.0,
                    help="the stand-in watcher's CPU per step (0: none)")
    args = ap.parse_args(argv)
    # refused before calibrating, not after
    if not 1 <= args.devices <= 4:
        ap.error(f"--devices must be 1 to 4 (a slice of island 0, 4 devices), got {args.devices}")
    if min(args.ms) <= 0 or args.seconds <= 0:
        ap.error(f"--ms and --seconds must be above 0, got --ms {args.ms} --seconds "
                 f"{args.seconds}")
    if args.rounds < 1 or args.watch_us < 0:
        ap.error(f"--rounds must be at least 1 and --watch-us at least 0, got --rounds "
                 f"{args.rounds} --watch-us {args.watch_us}")
    ctl = pw.Controller(islands=(4, 4))
    try:
        sl = steps.Slice(ctl, args.devices)
        for target in args.ms:
            batch, step_s = sl.calibrate(target / 1e3, sl.unit() * 64, 3, 5)
            stand_in, stop = watched(sl, batch, args.watch_us)
            ways = {name: way.fn for name, way in sl.ways(batch).items()}
            ways["jax_watched"] = stand_in
            for fn in ways.values():
                fn()  # compile and warm
            rates: dict[str, list[float]] = collections.defaultdict(list)
            for r in range(args.rounds):
                for name, fn in ways.items():
                    row = {"devices": args.devices, "target_ms": target, "batch": batch,
                           "jax_step_ms": round(step_s * 1e3, 2), "round": r, "way": name,
                           **sample(fn, args.seconds)}
                    rates[name].append(row["steps_per_s"])
                    print(json.dumps(row), flush=True)
            stop()
            # each way's steps/s over plain JAX's in the same round, the median over rounds
            jax_rates = rates.pop("jax_opbyop")
            vs_jax = {name: round(statistics.median(
                a / b for a, b in zip(mine, jax_rates, strict=True)), 3)
                for name, mine in rates.items()}
            print(json.dumps({"devices": args.devices, "target_ms": target, "batch": batch,
                              "watch_us": args.watch_us, "vs_jax": vs_jax}), flush=True)
    finally:
        ctl.close()


if __name__ == "__main__":
    main()

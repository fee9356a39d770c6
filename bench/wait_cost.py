"""Why a thread's host cost grows with the step it waits for: one wait, measured without pwkernel.

    .venv/bin/python bench/wait_cost.py

A thread that waits for a step's output (``block_until_ready``, as pwkernel's watcher waits on
a launch's fence and as a JAX user waits once per chain) is handed each step by the main thread
of the same process: the dispatch benchmark's step (``dispatch_steps.matmul_step``, ``w``
``WIDTH`` x ``WIDTH``) on one device, at batches that take about 1, 3, 10 and 30 ms. For each
it prints, in microseconds of that thread's CPU (medians of ``ROUNDS`` steps): the wait itself,
and then a fixed piece of Python run right after the wait (``work()``: dictionary and list
operations, about what a computation's end costs the runtime) against the same piece run by the
same thread after a wait for nothing (the step's output already ready, the step having just
run) and after no step at all (the thread's own data still in the caches). The wait is one
futex wait whatever its length (``strace -f`` shows no periodic wake-up), so what grows is the
cost of resuming: the step has filled the caches with its own data, and the thread's first
microseconds afterwards run from memory.
"""

from __future__ import annotations

import json
import queue
import statistics
import threading
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pwkernel.bench.dispatch_steps import WIDTH, matmul_step  # noqa: E402

ROUNDS = 60
BATCHES = {1: 512, 3: 1536, 10: 5120, 30: 15360}  # about that many ms a step on this machine


def work() -> None:
    """A fixed piece of Python: the order of what a computation's end costs the runtime."""
    d: dict = {}
    out = []
    for i in range(200):
        d[i] = (i, i + 1)
        out.append(d.get(i - 1))
    d.clear()


def _measure(step, x, w) -> dict:
    todo: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()

    def waiter() -> None:
        clock = time.thread_time
        while (y := todo.get()) is not None:
            c0 = clock()
            y.block_until_ready()
            c1 = clock()
            work()
            c2 = clock()
            done.put((c1 - c0, c2 - c1))

    thread = threading.Thread(target=waiter, name="waiter")
    thread.start()
    try:
        fresh, stale, idle = [], [], []
        ready = step(x, w)
        ready.block_until_ready()
        for _ in range(ROUNDS):
            todo.put(step(x, w))  # the step runs while the waiter waits
            fresh.append(done.get())
            y = step(x, w)
            y.block_until_ready()  # already ready: the wait returns at once
            todo.put(y)
            stale.append(done.get())
            todo.put(ready)  # no step since the last: the caches hold the waiter's own data
            idle.append(done.get())
    finally:
        todo.put(None)
        thread.join()
    us = lambda rows, i: round(statistics.median(r[i] for r in rows) * 1e6, 1)  # noqa: E731
    return {"wait_us": us(fresh, 0), "work_after_wait_us": us(fresh, 1),
            "work_after_no_wait_us": us(stale, 1), "work_idle_us": us(idle, 1)}


def main() -> list[dict]:
    step = jax.jit(matmul_step)
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH))
    rows = []
    for target_ms, batch in BATCHES.items():
        x = jnp.asarray(rng.uniform(-1, 1, (batch, WIDTH)).astype(np.float32))
        step(x, w).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(5):
            step(x, w).block_until_ready()
        row = {"target_ms": target_ms, "batch": batch,
               "step_ms": round((time.perf_counter() - t0) / 5 * 1e3, 2), **_measure(step, x, w)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " ")
                            ).parse_args()  # (no options: --help says what it measures)
    main()

"""Where a runtime's per-step host work hurts least, measured on plain JAX alone.

    .venv/bin/python bench/end_work.py                     # 1 device, ~1 ms steps
    .venv/bin/python bench/end_work.py --devices 4 --batch 1216 --work-us 40

A chain of 16 asynchronous ``jax.jit`` calls of the dispatch benchmark's step
(``tanh(x @ w) @ w.T``, ``pwkernel/bench/dispatch_steps.py``) on virtual CPU devices, run five
ways in alternated rounds, each printed as steps per second over the plain chain's (paired
median) and its wall time per step:

- ``plain``: the chain, then a wait on its last output (what ``bench dispatch`` calls JAX);
- ``kept``: the same, every intermediate output kept alive until the chain ends;
- ``each``: a second thread waits on each step's output in turn and spins ``--work-us`` after
  each (a watcher that does an end's bookkeeping as each step ends);
- ``deferred``: that thread only notes each end's time, and spins 16 x ``--work-us`` after
  the last (the same work, moved off the steps);
- ``last``: it waits on the last output only, then spins the same.

No pwkernel code runs: this asks what the host and the devices sharing two cores allow, the
question behind issue 25's ratios (docs/benchmarks.md, tenth round).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

CALLS = 16


def spin(us: float) -> None:
    """Hold the core for ``us`` microseconds (host work, without the GIL released)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class Watcher:
    """A thread that runs ``watch(outputs)`` on each chain it is handed, one at a time."""

    def __init__(self, watch):
        self.watch, self.handed, self.done = watch, [], threading.Event()
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            self.watch(self.handed.pop())
            self.done.set()

    def __call__(self, outputs: list) -> None:
        self.done.clear()
        self.handed.append(outputs)
        self.wake.set()
        self.done.wait()


def ways(devices: int, batch: int, work_us: float) -> dict:
    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
    xs, ws = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    step = jax.jit(lambda x, w: jnp.tanh(x @ w) @ w.T, in_shardings=(xs, ws), out_shardings=xs)
    rng = np.random.default_rng(0)
    w = jax.device_put((rng.standard_normal((256, 256)) / 16).astype(np.float32), ws)
    x0 = jax.device_put(rng.uniform(-1, 1, (batch, 256)).astype(np.float32), xs)

    def chain(keep: bool):
        x, outs = x0, []
        for _ in range(CALLS):
            x = step(x, w)
            if keep:
                outs.append(x)
        return x, outs

    def each(outs):
        for o in outs:
            o.block_until_ready()
            spin(work_us)

    def deferred(outs):
        seen = []
        for o in outs:
            o.block_until_ready()
            seen.append(time.perf_counter())
        spin(work_us * len(outs))

    def last(outs):
        outs[-1].block_until_ready()
        spin(work_us * len(outs))

    def watched(fn):
        watcher = Watcher(fn)
        return lambda: watcher(chain(True)[1])

    return {"plain": lambda: chain(False)[0].block_until_ready(),
            "kept": lambda: chain(True)[0].block_until_ready(),
            "each": watched(each), "deferred": watched(deferred), "last": watched(last)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--batch", type=int, default=640, help="rows of x (640: ~1 ms on 1 device)")
    ap.add_argument("--work-us", type=float, default=40.0, help="host work per step")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    runs = ways(args.devices, args.batch, args.work_us)
    for fn in runs.values():  # compile and warm
        fn()
    wall = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            wall[name].append((time.perf_counter() - t0) / CALLS)
    for name in runs:
        ratio = statistics.median(p / t for p, t in zip(wall["plain"], wall[name], strict=True))
        print(f"{name:9s} {ratio:.3f} of plain's steps/s, "
              f"{statistics.median(wall[name]) * 1e6:7.0f} us a step")


if __name__ == "__main__":
    main()

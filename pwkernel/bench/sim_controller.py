"""How fast the simulated controller runs: thousands of computations on a 2048-chip pod through
the whole runtime (tracing, plans, dispatch, the gang scheduler, futures, trace), on the
virtual clock.

``python -m pwkernel.bench.sim_controller [--computations N] [--chips C] [--json PATH]``
submits a 100-step program on every chip of a TPU v4 pod until N computations (default
10,000), waits for the last, and prints the wall time, the virtual time and the events traced.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import pwkernel as pw
from pwkernel.backends import sim

STEPS = 100  # computations per program


def run(computations: int = 10_000, chips: int = 2048) -> dict:
    """Wall and virtual seconds of ``computations`` one-chip-set steps on ``chips`` chips."""
    if computations < STEPS or computations % STEPS:
        raise ValueError(f"computations must be a positive multiple of {STEPS}, got "
                         f"{computations}.")
    t0 = time.perf_counter()
    with pw.Controller(backend="sim", cluster=sim.Cluster.preset("tpu-v4", chips=chips)) as ctl:
        step = pw.function(lambda x: x + 1, slice=ctl.slice(chips), name="step", sim_cost=1e-4)

        @pw.program
        def steps(x):
            for _ in range(STEPS):
                x = step(x)
            return x

        x = np.zeros(chips * 16, np.float32)
        for _ in range(computations // STEPS):
            x = steps(x)
        x.wait()
        out = {"chips": chips, "computations": computations,
               "wall_s": time.perf_counter() - t0, "virtual_s": ctl.executor.now(),
               "events": len(ctl.trace)}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m pwkernel.bench.sim_controller",
                                description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--computations", type=int, default=10_000)
    p.add_argument("--chips", type=int, default=2048)
    p.add_argument("--json", type=Path, default=None, metavar="PATH")
    a = p.parse_args(argv)
    try:
        out = run(a.computations, a.chips)
    except ValueError as e:  # (a SimError too: chips that are no whole hosts): one line
        p.error(str(e))
    print(f"{out['computations']} computations on {out['chips']} simulated chips through the "
          f"whole runtime: {out['wall_s']:.2f} s wall, {out['virtual_s']:.3f} s virtual, "
          f"{out['events']} events traced")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

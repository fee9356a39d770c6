"""How fast the simulator runs at the paper's scale: 2048 chips, 10,000 computations.

``python -m pwkernel.backends.sim.scale [--json]`` times three workloads on a TPU v4 pod of
2048 chips (512 hosts, one island) and prints the wall-clock seconds of each simulation:

- ``spmd``: one program, a chain of 10,000 steps, each on all 2048 chips (every step a gang
  of 2048 chips: the scheduler's and the chips' worst case);
- ``pipelines``: four clients sharing the pod under proportional share, each submitting
  pipelined programs over 16 stages of 128 chips (8 microbatches, a transfer between
  stages), 10,000 computations in all;
- ``opbyop``: 10,000 one-computation programs on all 2048 chips, submitted faster than they
  run, so thousands wait in the scheduler at once (the gang scheduler keeps its order
  incrementally, so this is no longer quadratic).

A benchmark, not a test: the target (issue 14) is at most 30 s each on a 2-core machine.
``tests/backends/sim/test_engine.py`` pins the three workloads' timelines at 300 computations, so a
change made for speed cannot change what the engine computes.
"""

from __future__ import annotations

import argparse
import json
import time

from .cluster import Cluster
from .engine import Simulator
from .program import NodeKind, SimNode, SimProgram


def spmd(cluster: Cluster, steps: int = 10_000, seconds: float = 5e-3) -> SimProgram:
    chips = cluster.island_devices(0)
    return SimProgram("spmd", [SimNode(i, "step", chips, (i - 1,) if i else (), seconds)
                               for i in range(steps)])


def pipeline(cluster: Cluster, stages: int = 16, microbatches: int = 8,
             seconds: float = 1e-3, nbytes: int = 64 << 20) -> SimProgram:
    """Stage s of microbatch m reads stage s-1 of m (through an ICI transfer between the two
    stages' chips) and stage s of m-1 (its own weights' state, on its own chips)."""
    chips = cluster.island_devices(0)
    width = len(chips) // stages
    slices = [chips[s * width:(s + 1) * width] for s in range(stages)]
    nodes: list[SimNode] = []
    last: dict[tuple[int, int], int] = {}
    for m in range(microbatches):
        for s in range(stages):
            inputs = []
            if s:
                nodes.append(SimNode(len(nodes), f"send{s}", slices[s], (last[m, s - 1],),
                                     kind=NodeKind.TRANSFER, nbytes=nbytes,
                                     src_devices=slices[s - 1]))
                inputs.append(len(nodes) - 1)
            if m:
                inputs.append(last[m - 1, s])
            nodes.append(SimNode(len(nodes), f"stage{s}", slices[s], tuple(inputs), seconds))
            last[m, s] = len(nodes) - 1
    return SimProgram("pipeline", nodes)


WORKLOADS = ("spmd", "pipelines", "opbyop")


def build(name: str, computations: int = 10_000) -> Simulator:
    """The workload ``name`` submitted to a fresh simulator of a 2048-chip TPU v4 pod, not
    yet run."""
    cluster = Cluster.preset("tpu-v4", chips=2048)
    if name == "spmd":
        sim = Simulator(cluster)
        sim.submit(spmd(cluster, computations))
    elif name == "opbyop":
        sim = Simulator(cluster)
        step = spmd(cluster, 1)
        for _ in range(computations):
            sim.submit(step)
    else:
        sim = Simulator(cluster, policy="share")
        prog = pipeline(cluster)
        per_run = sum(n.kind is NodeKind.COMPUTE for n in prog.nodes)
        for r in range(computations // per_run):
            client = f"client{r % 4}"
            sim.submit(prog, client=client, weight=float(2 ** (r % 4)))
    return sim


def measure(name: str, computations: int = 10_000) -> dict:
    t0 = time.perf_counter()
    sim = build(name, computations)
    built = time.perf_counter()
    virtual = sim.run()
    wall = time.perf_counter() - t0
    n = sum(1 for e in sim.trace.rows() if e[1] == "compute")
    return {"workload": name, "chips": sim.cluster.num_chips, "computations": n,
            "events": len(sim.trace), "virtual_seconds": round(virtual, 6),
            "build_seconds": round(built - t0, 3), "wall_seconds": round(wall, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pwkernel.backends.sim.scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list, one object per workload")
    parser.add_argument("--computations", type=int, default=10_000)
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="run only these (default: all three)")
    args = parser.parse_args(argv)
    if args.computations < 1:  # (0 or fewer ran nothing and reported it as a result)
        parser.error(f"--computations must be at least 1, got {args.computations}.")
    rows = [measure(w, args.computations) for w in (args.workload or WORKLOADS)]
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['workload']:>10}: {r['computations']} computations on {r['chips']} chips "
              f"({r['events']} events, {r['virtual_seconds']} s simulated) in "
              f"{r['wall_seconds']} s")


if __name__ == "__main__":
    main()

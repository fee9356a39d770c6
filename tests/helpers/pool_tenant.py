"""One tenant of a test pool, as its own process (``tests/helpers/pool.py``'s ``Tenant``).

``python -m tests.helpers.pool_tenant MODE --address A --pool P --name N [options]`` attaches
a controller to the pool, prints ``{"ready": ...}`` once its programs are compiled, waits for
``go`` on stdin, then:

- ``collectives``: ``--steps`` runs of a program that sums over the devices ``--d0`` of island
  0 (psum), gathers twice the sum over ``--d1`` of island 1 (all_gather) and sums that back on
  island 0, all submitted before any is waited for; prints whether every result is exact;
- ``hold``: keeps a 4 MiB value on each island, prints ``{"holding": bytes}`` and waits (to
  be killed).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import pwkernel as pw


def say(**values) -> None:
    print(json.dumps(values), flush=True)


def summed(mesh):
    return jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh, in_specs=P("x"),
                         out_specs=P())


def gathered(mesh):
    return jax.shard_map(lambda b: jax.lax.all_gather(b * 2, "x", tiled=True), mesh=mesh,
                         in_specs=P("x"), out_specs=P(), check_vma=False)


def collectives(ctl, args) -> None:
    d0, d1 = _ids(args.d0), _ids(args.d1)
    s0, s1 = ctl.slice(len(d0), devices=d0), ctl.slice(len(d1), devices=d1)
    reduce0 = pw.function(summed(s0.mesh), slice=s0, in_specs=P("x"), out_specs=P(),
                          name=f"psum-{args.name}")
    gather1 = pw.function(gathered(s1.mesh), slice=s1, in_specs=P("x"), out_specs=P(),
                          name=f"gather-{args.name}")

    @pw.program
    def step(v):
        return reduce0(gather1(reduce0(v)))

    n0 = len(d0)

    def expected(v: np.ndarray) -> np.ndarray:
        a = v.reshape(n0, -1).sum(0)  # psum of the blocks
        return (2 * a).reshape(n0, -1).sum(0)  # all_gather of twice that, summed again

    inputs = [np.arange(4 * n0 * 2, dtype=np.float32) + 100 * i for i in range(args.steps)]
    np.asarray(step(inputs[0]).result(120))  # compiled and exported before the race
    say(ready=args.name)
    sys.stdin.readline()
    outs = [step(v) for v in inputs]  # every run submitted before any is waited for
    exact = [bool(np.array_equal(np.asarray(o.result(120)), expected(v)))
             for o, v in zip(outs, inputs, strict=True)]
    say(exact=exact)


def hold(ctl, args) -> None:
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    make0 = pw.function(lambda x: x + 1, slice=s0, in_specs=P("x"), out_specs=P("x"))
    make1 = pw.function(lambda x: x + 2, slice=s1, in_specs=P("x"), out_specs=P("x"))
    big = np.zeros(1 << 20, np.float32)  # 4 MiB
    kept = [make0(big), make1(big)]
    for fut in kept:
        fut.wait(120)
    say(holding=len(kept) * big.nbytes)
    sys.stdin.readline()  # until killed


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["collectives", "hold"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--weight", type=float, default=1.0)
    parser.add_argument("--d0", default="0,1,2,3")
    parser.add_argument("--d1", default="4,5")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    ctl = pw.Controller(backend="ray", address=args.address, pool=args.pool,
                        tenant=args.name, weight=args.weight)
    try:
        {"collectives": collectives, "hold": hold}[args.mode](ctl, args)
    finally:
        ctl.close()


if __name__ == "__main__":
    main()

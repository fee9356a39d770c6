"""One process of the pool benchmark (``bench/pool.py``): a controller that takes commands.

``python -m pwkernel.bench.pool_tenant --name N (--pool P [--weight W] | --islands 4)``
waits for ``attach ADDRESS`` on stdin, attaches to pool ``P`` as tenant ``N`` (or, with
``--islands``, is a dedicated controller with islands of its own on the cluster at ADDRESS:
the client the pool is compared with), compiles its step, prints ``{"ready": N}`` and then
answers one JSON line per command read from stdin:

- ``run K``: K steps of a dependent chain, ``--ahead`` steps in flight; ``{"steps", "seconds"}``;
- ``busy S``: the same chain for S seconds (the pool always has its work queued);
  ``{"steps", "seconds"}``;
- ``hold``: keeps ``--hold`` bytes on each island until the process ends; ``{"holding"}``;
- ``quit`` (or the end of stdin): closes the controller and exits.

A step is one computation on island 0's first ``--devices`` devices: a product of each
device's block with itself and a ``psum`` over the slice (a collective: the pool's gang
order is what keeps two tenants' steps from deadlocking on the shared devices).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pwkernel as pw

TIMEOUT = 120.0


def say(**values) -> None:
    print(json.dumps(values), flush=True)


def step_function(ctl: pw.Controller, devices: int, name: str):
    """``pw.function`` of one step on island 0's first ``devices`` devices."""
    vs = ctl.slice(devices, island=0)

    def body(b):
        return jnp.tanh(b @ b.T) * 0.5 + jax.lax.psum(b, "x") * 0.01

    return pw.function(jax.shard_map(body, mesh=vs.mesh, in_specs=P("x"), out_specs=P("x")),
                       slice=vs, in_specs=P("x"), out_specs=P("x"), name=name)


def chain(step, x, ahead: int, steps: int | None = None, seconds: float | None = None):
    """``steps`` steps (or as many as fit in ``seconds``), ``ahead`` of them in flight;
    returns (the last value, steps made, seconds taken)."""
    inflight, made = [], 0
    t0 = time.perf_counter()
    while (made < steps) if steps is not None else (time.perf_counter() - t0 < seconds):
        x = step(x)
        inflight.append(x)
        made += 1
        if len(inflight) > ahead:
            inflight.pop(0).wait(TIMEOUT)
    for fut in inflight:
        fut.wait(TIMEOUT)
    return x, made, time.perf_counter() - t0


def held(ctl: pw.Controller, nbytes: int) -> list:
    """A value of ``nbytes`` bytes made on each island (waited for): what a tenant holds."""
    kept = []
    for island in range(len(ctl.islands)):
        make = pw.function(lambda z: z + 1, slice=ctl.slice(1, island=island), name="hold")
        kept.append(make(np.zeros(nbytes // 4, np.float32)))
    for fut in kept:
        fut.wait(TIMEOUT)
    for island in range(len(ctl.islands)):  # the uploads' frees done: it holds what it says
        ctl.executor.buffers(island)
    return kept


def serve(ctl: pw.Controller, args: argparse.Namespace) -> None:
    step = step_function(ctl, args.devices, f"step-{args.name}")
    x0 = np.ones((args.devices * args.size, args.size), np.float32)
    x = step(x0)
    x.result(TIMEOUT)  # compiled on the island before any command is timed
    kept = []
    say(ready=args.name)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "run":
            x, made, seconds = chain(step, x, args.ahead, steps=int(rest[0]))
            say(steps=made, seconds=seconds)
        elif command == "busy":
            x, made, seconds = chain(step, x, args.ahead, seconds=float(rest[0]))
            say(steps=made, seconds=seconds)
        elif command == "hold":
            kept = held(ctl, args.hold)
            say(holding=args.hold * len(kept))
        elif command == "quit":
            break
        else:
            say(error=f"unknown command {line.strip()!r}; expected run K, busy S, hold, quit")
    del kept


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pwkernel.bench.pool_tenant")
    p.add_argument("--name", required=True)
    p.add_argument("--pool", default=None)
    p.add_argument("--weight", type=float, default=None)
    p.add_argument("--islands", default=None, help="a dedicated controller's islands, e.g. 4")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--ahead", type=int, default=4)
    p.add_argument("--hold", type=int, default=4 << 20)
    args = p.parse_args(argv)
    command, _, address = sys.stdin.readline().partition(" ")
    if command != "attach":
        return  # the benchmark gave up before the pool started
    address = address.strip()
    if args.pool is not None:
        ctl = pw.Controller(backend="ray", address=address, pool=args.pool,
                            tenant=args.name, weight=args.weight)
    else:
        sizes = tuple(int(n) for n in args.islands.split(","))
        ctl = pw.Controller(backend="ray", address=address, islands=sizes)
    try:
        serve(ctl, args)
    finally:
        ctl.close()


if __name__ == "__main__":
    main()

"""A training step with its state packed (``pw.train.SPMD(..., packed=True)``) against a future
per leaf (the default) and plain ``jax.jit`` (the step as it is, ``jax``, and the same packed
step, ``jax_packed``), in the same run: wall time, process CPU and the calling thread's CPU per
step (submitting the steps), medians over alternating rounds.

    .venv/bin/python bench/packed_state.py                     # batch 4 (~10 ms steps here)
    .venv/bin/python bench/packed_state.py --batch 32 --rounds 9
    PWKERNEL_BENCH_ISLANDS=1 python bench/packed_state.py --devices 1   # one GPU (bench/gpu.sh)

The model and optimizer are ``bench train --quick``'s (83 state leaves with Adam); each round
runs ``--steps`` steps per way, the state donated from step to step, waited for at the end.
The calling thread's CPU is the host cost a packed state removes; the wall time shows what
the extra pass over the state costs the devices (on CPU devices: more than it saves).
``pw_packed_vs_jax_packed`` (steps per second, paired by round) is what the runtime costs a
step once the state is a few futures: the per-step part of its host cost, without the
per-leaf part (``pw_leaves_vs_jax`` beside it, the default's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import optax  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.bench.harness import islands  # noqa: E402
from pwkernel.bench.train import CONFIGS, LR, Trainer, jax_trainer  # noqa: E402
from pwkernel.train import SPMD, wait  # noqa: E402
from pwkernel.train import transformer as T  # noqa: E402


def one_round(trainer: Trainer) -> tuple[float, float, float]:
    """Wall ms, process CPU us and calling-thread CPU us per step, over one round."""
    c0, w0, t0 = time.process_time(), time.perf_counter(), time.thread_time()
    state = trainer.state
    for _ in range(trainer.steps):
        state, loss = trainer.step(state, trainer.batch)
    submit = time.thread_time() - t0
    trainer.state = state
    jax.block_until_ready(wait((state, loss)))  # (a packed state is not unpacked)
    n = trainer.steps
    return ((time.perf_counter() - w0) / n * 1e3, (time.process_time() - c0) / n * 1e6,
            submit / n * 1e6)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8, help="steps per round and way")
    ap.add_argument("--devices", type=int, default=4, help="the slice (island 0)")
    args = ap.parse_args(argv)
    for name in ("batch", "rounds", "steps", "devices"):  # before minutes of compiling
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    model = CONFIGS["quick"]["model"]
    ctl = pw.Controller(islands=islands())
    try:
        stages, vs = T.split(model, 2), ctl.slice(args.devices, island=0)
        devices = list(vs.device_ids)
        kw = {"loss": T.cross_entropy, "optimizer": optax.adam(LR)}
        packed = SPMD(stages, vs, packed=True, name="packed", **kw)
        leaves = SPMD(stages, vs, name="leaves", **kw)
        batch, tokens = T.batch(model, args.batch, seed=0), args.batch * model.seq
        ways = {"packed": Trainer(packed.step, packed.init(0), packed.place(batch), args.steps,
                                  tokens),
                "leaves": Trainer(leaves.step, leaves.init(0), leaves.place(batch), args.steps,
                                  tokens),
                "jax": jax_trainer(leaves, leaves.init(0), batch, args.steps, tokens),
                "jax_packed": jax_trainer(packed, packed.init(0), batch, args.steps, tokens)}
        for t in ways.values():
            one_round(t)  # compile, first plans
        seen: dict[str, list[tuple[float, float, float]]] = {k: [] for k in ways}
        for r in range(args.rounds):
            for name in (list(ways) if r % 2 else list(ways)[::-1]):
                seen[name].append(one_round(ways[name]))
    finally:
        ctl.close()
    out = {name: {field: round(statistics.median(s[i] for s in samples), 2)
                  for i, field in enumerate(("wall_ms", "process_cpu_us",
                                             "calling_thread_cpu_us"))}
           for name, samples in seen.items()}
    for key, a, b in (("pw_packed_vs_jax_packed", "packed", "jax_packed"),
                      ("pw_leaves_vs_jax", "leaves", "jax")):  # steps/s: JAX's time over ours
        out[key] = round(statistics.median(sb[0] / sa[0] for sa, sb in zip(seen[a], seen[b],
                                                                         strict=True)), 3)
    out["config"] = {"devices": devices, "platform": jax.devices()[0].platform,
                     "batch": args.batch, "rounds": args.rounds, "steps": args.steps,
                     "state_leaves": packed.layout.leaves,
                     "packs": len(packed.layout.groups) + len(packed.layout.loose)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

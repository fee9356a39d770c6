"""What a training loop pays each time it waits for its step: ``bench train --quick``'s SPMD
step (83 state leaves, Adam, batch 4), ``--steps`` steps submitted, then the loop's wait.

    .venv/bin/python bench/sync_cost.py [--samples 20] [--steps 8]
    PYTHONPATH=<another checkout> .venv/bin/python bench/sync_cost.py   # that checkout's

Per sample, in microseconds (medians printed as JSON): from the last step's end (its trace
event's ``t_end``, when the runtime saw it) to its loss future resolved (``ended_to_loss``);
then ``pw.train.wait`` on the whole state and loss (``wait``), then
``jax.block_until_ready`` on them (``block_until_ready``), both on futures that have all
resolved. Plain JAX's equivalent of the last two is one ``block_until_ready`` on arrays that
are ready: a few microseconds per leaf.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import optax  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.bench.train import CONFIGS, LR, Trainer  # noqa: E402
from pwkernel.train import SPMD, wait  # noqa: E402
from pwkernel.train import transformer as T  # noqa: E402


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--steps", type=int, default=8, help="steps submitted before each wait")
    args = ap.parse_args(argv)
    for name in ("samples", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    model = CONFIGS["quick"]["model"]
    rows: list[tuple[float, float, float]] = []
    with pw.Controller(islands=(4, 4)) as ctl:
        spmd = SPMD(T.split(model, 2), ctl.slice(4, island=0), loss=T.cross_entropy,
                    optimizer=optax.adam(LR), name="spmd")
        trainer = Trainer(spmd.step, spmd.init(0), spmd.place(T.batch(model, 4, seed=0)),
                          args.steps, 1)
        for _ in range(3):  # compiled, warm
            trainer.once()
        for _ in range(args.samples):
            first = ctl.trace.next_index
            loss = None
            for _ in range(args.steps):
                trainer.state, loss = trainer.step(trainer.state, trainer.batch)
            loss.wait()
            t_loss = time.perf_counter()
            wait((trainer.state, loss))
            t_wait = time.perf_counter()
            jax.block_until_ready((trainer.state, loss))
            t_ready = time.perf_counter()
            last = [e for e in ctl.trace.events(first) if e.kind == "compute"][-1]
            rows.append((t_loss - last.t_end, t_wait - t_loss, t_ready - t_wait))
    out = {"samples": args.samples, "steps": args.steps, "pwkernel": pw.__file__}
    for k, name in enumerate(("ended_to_loss", "wait", "block_until_ready")):
        out[f"{name}_us"] = round(1e6 * statistics.median(r[k] for r in rows))
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))

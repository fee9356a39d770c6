"""The runtime's Python work per computation, counted rather than timed: bytecodes and calls.

    .venv/bin/python bench/count_bytecodes.py chained          # or opbyop, or train
    .venv/bin/python bench/count_bytecodes.py train --top 30   # and the functions that do it

Timings on a shared 2-core machine move by a quarter from one run to the next; these counts
do not (they move by well under 1 %), so two checkouts can be compared on a busy machine:
run it with ``PYTHONPATH=<another checkout>`` for that one. Every thread is counted (the
tracer is installed before the controller starts its threads), only code under the imported
``pwkernel`` package and the code generated for it that it calls (a dataclass's ``__init__``;
JAX's own work is the same in every checkout), after warm-up rounds.

- ``chained``, ``opbyop``: the dispatch benchmark's small steps (``pwkernel.bench.dispatch``'s
  ``variants``: 64-step chains of a 256-element step on a 1-device slice), per computation.
- ``train``: one SPMD training step of the ``quick`` configuration of ``bench train`` (a
  4-block decoder on island 0's 4 devices, state donated), per step and per state leaf.

A count is not a time: a call costs more than a plain bytecode, and C code called from Python
(JAX's dispatch, locks, dict operations) is not seen. It tells what changed in the runtime's
Python; ``python -m pwkernel.bench dispatch`` tells what that costs. Two cautions:

- Work moved from Python loops into chains of C iterators (``map``, ``starmap``,
  ``compress``, ``setattr`` per element) leaves the count but not the time: one such rewrite
  of the per-leaf path cut the ``train`` count six-fold and made a step of 83 leaves a fifth
  slower. Time a change of that kind against bare JAX in the same run (``bench train``,
  ``bench dispatch``) before trusting its count.
- ``chained`` and ``opbyop`` depend a little on load: a completion seen at once costs less
  than one handed to a watcher thread. Compare checkouts back to back.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)

import pwkernel as pw  # noqa: E402

ROOT = str(Path(pw.__file__).parent)
WARM, COUNTED = 10, 10  # rounds before counting, rounds counted


class Counter:
    """Counts the bytecodes and calls of ``pwkernel`` code in every thread while ``on``."""

    def __init__(self):
        self.on = False
        self.bytecodes: dict = {}  # code object -> bytecodes run
        self.calls: dict = {}      # code object -> calls
        self._own: dict = {}

    def install(self) -> None:
        threading.settrace(self._call)
        sys.settrace(self._call)

    def remove(self) -> None:
        sys.settrace(None)
        threading.settrace(None)

    def _call(self, frame, event, arg):
        if event != "call":
            return None
        code = frame.f_code
        own = self._own.get(code)
        if own is None:
            name = code.co_filename
            if name.startswith("<"):  # generated (a dataclass's __init__): its caller's
                back = frame.f_back
                if back is None or not self._own.get(back.f_code, False):
                    return None
            else:
                own = self._own[code] = name.startswith(ROOT)
                if not own:
                    return None
        elif not own:
            return None
        if self.on:
            self.calls[code] = self.calls.get(code, 0) + 1
        frame.f_trace_opcodes = True
        return self._opcode

    def _opcode(self, frame, event, arg):
        if event == "opcode" and self.on:
            code = frame.f_code
            self.bytecodes[code] = self.bytecodes.get(code, 0) + 1
        return self._opcode

    def report(self, per: float, top: int) -> dict:
        out = {"bytecodes": round(sum(self.bytecodes.values()) / per, 1),
               "calls": round(sum(self.calls.values()) / per, 2)}
        if top:
            rows = sorted(self.bytecodes.items(), key=lambda kv: -kv[1])[:top]
            out["top"] = [{"function": f"{_where(c.co_filename)}:"
                                       f"{c.co_name}:{c.co_firstlineno}",
                           "bytecodes": round(n / per, 1),
                           "calls": round(self.calls.get(c, 0) / per, 2)} for c, n in rows]
        return out


def _where(filename: str) -> str:
    return filename if filename.startswith("<") else str(
        Path(filename).relative_to(Path(ROOT).parent))


def small(kind: str, counter: Counter, top: int) -> dict:
    from pwkernel.bench.dispatch import variants

    n = 64
    ctl = pw.Controller(islands=(4, 4))
    fn = variants(ctl, 1, 256, n, 1)[{"chained": "pw_chained", "opbyop": "pw_opbyop"}[kind]]
    try:
        for _ in range(WARM):
            fn()
        counter.on = True
        for _ in range(COUNTED):
            fn()
        counter.on = False
    finally:
        ctl.close()
    return {kind: {"per": "computation"} | counter.report(COUNTED * n, top)}


def train(counter: Counter, top: int) -> dict:
    import optax

    from pwkernel.bench.train import CONFIGS, LR
    from pwkernel.train import SPMD, fetch
    from pwkernel.train import transformer as T

    cfg = CONFIGS["quick"]
    ctl = pw.Controller(islands=(4, 4))
    try:
        spmd = SPMD(T.split(cfg["model"], 2), ctl.slice(4, island=0), loss=T.cross_entropy,
                    optimizer=optax.adam(LR))
        state = spmd.init(0)
        batch = spmd.place(T.batch(cfg["model"], cfg["batch"], seed=0))
        leaves = len(jax.tree_util.tree_leaves(state))
        for counting in (False, True):
            counter.on = counting
            for _ in range(COUNTED if counting else WARM):
                state, loss = spmd.step(state, batch)
            ctl.wait()  # every counted step's end counted too (not only those seen in time)
            counter.on = False
            jax.block_until_ready(fetch((state, loss)))
    finally:
        ctl.close()
    out = counter.report(COUNTED, top)
    return {"train": {"per": "step", "state_leaves": leaves,
                      "bytecodes_per_leaf": round(out["bytecodes"] / leaves, 1)} | out}


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", nargs="?", default="chained", choices=("chained", "opbyop", "train"))
    ap.add_argument("--top", type=int, default=0, help="also list the N busiest functions")
    args = ap.parse_args(argv)
    if args.top < 0:
        ap.error(f"--top must be 0 or a positive number of functions, got {args.top}")
    print(f"counting pwkernel at {ROOT}", file=sys.stderr)
    counter = Counter()
    counter.install()  # before the controller: its threads inherit the tracer
    try:
        return train(counter, args.top) if args.kind == "train" else small(args.kind, counter,
                                                                           args.top)
    finally:
        counter.remove()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))

"""A seeded Ctrl-C stress: a workload runs in the main thread and a helper thread interrupts it
at a random moment (a real ``SIGINT`` to the process, or ``_thread.interrupt_main()``), many
trials; after each the promises of docs/reliability.md are checked. A hang dumps every
thread's stack (faulthandler) and ends the process.

    PYTHONPATH=. python -m tests.helpers.ctrlc_stress --trials 40 --seed 0 [--only train]

Workloads: ``train`` (an SPMD loop, ``float(loss)`` each step), ``pipe`` (the same with a
two-island Pipeline), ``chain`` (a chain of calls waited on with ``.result()``) and ``cell``
(``%%pathways`` cells in an IPython shell, binding three names)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import signal
import sys
import threading
import time
import traceback

import jax

jax.config.update("jax_num_cpu_devices", 8)

import _thread  # noqa: E402

import numpy as np  # noqa: E402
import optax  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.train import transformer as T  # noqa: E402

LAST: dict = {}  # where the last interrupt was raised (shown with a failure)
HANG_S = 90  # a trial (workload and checks) that takes longer is reported as a hang


def pw_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("pw-")}


class Interrupter:
    """Interrupt the main thread once, ``delay`` seconds from ``start()``."""

    def __init__(self, delay: float, how: str):
        self.delay, self.how, self.fired = delay, how, threading.Event()
        self.during = True  # it fired before the workload returned

    def start(self):
        threading.Thread(target=self._run, daemon=True, name="stress-interrupter").start()

    def _run(self):
        time.sleep(self.delay)
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            _thread.interrupt_main()
        self.fired.set()


def trial(work, delay: float, how: str) -> bool:
    """Run ``work()`` with one interrupt ``delay`` s in; True if it came before the workload
    returned."""
    hit = Interrupter(delay, how)
    try:
        hit.start()
        work()
        if not hit.fired.is_set():
            hit.during = False
        hit.fired.wait()
        time.sleep(0.2)  # (a kept interrupt comes at most GRACE later)
    except KeyboardInterrupt:
        LAST["where"] = traceback.format_exc(limit=-4)
    return hit.during


class Train:
    """``state, loss = t.step(state, batch); float(loss)``: after an interrupt the state
    in hand is whole, and its next step's loss is the reference loss for its step count."""

    STEPS = 4

    def __init__(self, ctl, kind: str):
        cfg = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
        if kind == "pipe":
            self.t = pw.train.Pipeline(T.split(cfg, 2), [ctl.slice(2, island=0),
                                                         ctl.slice(2, island=1)],
                                       loss=T.cross_entropy, optimizer=optax.adam(1e-2),
                                       microbatches=2)
        else:
            self.t = pw.train.SPMD(T.split(cfg, 2), ctl.slice(4, island=0),
                                   loss=T.cross_entropy, optimizer=optax.adam(1e-2))
        self.batch = T.batch(cfg, 8, seed=0)
        state, self.ref = self.t.init(0), []
        for _ in range(self.STEPS + 2):
            state, loss = self.t.step(state, self.batch)
            self.ref.append(float(loss))
        self.box = {}

    def work(self):
        box = self.box
        box["state"] = self.t.init(0)
        for _ in range(self.STEPS):
            box["state"], loss = self.t.step(box["state"], self.batch)
            float(loss)

    def check(self) -> str | None:
        state = self.box["state"]
        try:
            count = _count(state)
        except Exception as e:  # noqa: BLE001
            return f"the state in hand is not whole: {type(e).__name__}: {e}"
        self.box["state"], loss = self.t.step(state, self.batch)
        got = float(loss)
        if not np.isclose(got, self.ref[count], rtol=1e-5):
            return f"after {count} steps the next loss is {got}, expected {self.ref[count]}"
        return None


def _count(state) -> int:
    counts = {int(v) for v in jax.tree_util.tree_leaves(pw.train.fetch(state.opt_state))
              if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.integer)}
    assert len(counts) == 1, counts
    return counts.pop()


class Chain:
    """A chain of 60 calls across two islands, then ``.result()``."""

    N = 60

    def __init__(self, ctl):
        self.f = pw.function(lambda x: x * 0.5 + 1.0, slice=ctl.slice(2, island=0), name="f")
        self.g = pw.function(lambda x: x * 0.5 + 2.0, slice=ctl.slice(2, island=1), name="g")
        self.k = 0

    def expected(self, k):
        v = np.full(4, float(k), np.float32)
        for i in range(self.N):
            v = v * np.float32(0.5) + np.float32(1.0 if i % 2 == 0 else 2.0)
        return v

    def run(self, k):
        x = np.full(4, float(k), np.float32)
        for i in range(self.N):
            x = (self.f if i % 2 == 0 else self.g)(x)
        return x.result(HANG_S)

    def work(self):
        self.k += 1
        self.run(self.k)

    def check(self) -> str | None:
        self.k += 1
        got = np.asarray(self.run(self.k))
        if not np.allclose(got, self.expected(self.k)):
            return f"the next chain gives {got}, expected {self.expected(self.k)}"
        return None


class Cell:
    """A ``%%pathways`` cell binding ``NAMES`` names from ``x``: after an interrupt either all
    of them hold this trial's values or all the sentinel set before it."""

    NAMES = 12
    SOURCE = "%%pathways --slice s\n" + "".join(
        f"v{i} = x * {i + 1} + 1\n" for i in range(NAMES))

    def __init__(self, ip):
        self.ip, self.k = ip, 0
        self.ip.run_cell("%pathways slice s 2")

    def work(self):
        self.k += 1
        ns = self.ip.user_ns
        ns.update({f"v{i}": "unset" for i in range(self.NAMES)})
        ns["x"] = np.full(4, float(self.k), np.float32)
        self.ip.run_cell(self.SOURCE)

    def _state(self):
        seen = [self.ip.user_ns.get(f"v{i}") for i in range(self.NAMES)]
        unset = [isinstance(v, str) and v == "unset" for v in seen]
        if all(unset):
            return "none"
        try:
            right = [not u and np.allclose(np.asarray(v), self.k * (i + 1) + 1)
                     for i, (v, u) in enumerate(zip(seen, unset, strict=True))]
        except Exception as e:  # noqa: BLE001
            return f"unreadable ({type(e).__name__}: {e})"
        if all(right):
            return "all"
        return f"half: {sum(right)} of {self.NAMES} names bound"

    def check(self) -> str | None:
        bound = self._state()
        if bound not in ("none", "all"):
            return f"the cell bound {bound}"
        self.work()
        if self._state() != "all":
            return f"the next cell bound {self._state()}"
        return None


def run_kind(kind: str, trials: int, rng: random.Random, log) -> dict:
    threads0, arrays0 = pw_threads(), len(jax.live_arrays())
    ip = None
    if kind == "cell":
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "pwkernel")
        ip.run_cell("import jax, numpy as np, jax.numpy as jnp, pwkernel as pw")
        w = Cell(ip)
        from pwkernel.notebook import extension
        ctl = extension.state().ctl
    else:
        ctl = pw.Controller(islands=(4, 4))
        w = Chain(ctl) if kind == "chain" else Train(ctl, kind)
    w.work()  # (compiled)
    t0 = time.perf_counter()
    w.work()  # (how long one takes uninterrupted)
    span = time.perf_counter() - t0
    running = pw_threads()
    stats = {"trials": 0, "interrupted": 0, "failures": []}
    for i in range(trials):
        # half anywhere in the workload, half near its end (a cell's binding, a last step)
        low, high = (0.0, 1.2) if i % 2 == 0 else (0.8, 1.05)
        delay = rng.uniform(span * low, span * high)
        how = rng.choice(["kill", "interrupt_main"])
        faulthandler.dump_traceback_later(HANG_S, exit=True)
        hit = trial(w.work, delay, how)
        problem = None
        try:
            if not ctl.wait(HANG_S / 3):
                problem = f"runs not drained: {ctl.runs()}"
            else:
                problem = w.check()
            if problem is None and not ctl.wait(HANG_S / 3):
                problem = f"runs not drained after the next call: {ctl.runs()}"
            if problem is None and ctl.runs():
                problem = f"ctl.runs() not empty: {ctl.runs()}"
            if problem is None and running - pw_threads():
                problem = f"runtime threads ended: {sorted(running - pw_threads())}"
        except KeyboardInterrupt:
            problem = "a kept interrupt came during the checks"
        except Exception as e:  # noqa: BLE001
            problem = f"{type(e).__name__}: {e}"
        faulthandler.cancel_dump_traceback_later()
        if problem and LAST.get("where"):
            log(LAST["where"])
        LAST.clear()
        stats["trials"] += 1
        stats["interrupted"] += hit
        if problem:
            stats["failures"].append((i, round(delay, 4), how, problem))
            log(f"  {kind} trial {i} delay {delay:.4f}s {how}: {problem}")
    if ip is not None:
        ip.run_line_magic("unload_ext", "pwkernel")
        from tests.helpers.shell import forget_futures
        forget_futures(ip)
    else:
        ctl.close()
    del w
    import gc
    gc.collect()
    left = len(jax.live_arrays()) - arrays0
    if left > 0 or pw_threads() - threads0:
        stats["failures"].append(("close", left, sorted(pw_threads() - threads0)))
        log(f"  {kind}: after close {left} live arrays, threads {pw_threads() - threads0}")
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="train,pipe,chain,cell")
    args = p.parse_args(argv)
    faulthandler.enable()
    rng = random.Random(args.seed)
    failed = 0
    for kind in args.only.split(","):
        stats = run_kind(kind, args.trials, rng, lambda s: print(s, flush=True))
        failed += len(stats["failures"])
        print(f"{kind}: {stats['trials']} trials, {stats['interrupted']} interrupted, "
              f"{len(stats['failures'])} failures", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

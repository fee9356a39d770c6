"""Where a training step's host time goes, sampled at full speed: ``bench train --quick``'s
SPMD step (83 state leaves, Adam) in a loop for py-spy to sample, and a report of its samples.

    py-spy record -r 500 --nonblocking -f raw --threads -o /tmp/spy.txt -- \\
        .venv/bin/python bench/spy_train.py loop --seconds 20          # prints its step count
    .venv/bin/python bench/spy_train.py report /tmp/spy.txt --steps 2250
    ... loop --way jax                                                  # plain jax.jit's loop

A tracing profiler (yappi, cProfile) slows the host several-fold, so the host falls behind the
devices and the profile shows work that at full speed does not happen (outputs resolved before
the next step donates them, then freed one by one). A sampling profiler leaves the loop at its
speed. ``report`` keeps the samples taken inside the timed loop (the main thread's, under
``sampled``) and every sample of the runtime's other Python threads, and prints, in
microseconds per step: each thread's share, and the main thread's time by function
(inclusive), less JAX's own dispatch (``Compiled.__call__``, which ``jax.jit`` pays too) and
waiting (``--keep-waits`` keeps them). One sample is ``1e6 / rate / steps`` us per step.
``py-spy`` is in the ``dev`` extra.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time

_FRAME = re.compile(r"(?P<fn>.*) \((?P<file>.*?):(?P<line>\d+)\)$")
_WAITS = ("Condition.wait", "Event.wait", "block_until_ready (jax")
_LOOP = "sampled ("  # the timed loop's frame


def loop(way: str, seconds: float, batch: int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import optax

    import pwkernel as pw
    from pwkernel.bench.train import CONFIGS, LR, Trainer, jax_trainer
    from pwkernel.train import SPMD
    from pwkernel.train import transformer as T

    model, k = CONFIGS["quick"]["model"], 8
    with pw.Controller(islands=(4, 4)) as ctl:
        spmd = SPMD(T.split(model, 2), ctl.slice(4, island=0), loss=T.cross_entropy,
                    optimizer=optax.adam(LR), name="spmd")
        data, tokens = T.batch(model, batch, seed=0), batch * model.seq
        trainer = (Trainer(spmd.step, spmd.init(0), spmd.place(data), k, tokens)
                   if way == "pw" else jax_trainer(spmd, spmd.init(0), data, k, tokens))
        for _ in range(3):  # (compiling, warming up: outside the loop the report reads)
            trainer.once()
        steps, wall, cpu = sampled(trainer, seconds)
        del trainer
    print(f"{way}: {steps} steps, {1e3 * wall / steps:.3f} ms a step, "
          f"{1e3 * cpu / steps:.3f} ms of process CPU a step")


def sampled(trainer, seconds: float) -> tuple[int, float, float]:
    """The loop ``report`` reads: rounds of the trainer's steps for ``seconds``; its steps,
    wall and process CPU seconds."""
    rounds, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        trainer.once()
        rounds += 1
    return rounds * trainer.steps, time.perf_counter() - t0, time.process_time() - c0


def _name(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return frame
    return f"{m['fn']} ({m['file'].split('site-packages/')[-1].split('/pwkernel/')[-1]})"


def report(raw: str, steps: int, rate: float, keep_waits: bool, top: int) -> dict:
    """The samples of ``raw`` (py-spy's ``-f raw`` output) as microseconds per step."""
    per = 1e6 / rate / steps
    threads: collections.Counter = collections.Counter()
    main: collections.Counter = collections.Counter()
    main_total = 0
    with open(raw) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n, frames = int(count), stack.split(";")
            thread, frames = frames[0], frames[1:]
            is_main = "MainThread" in thread
            if is_main and not any(fr.startswith(_LOOP) for fr in frames):
                continue  # (start-up, compiling, closing)
            threads[thread.partition(": ")[2] or thread] += n
            if not is_main:
                continue
            if not keep_waits and any(fr.startswith(w) for fr in frames for w in _WAITS):
                continue
            if not keep_waits and any(fr.startswith("Compiled.__call__") for fr in frames):
                continue
            main_total += n
            inner = frames[next(i for i, fr in enumerate(frames) if fr.startswith(_LOOP)) + 1:]
            for name in dict.fromkeys(_name(fr) for fr in inner):
                main[name] += n
    out = {"us_per_sample_step": round(per, 3),
           "thread_samples_us_per_step": {t: round(n * per, 1) for t, n in threads.most_common()},
           "main_thread_us_per_step": round(main_total * per, 1),
           "main_thread_by_function": {k: round(n * per, 1) for k, n in main.most_common(top)}}
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("loop", help="the training loop to sample")
    lp.add_argument("--way", choices=("pw", "jax"), default="pw")
    lp.add_argument("--seconds", type=float, default=20.0)
    lp.add_argument("--batch", type=int, default=4)
    rp = sub.add_parser("report", help="a py-spy raw file as microseconds per step")
    rp.add_argument("raw")
    rp.add_argument("--steps", type=int, required=True, help="what the loop printed")
    rp.add_argument("--rate", type=float, default=500.0, help="py-spy's -r")
    rp.add_argument("--keep-waits", action="store_true")
    rp.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    if args.cmd == "loop":
        if args.seconds <= 0 or args.batch < 1:
            ap.error("--seconds must be above 0 and --batch at least 1")
        loop(args.way, args.seconds, args.batch)
        return
    if args.steps < 1 or args.rate <= 0:
        ap.error("--steps must be at least 1 and --rate above 0")
    import json
    print(json.dumps(report(args.raw, args.steps, args.rate, args.keep_waits, args.top),
                     indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

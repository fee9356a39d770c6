"""This checkout's runtime against another checkout's, in one process, with bare JAX beside
them: the host-cost figures of a change, paired round by round.

    .venv/bin/python bench/ab.py --base /tmp/old                  # every workload
    .venv/bin/python bench/ab.py --base /tmp/old train --rounds 11

``--base`` is another checkout (a ``git worktree add /tmp/old <rev>``); its ``pwkernel``
package is copied to a temporary folder and imported as ``pwkernel_base`` (the runtime's
imports are relative), so both run on the same 8 virtual CPU devices, in the same process,
one round after the other. On a shared 2-core machine the speed of the whole machine drifts by
tens of percent between runs a minute apart; rounds alternated inside one process see the same
drift, and the figures printed are medians of per-round values:

- ``cpu``: process CPU (every thread) per computation, OpByOp and Chained (64 tiny steps on a
  1-device slice, as ``bench dispatch``'s ``cpu_us_per_node_*``), and each over bare JAX's own
  per call in the same round (``cpu_*_vs_jax_call``);
- ``leaf``: an 83-leaf state donated from step to step (``bench/leaf_step.py``'s step), wall
  per step over JAX's, and the extra CPU per step;
- ``leaf1``: the same on a 1-device slice, where a step's outputs are ready when its call
  returns and no watcher thread sees its end: the runtime's own Python per leaf, with the
  least of XLA's threads around it;
- ``steps``: the ``steps`` sweep's matmul step at 1 ms on a 4-device slice (what
  ``chained_vs_jax_at_1ms`` and ``opbyop_vs_jax_at_1ms`` read), wall ratio to JAX for OpByOp
  and Chained;
- ``train``: ``pw.train.SPMD``'s step of ``bench train --quick``'s model at batch 4 (about
  8 ms under JAX here), 8 steps a round, wall ratio to JAX and extra CPU per step; skipped if
  the base has no ``pw.train``.

For ``leaf``, ``leaf1`` and ``train`` the extra CPU per step is also given for the calling
thread alone (``*_extra_thread_cpu_us_per_step``): the user's thread, where a 1-device step's
runtime work happens, without the other threads' share (XLA's spin, the watcher), and so with
less noise between rounds.

Printed as JSON. Each figure compares code in one process only: the absolute numbers are this
machine's at this minute.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from pwkernel.bench import dispatch  # noqa: E402
from pwkernel.bench.dispatch_steps import CALLS, Slice, chains, matmul_step  # noqa: E402

WORKLOADS = ("cpu", "leaf", "leaf1", "train", "steps")


def load_base(checkout: Path, into: Path):
    """``checkout``'s ``pwkernel`` imported as ``pwkernel_base`` (its bench is left out: it
    imports ``pwkernel`` by name)."""
    src = checkout / "pwkernel"
    if not (src / "__init__.py").is_file():
        raise SystemExit(f"--base {checkout}: no pwkernel package there; give a checkout "
                         "(e.g. git worktree add /tmp/old <rev>).")
    shutil.copytree(src, into / "pwkernel_base",
                    ignore=shutil.ignore_patterns("bench", "labextension", "__pycache__"))
    sys.path.insert(0, str(into))
    return importlib.import_module("pwkernel_base")


def cpu_workload(pw, ctl, n: int = 64) -> dict:
    """OpByOp, Chained (``pw``'s) and JAX OpByOp: ``n`` tiny steps (``bench dispatch``'s) on a
    1-device slice."""
    vs = ctl.slice(1, island=0)
    x0 = jax.device_put(np.linspace(-1, 1, 256, dtype=np.float32), vs.devices[0])
    f = pw.function(dispatch.step, slice=vs, name="step")
    return chains(f, jax.jit(dispatch.step), x0, n, program=pw.program)


def _leaves_step(state):
    return jax.tree_util.tree_map(lambda x: x * 0.9 + 0.1, state)


def leaf_workload(pw, ctl, leaves: int = 83, steps: int = 100, devices: int = 4):
    s = ctl.slice(devices, island=0)
    step = pw.function(_leaves_step, slice=s, donate_argnums=0, name="step")
    copy = pw.function(lambda x: x * 1, slice=s)
    box = [[copy(np.full(16, i, np.float32)) for i in range(leaves)]]

    def run():
        for _ in range(steps):
            box[0] = step(box[0])
        jax.block_until_ready([f.result() for f in box[0]])
    return run


def jax_leaf(leaves: int = 83, steps: int = 100, devices: int = 4):
    sharding = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("d",)), P())
    step = jax.jit(_leaves_step, donate_argnums=0)
    box = [[jax.device_put(np.full(16, i, np.float32), sharding) for i in range(leaves)]]

    def run():
        for _ in range(steps):
            box[0] = step(box[0])
        jax.block_until_ready(box[0])
    return run


_MODEL = (128, 64, 4, 4, 32)  # bench train --quick's (vocab, width, heads, layers, seq)


def train_workload(pw, ctl, module: str, steps: int = 8, size: int = 4):
    T = importlib.import_module(f"{module}.train.transformer")
    S = importlib.import_module(f"{module}.train.spmd")
    fetch = importlib.import_module(f"{module}.train.state").fetch
    model = T.Config(*_MODEL)
    spmd = S.SPMD(T.split(model, 2), ctl.slice(4, island=0), loss=T.cross_entropy,
                  optimizer=optax.adam(1e-3))
    batch = spmd.place(T.batch(model, size, seed=0))
    box = [spmd.init(0)]

    def run():
        loss = None
        for _ in range(steps):
            box[0], loss = spmd.step(box[0], batch)
        jax.block_until_ready(fetch((box[0], loss)))
    return run, spmd, T, S, fetch


def jax_train(spmd, T, S, fetch, steps: int = 8, size: int = 4):
    mesh = spmd.slice.mesh
    rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P(mesh.axis_names[0]))
    step = S.train_step(spmd.stages, spmd.loss, spmd.optimizer)
    box = [jax.device_put(fetch(spmd.init(0)), rep)]
    x, y = (jax.device_put(a, data) for a in T.batch(T.Config(*_MODEL), size, seed=0))
    with jax.set_mesh(mesh):
        compiled = jax.jit(step, in_shardings=(rep, data, data), out_shardings=rep,
                           donate_argnums=(0,)).lower(box[0], x, y).compile()

    def run():
        loss = None
        for _ in range(steps):
            box[0], loss = compiled(box[0], x, y)
        jax.block_until_ready((box[0], loss))
    return run


def steps_workload(versions: dict, ctls: dict, ms: float = 1.0, devices: int = 4):
    """``bench dispatch``'s ``steps`` sweep at one point: its matmul step at about ``ms`` under
    JAX on ``devices`` devices; JAX, and each version's OpByOp and Chained, ``CALLS`` steps a
    call."""
    sl = Slice(next(iter(ctls.values())), devices)
    batch, _ = sl.calibrate(ms / 1e3, 128 * ms, 4, 5)
    runs = {}
    for k, (pw, _) in versions.items():
        s = ctls[k].slice(devices, island=0)
        f = pw.function(matmul_step, slice=s, in_specs=(P("x"), P()), out_specs=P("x"))
        ways = chains(f, sl.jax_step, sl.x0(batch), CALLS, sl.w, program=pw.program)
        runs.setdefault("jax", ways["jax_opbyop"])
        runs[f"{k}_opbyop"], runs[f"{k}_chained"] = ways["pw_opbyop"], ways["pw_chained"]
    return runs, CALLS


def alternate(runs: dict, rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    """Each callable once per round, in turn, the order reversed every other round (what
    runs just before a call, its threads winding down, weighs on every side alike):
    (wall, process CPU, the calling thread's CPU) seconds of each call."""
    for fn in runs.values():  # compiled, planned, warm
        fn()
        fn()
    seen: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
    order = list(runs.items())
    for r in range(rounds):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
            fn()
            seen[name].append((time.perf_counter() - w, time.process_time() - c,
                               time.thread_time() - t))
    return seen


def _median(values) -> float:
    return statistics.median(list(values))


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--base", type=Path, required=True, help="another checkout to compare")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    import pwkernel as new
    tmp = Path(tempfile.mkdtemp(prefix="pw-ab-"))
    try:
        base = load_base(args.base.resolve(), tmp)
        versions = {"base": (base, "pwkernel_base"), "this": (new, "pwkernel")}
        ctls = {k: pw.Controller(islands=(4, 4)) for k, (pw, _) in versions.items()}
        out: dict = {"base": str(args.base), "rounds": args.rounds}
        try:
            for work in args.workloads or WORKLOADS:
                out[work] = _workload(work, versions, ctls, args.rounds)
        finally:
            for ctl in ctls.values():
                ctl.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _walls(seen: dict, steps: int, sides: list[str]) -> dict:
    """Each run's median wall time per step, and each side's paired ratio to JAX's."""
    res = {f"{k}_wall_us_per_step": round(_median(w for w, _, _ in v) / steps * 1e6, 1)
           for k, v in seen.items()}
    for k in sides:
        res[f"{k}_vs_jax_wall"] = round(_median(
            j[0] / a[0] for a, j in zip(seen[k], seen["jax"], strict=True)), 3)
    return res


def _workload(work: str, versions: dict, ctls: dict, rounds: int) -> dict:
    if work == "steps":
        runs, n = steps_workload(versions, ctls)
        seen = alternate(runs, rounds)
        return _walls(seen, n, [k for k in runs if k != "jax"])
    if work == "cpu":
        n, runs = 64, {}
        for k, (pw, _) in versions.items():
            ways = cpu_workload(pw, ctls[k], n)
            runs.setdefault("jax", ways["jax_opbyop"])
            runs[f"{k}_opbyop"], runs[f"{k}_chained"] = ways["pw_opbyop"], ways["pw_chained"]
        seen = alternate(runs, rounds)
        per = {k: [c / n * 1e6 for _, c, _ in v] for k, v in seen.items()}
        res = {f"cpu_us_per_node_{k}": round(_median(v), 2) for k, v in per.items()}
        for k in versions:
            for mode in ("opbyop", "chained"):
                res[f"cpu_{mode}_vs_jax_call_{k}"] = round(_median(
                    a / j for a, j in zip(per[f"{k}_{mode}"], per["jax"], strict=True)), 3)
        return res
    if work in ("leaf", "leaf1"):
        steps, devices = 100, 1 if work == "leaf1" else 4
        runs = {"jax": jax_leaf(steps=steps, devices=devices)}
        runs.update({k: leaf_workload(pw, ctls[k], steps=steps, devices=devices)
                     for k, (pw, _) in versions.items()})
    else:
        missing = [k for k, (_, mod) in versions.items()
                   if importlib.util.find_spec(f"{mod}.train") is None]
        if missing:
            return {"skipped": f"no pw.train in {', '.join(missing)}"}
        steps, runs = 8, {}
        for k, (pw, mod) in versions.items():
            runs[k], spmd, T, S, fetch = train_workload(pw, ctls[k], mod, steps)
        runs = {"jax": jax_train(spmd, T, S, fetch, steps), **runs}
    seen = alternate(runs, rounds)
    res = _walls(seen, steps, list(versions))
    for k in versions:
        res[f"{k}_extra_cpu_us_per_step"] = round(_median(
            (a[1] - j[1]) / steps * 1e6 for a, j in zip(seen[k], seen["jax"], strict=True)), 1)
        res[f"{k}_extra_thread_cpu_us_per_step"] = round(_median(
            (a[2] - j[2]) / steps * 1e6 for a, j in zip(seen[k], seen["jax"], strict=True)), 1)
    return res


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))

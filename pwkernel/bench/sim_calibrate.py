"""Measure this machine's runtime for the ``this-machine`` preset.

``python -m pwkernel.bench.sim_calibrate [--out PATH] [--compare MODE] [--json PATH]``

Runs the local runtime (``pw.Controller(islands=(4, 4))`` on 8 virtual CPU devices) and JAX
itself, measures the costs the simulator's cluster model needs, and writes them (the keys of
``CALIBRATION_KEYS`` plus ``client_per_program`` and ``jax_dispatch``) to the file
``Cluster.preset("this-machine")`` reads (``$PWKERNEL_SIM_CALIBRATION`` or
``~/.cache/pwkernel/sim-calibration.json``). ``--compare`` then runs the local benchmarks and
the simulator's predictions of them side by side (``sim_validate.py``).

What is measured, and how (medians of a few repeats; every figure is this machine's):

- ``client_per_node``, ``fanout_per_host``: submitting a traced chain of tiny computations,
  per node, on slices of 1, 2 and 4 devices, fit as ``a + b x devices`` (each virtual device
  is a "host" of one chip here, so ``b`` is the per-host fan-out). ``parallel`` dispatch
  launches on the submitting thread, so this includes the launch, and ``host_per_node`` is 0
  (there is no separate host executor here);
- ``jax_dispatch``: one jitted call of the same computation, dispatched in a loop (the
  multi-controller JAX model's per-call cost);
- ``client_per_program``: OpByOp submission per call less the chain's per node (4 devices);
- ``rpc_latency``: a third of what ``sequential`` dispatch adds per node of a chain (the end
  heard, the node submitted, launched: three hand-offs between threads);
- ``peak_flops``, ``memory_bandwidth``, ``launch_overhead``: XLA's own flops and bytes
  accessed (the figures the simulator's roofline divides) of a matrix product and of an
  elementwise computation over their measured time, on one device alone, at the benchmarks'
  largest size (4 Mi elements, past the caches); the launch overhead is a ``fori_loop`` step
  of a tiny computation.
  The 8 virtual devices share this machine's ``cores`` (recorded too): ``sim_validate``
  stretches a computation on d devices by d / cores when d is larger;
- ``ici_bandwidth``, ``ici_latency``, ``dcn_bandwidth``: copies between devices (islands here
  are in one process, so DCN is the same copy); ``host_to_device``: ``device_put`` from NumPy.

The layout is the local controller's: two islands of 4 devices, each device its own host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ..backends.sim.errors import SimError
from .dispatch import step  # the dispatch benchmark's computation: measured as it predicts

DEFAULT_PATH = Path.home() / ".cache/pwkernel/sim-calibration.json"
EXTRA_KEYS = ("client_per_program", "jax_dispatch")


def calibration_path(path: str | Path | None = None) -> Path:
    """Where ``this-machine`` reads its parameters."""
    if path is not None:
        return Path(path)
    return Path(os.environ.get("PWKERNEL_SIM_CALIBRATION", DEFAULT_PATH))


def _median_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The median of ``repeats`` timed calls after a warm one."""
    fn()  # warm: compilation, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(repeats: int = 5, n: int = 64) -> dict:
    """Measure this machine (needs JAX with 8 CPU devices). Returns the calibration dict."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pwkernel as pw

    if len(jax.devices()) < 8:
        raise SimError(f"calibration needs 8 JAX devices, found {len(jax.devices())}. Maybe "
                       "you want to run it as `python -m pwkernel.bench.sim_calibrate` (it "
                       "sets jax_num_cpu_devices=8 before JAX starts).")
    ctl = pw.Controller(islands=(4, 4))
    try:
        vs = ctl.slice(4, island=0)
        spec = P("x")
        sh = NamedSharding(vs.mesh, spec)
        tiny = jax.device_put(np.ones(256, np.float32), sh)

        jstep = jax.jit(step, in_shardings=sh, out_shardings=sh)
        per_node = {}
        for d in (1, 2, 4):  # a node's cost grows with its devices: a + b x devices
            per_node[d], op_node, parallel, sequential = _dispatch_costs(ctl, d, n, repeats)
        fanout = _slope(per_node)
        client_per_node = max(0.0, statistics.mean(per_node.values())
                              - fanout * statistics.mean(per_node))
        client_per_program = max(0.0, op_node - per_node[4])
        rpc = max(0.0, (sequential - parallel) / n / 3)

        def jax_loop():
            x = tiny
            for _ in range(n):
                x = jstep(x)
            x.block_until_ready()

        jax_dispatch = _median_seconds(jax_loop, repeats) / n

        # device speed: one device alone (sim_validate shares the cores between devices)
        width = 1
        vs = ctl.slice(width, island=0)
        sh = NamedSharding(vs.mesh, spec)
        side = 512
        rep = NamedSharding(vs.mesh, P())
        a = jax.device_put(np.ones((width * side, side), np.float32), sh)
        w = jax.device_put(np.ones((side, side), np.float32), rep)
        mm = jax.jit(lambda x, w: x @ w, in_shardings=(sh, rep), out_shardings=sh)
        mm_s = _median_seconds(lambda: mm(a, w).block_until_ready(), repeats)
        peak_flops = _xla(lambda x, w: x @ w, (a, w), width, (spec, P())).flops / mm_s
        big = jax.device_put(np.ones(width << 22, np.float32), sh)
        ew = jax.jit(step, in_shardings=sh, out_shardings=sh)
        ew_s = _median_seconds(lambda: ew(big).block_until_ready(), repeats)
        memory_bandwidth = _xla(step, (big,), width, (spec,)).bytes_accessed / ew_s
        loop = jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda i, v: step(v), x),
                       in_shardings=sh, out_shardings=sh)
        tiny = jax.device_put(np.ones(256, np.float32), sh)
        launch = _median_seconds(lambda: loop(tiny).block_until_ready(), repeats) / n

        # copies between devices and from the host
        d0, d1 = jax.devices()[0], jax.devices()[1]
        nbytes = 1 << 26
        src = jax.device_put(np.ones(nbytes // 4, np.float32), d0)
        copy_s = _median_seconds(lambda: jax.device_put(src, d1).block_until_ready(), repeats)
        small = jax.device_put(np.ones(1, np.float32), d0)
        ici_latency = _median_seconds(lambda: jax.device_put(small, d1).block_until_ready(),
                                      repeats)
        host = np.ones(nbytes // 4, np.float32)
        h2d_s = _median_seconds(lambda: jax.device_put(host, d0).block_until_ready(), repeats)
    finally:
        ctl.close()
    copy_bw = nbytes / max(copy_s - ici_latency, 1e-9)
    return {
        "islands": [4, 4], "chips_per_host": 1, "fanout_per_host": fanout,
        "peak_flops": peak_flops, "hbm_bytes": _memory_per_device(),
        "memory_bandwidth": memory_bandwidth, "launch_overhead": launch,
        "ici_bandwidth": copy_bw, "ici_latency": ici_latency,
        "dcn_bandwidth": copy_bw, "dcn_latency": ici_latency,
        "client_per_node": client_per_node, "rpc_latency": rpc,
        "host_per_node": 0.0, "host_to_device": nbytes / h2d_s,
        "client_per_program": client_per_program, "jax_dispatch": jax_dispatch,
        "measured": {"time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                     "loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count(),
                     "per_node_by_devices_s": per_node, "opbyop_per_node_s": op_node,
                     "chain_parallel_s": parallel, "chain_sequential_s": sequential,
                     "chain": n},
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
    }


def _dispatch_costs(ctl, devices: int, n: int, repeats: int) -> tuple:
    """On a slice of ``devices``: submitting a traced chain of ``n`` tiny steps, per node;
    submitting them OpByOp, per call; a chain's end-to-end time, parallel and sequential."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pwkernel as pw

    vs = ctl.slice(devices, island=0)
    x0 = jax.device_put(np.ones(256, np.float32), NamedSharding(vs.mesh, P("x")))
    f = pw.function(step, slice=vs, in_specs=P("x"), out_specs=P("x"), name=f"cal{devices}")

    @pw.program(name=f"cal-chain{devices}")
    def chain(x):
        for _ in range(n):
            x = f(x)
        return x

    def opbyop():
        x = x0
        for _ in range(n):
            x = f(x)
        return x

    def submit_seconds(make) -> float:
        t0 = time.perf_counter()
        out = make()
        t = time.perf_counter() - t0
        out.result().block_until_ready()
        return t

    submit_seconds(lambda: chain(x0))  # compile and trace once
    submit_seconds(opbyop)
    chain_s = statistics.median(submit_seconds(lambda: chain(x0)) for _ in range(repeats))
    op_s = statistics.median(submit_seconds(opbyop) for _ in range(repeats))
    parallel = _median_seconds(lambda: chain(x0).result().block_until_ready(), repeats)
    ctl.dispatch = "sequential"
    try:
        sequential = _median_seconds(lambda: chain(x0).result().block_until_ready(), repeats)
    finally:
        ctl.dispatch = "parallel"
    return chain_s / n, op_s / n, parallel, sequential


def _xla(fn, args, width: int, specs):
    """XLA's own per-chip accounting of ``fn`` (what the simulator's roofline divides by the
    calibrated rates, so the rates are measured in the same units)."""
    import jax

    from ..backends.sim.cost import abstract_mesh, analyze, lower

    mesh = abstract_mesh((width,), ("x",))
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    return analyze(lower(fn, structs, mesh, specs), mesh)


def _slope(points: dict[int, float]) -> float:
    """Least-squares slope of y over x, at least 0."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.mean(xs), statistics.mean(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return max(0.0, num / sum((x - mx) ** 2 for x in xs))


def _memory_per_device() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 8
    except (ValueError, OSError, AttributeError):
        return 1e9


def write(data: dict, path: str | Path | None = None) -> Path:
    """Write a calibration where ``Cluster.preset("this-machine")`` reads it."""
    out = calibration_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    parser = argparse.ArgumentParser(prog="python -m pwkernel.bench.sim_calibrate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help=f"where to write (default {calibration_path()})")
    parser.add_argument("--compare", choices=("tiny", "quick", "full"),
                        help="then run the local benchmarks in this mode beside the "
                             "simulator's predictions of them")
    parser.add_argument("--json", help="write the comparison here (with --compare)")
    args = parser.parse_args(argv)
    data = measure()
    path = write(data, args.out)
    print(f"wrote {path}")
    for k, v in data.items():
        if k != "measured":
            print(f"  {k:<20} {v}")
    if args.compare:
        from . import sim_validate

        rows = sim_validate.compare(data, args.compare)
        print(sim_validate.table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps({"calibration": data, "rows": rows},
                                                  indent=2, default=str))
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

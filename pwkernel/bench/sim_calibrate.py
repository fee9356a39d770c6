"""Measure this machine's runtime for the ``this-machine`` preset.

``python -m pwkernel.bench.sim_calibrate [--out PATH] [--compare MODE] [--json PATH]``

Runs the local runtime (``pw.Controller(islands=(4, 4))`` on 8 virtual CPU devices) and JAX
itself, measures the costs the simulator's cluster model needs, and writes them (the keys of
``CALIBRATION_KEYS`` and ``EXTRA_KEYS``, with the raw timings under ``measured``) to the file
``Cluster.preset("this-machine")`` reads (``$PWKERNEL_SIM_CALIBRATION`` or
``~/.cache/pwkernel/sim-calibration.json``). ``--compare`` then runs the local benchmarks and
the simulator's predictions of them side by side (``sim_validate.py``).

What is measured, and how (medians of 7 repeats; where a figure is the difference of two
timings, they run in interleaved rounds and the difference is taken within a round; every
figure is this machine's):

- ``client_per_node``, ``fanout_per_host``: a traced chain of 64 tiny steps, end to end, per
  node, on slices of 1, 2 and 4 devices (``measured.per_node_by_devices_s``), fit as
  ``a + b x devices`` on relative error (each virtual device is a "host" of one chip here).
  Launches run on the submitting thread, so this includes them: ``host_per_node`` is 0;
- ``client_per_program``, ``program_fanout_per_host``: the same steps OpByOp (each its own
  program) beyond the chain, per call, likewise by slice size and fit;
- ``rpc_latency``: a third of what ``sequential`` dispatch adds per node of the chain on 4
  devices (the end heard, the node submitted, launched: three hand-offs);
- ``measured.per_node_async_1_device_s``: on one device only the tiny step (up to
  ``inline_output_bytes`` of output) ends inside its launch; a chain of 32 Ki element steps,
  beyond their ``fori_loop``, per node, is the cost when the end comes back through another
  thread (on 2 and 4 devices every launch waits for its computation);
- ``jax_dispatch``: one jitted call of the same step in a loop (multi-controller JAX);
- ``peak_flops``: XLA's flops of a 512 x 512 matrix product over its time on one device;
  ``memory_bandwidth``: XLA's bytes accessed by the dispatch benchmark's step over 2 Mi
  elements (past the caches, no benchmark row's size) over one step of a ``fori_loop`` on
  one device; ``launch_overhead``: a ``fori_loop`` step of a tiny computation;
- ``matmul_rates``: by matrix size (128 to 1024), XLA's flops of one product, the FLOP/s
  of one device alone and its parallelism at 4 devices, from ``fori_loop`` steps;
- ``compute_parallelism``, ``memory_parallelism``: how many devices' worth of one device's
  speed the machine gives when 4 devices each run the same matrix product, or the same loop
  of steps, at once (the 8 virtual devices share this machine's ``cores``: one device alone
  already uses more than one, and devices running at once contend);
  ``fresh_output_s_per_byte``: what a chain of jitted calls of the step costs beyond the
  loop's steps on one device, per byte of each call's output of ``fresh_output_bytes`` (8
  MiB: buffers that large get new pages from the system on every call);
- ``dcn_latency`` (and ``ici_latency``): a transfer's whole cost as the runtime makes it, the
  time a traced chain alternating between 2-device slices of the two islands takes beyond
  the same chain on one slice, per transfer; ``dcn_bandwidth`` (and ``ici_bandwidth``):
  ``jax.device_put`` of 64 MiB onto the other island's sharding, never aliased (the
  runtime's call), per device; ``host_to_device``: the same from NumPy.

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
EXTRA_KEYS = ("fanout_per_host", "dcn_latency", "client_per_program",
              "program_fanout_per_host", "jax_dispatch", "compute_parallelism",
              "memory_parallelism", "fresh_output_s_per_byte", "cores")


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


def _rounds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each call in ``repeats`` interleaved rounds (after a warm one), so that a
    difference between two of them is taken within a round, seconds apart."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for k in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def _median_gap(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s time less ``b``'s."""
    return statistics.median(x - y for x, y in zip(times[a], times[b], strict=True))


def measure(repeats: int = 7, n: int = 64) -> dict:
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
        per_node, per_program = {}, {}
        for d in (1, 2, 4):  # a node's cost grows with its devices: a + b x devices
            per_node[d], program, sequential = _dispatch_costs(ctl, d, n, repeats)
            per_program[d] = max(0.0, program)
        client_per_node, fanout = fit_line(per_node)
        client_per_program, program_fanout = fit_line(per_program)
        rpc = max(0.0, sequential / 3)  # on 4 devices, the last measured
        transfer = _transfer_costs(ctl, repeats, n)
        per_node_async = _async_launch(ctl, n, repeats)

        def jax_loop():
            x = tiny
            for _ in range(n):
                x = jstep(x)
            x.block_until_ready()

        jax_dispatch = _median_seconds(jax_loop, repeats) / n

        # device speed: one device alone, then how many devices keep that speed at once
        rates = _device_rates(ctl, repeats)
        matmuls = _matmul_rates(ctl, repeats)
    finally:
        ctl.close()
    return {
        "islands": [4, 4], "chips_per_host": 1, "fanout_per_host": fanout,
        "peak_flops": rates["peak_flops"], "hbm_bytes": _memory_per_device(),
        "memory_bandwidth": rates["memory_bandwidth"], "launch_overhead": rates["launch"],
        "ici_bandwidth": transfer["bandwidth"], "ici_latency": transfer["latency"],
        "dcn_bandwidth": transfer["bandwidth"], "dcn_latency": transfer["latency"],
        "client_per_node": client_per_node, "rpc_latency": rpc,
        "host_per_node": 0.0, "host_to_device": transfer["host_to_device"],
        "client_per_program": client_per_program, "program_fanout_per_host": program_fanout,
        "jax_dispatch": jax_dispatch,
        "compute_parallelism": rates["compute_parallelism"],
        "memory_parallelism": rates["memory_parallelism"],
        "matmul_rates": matmuls,
        "fresh_output_s_per_byte": rates["fresh_output_s_per_byte"],
        "fresh_output_bytes": rates["fresh_output_bytes"],
        "inline_output_bytes": 4 * 256,
        "measured": {"time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                     "loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count(),
                     "per_node_by_devices_s": per_node,
                     "per_program_by_devices_s": per_program,
                     "per_node_async_1_device_s": per_node_async,
                     "sequential_extra_per_node_s": sequential,
                     "chain": n, "device_seconds": rates["seconds"],
                     "transfer_s": transfer["seconds"]},
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
    }


def _dispatch_costs(ctl, devices: int, n: int, repeats: int) -> tuple:
    """On a slice of ``devices``, a traced chain of ``n`` tiny steps end to end, per node;
    what running them OpByOp (each its own program) adds per call; what ``sequential``
    dispatch adds per node (rounds interleaved, differences taken within a round)."""
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

    def end_to_end(make, mode: str = "parallel") -> Callable[[], object]:
        def run() -> None:
            ctl.dispatch = mode
            try:
                make().result().block_until_ready()
            finally:
                ctl.dispatch = "parallel"
        return run

    times = _rounds({"chain": end_to_end(lambda: chain(x0)), "opbyop": end_to_end(opbyop),
                     "sequential": end_to_end(lambda: chain(x0), "sequential")}, repeats)
    return (statistics.median(times["chain"]) / n, _median_gap(times, "opbyop", "chain") / n,
            _median_gap(times, "sequential", "chain") / n)


def _async_launch(ctl, n: int, repeats: int, size: int = 1 << 15) -> float:
    """On one device, the tiny step's output is ready when its launch returns (XLA runs it
    inline) and the runtime sees its end on the launching thread; a larger one (``size``
    elements, no benchmark row's size) runs asynchronously and its end comes back through
    another thread. Its per-node cost beyond its own device time: a traced chain of ``n``
    such steps against a ``fori_loop`` of them, within interleaved rounds."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pwkernel as pw

    vs = ctl.slice(1, island=0)
    sh = NamedSharding(vs.mesh, P("x"))
    x0 = jax.device_put(np.ones(size, np.float32), sh)
    f = pw.function(step, slice=vs, in_specs=P("x"), out_specs=P("x"), name="cal-async")
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, n, lambda i, v: step(v), x),
                   in_shardings=sh, out_shardings=sh)

    @pw.program(name="cal-async-chain")
    def chain(x):
        for _ in range(n):
            x = f(x)
        return x

    times = _rounds({"chain": lambda: chain(x0).result().block_until_ready(),
                     "loop": lambda: loop(x0).block_until_ready()}, repeats)
    return max(0.0, _median_gap(times, "chain", "loop") / n)


def _device_rates(ctl, repeats: int, side: int = 512, elements: int = 1 << 21,
                  wide: int = 4) -> dict:
    """The roofline's rates on one device alone: a matrix product, and the dispatch
    benchmark's step as one step of a ``fori_loop`` (the device's own speed, past the caches,
    at a size no benchmark row uses); what a step launched on its own costs beyond that, per
    byte of its output (``fresh_output_s_per_byte``, for outputs of ``fresh_output_bytes``: a
    chain of such calls writes every output into new pages); and how many devices' worth
    of that speed the machine gives when ``wide`` devices each do the same work at once
    (``*_parallelism``): the virtual devices share this machine's cores, one device alone may
    already use several of them, and devices running at once contend."""
    one = _calls_on(ctl, 1, side, elements, repeats)
    many = _calls_on(ctl, wide, side, elements, repeats)

    def parallelism(kind: str) -> float:
        return min(float(wide), max(1.0 / wide, wide * one[kind] / many[kind]))

    return {"peak_flops": one["matmul_flops"] / one["matmul"],
            "memory_bandwidth": one["step_bytes"] / one["loop"],
            "launch": one["tiny_loop"],
            "compute_parallelism": parallelism("matmul"),
            "memory_parallelism": parallelism("loop"),
            "fresh_output_s_per_byte": one["fresh"],
            "fresh_output_bytes": 4 * elements,
            "seconds": {"one device": one, f"{wide} devices": many}}


MATMUL_SIDES = (128, 256, 512, 1024)


def _matmul_rates(ctl, repeats: int, sides=MATMUL_SIDES, wide: int = 4,
                  steps: int = 8) -> list[list[float]]:
    """How fast this machine multiplies matrices, by size: for each ``side``, [XLA's flops of
    one ``side`` x ``side`` product, FLOP/s of one device alone, devices' worth of that speed
    when ``wide`` devices each do the same at once]. Timed as steps of a ``fori_loop`` (no
    launch in it). Small products run far below a large one's rate on a CPU, which a single
    peak figure cannot say."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    out = []
    for side in sides:
        per_step = {}
        for width in (1, wide):
            vs = ctl.slice(width, island=0)
            sh, rep = NamedSharding(vs.mesh, P("x")), NamedSharding(vs.mesh, P())
            a = jax.device_put(np.ones((width * side, side), np.float32), sh)
            w = jax.device_put(np.full((side, side), 1.0 / side, np.float32), rep)
            loop = jax.jit(lambda x, w: jax.lax.fori_loop(0, steps, lambda i, v: v @ w, x),
                           in_shardings=(sh, rep), out_shardings=sh)
            per_step[width] = _median_seconds(
                lambda f=loop, x=a, m=w: f(x, m).block_until_ready(), repeats) / steps
            vs.release()
        one = jax.ShapeDtypeStruct((side, side), np.float32)
        flops = _xla(lambda x, w: x @ w, (one, one), 1, (P(), P())).flops
        out.append([flops, flops / per_step[1],
                    min(float(wide), max(1.0 / wide, wide * per_step[1] / per_step[wide]))])
    return out


def _calls_on(ctl, width: int, side: int, elements: int, repeats: int, n: int = 8) -> dict:
    """Seconds on a ``width``-device slice, each device with the same work: a ``side`` x
    ``side`` matrix product; the dispatch benchmark's step over ``elements``, per step of a
    ``fori_loop`` of ``n`` and per call of a chain of ``n`` jitted calls (each reading the one
    before, as the benchmarks run them), and the median gap between the two per byte of a
    device's output (``fresh``); on one device also a ``fori_loop`` step of a tiny
    computation, and XLA's flops and bytes of the two (what the simulator's roofline
    divides)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    vs = ctl.slice(width, island=0)
    spec = P("x")
    sh, rep = NamedSharding(vs.mesh, spec), NamedSharding(vs.mesh, P())
    a = jax.device_put(np.ones((width * side, side), np.float32), sh)
    w = jax.device_put(np.ones((side, side), np.float32), rep)
    mm = jax.jit(lambda x, w: x @ w, in_shardings=(sh, rep), out_shardings=sh)
    big = jax.device_put(np.ones(width * elements, np.float32), sh)
    ew = jax.jit(step, in_shardings=sh, out_shardings=sh)

    def loop_of(steps: int):
        return jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda i, v: step(v), x),
                       in_shardings=sh, out_shardings=sh)

    def chain() -> None:
        x = big
        for _ in range(n):
            x = ew(x)
        x.block_until_ready()

    loop = loop_of(n)
    times = _rounds({"loop": lambda: loop(big).block_until_ready(), "call": chain}, repeats)
    out = {"matmul": _median_seconds(lambda: mm(a, w).block_until_ready(), repeats),
           "loop": statistics.median(times["loop"]) / n,
           "call": statistics.median(times["call"]) / n,
           "fresh": max(0.0, _median_gap(times, "call", "loop") / n) / (4 * elements)}
    if width == 1:
        tiny_loop = loop_of(64)
        tiny = jax.device_put(np.ones(256, np.float32), sh)
        out["tiny_loop"] = _median_seconds(lambda: tiny_loop(tiny).block_until_ready(),
                                           repeats) / 64
        out["matmul_flops"] = _xla(lambda x, w: x @ w, (a, w), width, (spec, P())).flops
        out["step_bytes"] = _xla(step, (big,), width, (spec,)).bytes_accessed
    return out


def _transfer_costs(ctl, repeats: int, n: int, nbytes: int = 1 << 26) -> dict:
    """A transfer as the local runtime makes it, between 2-device slices of the two islands.
    Its whole cost (the node's host-side work and the copy) is what a traced chain whose steps
    alternate between the islands takes beyond the same chain on one slice, per transfer.
    The bandwidth: ``jax.device_put`` of ``nbytes`` onto the other island's sharding, never
    aliased (the runtime's call), beyond a tiny one, per device (the simulator splits a copy's
    bytes over its devices' ports); ``host_to_device`` likewise from NumPy."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pwkernel as pw

    slices = [ctl.slice(2, island=0), ctl.slice(2, island=1)]
    src, dst = (NamedSharding(s.mesh, P("x")) for s in slices)
    fns = [pw.function(step, slice=s, in_specs=P("x"), out_specs=P("x"), name=f"cal-t{i}")
           for i, s in enumerate(slices)]

    def chain_of(pick):
        @pw.program(name="cal-transfers")
        def chain(x):
            for i in range(n):
                x = fns[pick(i)](x)
            return x
        return chain

    x0 = jax.device_put(np.ones(256, np.float32), src)
    chains = {"one slice": chain_of(lambda i: 0), "alternating": chain_of(lambda i: i % 2)}
    times = _rounds({k: (lambda c=c: c(x0).result().block_until_ready())
                     for k, c in chains.items()}, repeats)
    seconds = {k: statistics.median(v) for k, v in times.items()}
    per_transfer = max(0.0, _median_gap(times, "alternating", "one slice") / (n - 1))

    def copy_seconds(x) -> float:
        return _median_seconds(
            lambda: jax.device_put(x, dst, may_alias=False).block_until_ready(), repeats)

    host = np.ones(nbytes // 4, np.float32)
    seconds["tiny copy"] = copy_seconds(x0)
    seconds["large copy"] = copy_seconds(jax.device_put(host, src))
    seconds["from host"] = _median_seconds(
        lambda: jax.device_put(host, dst).block_until_ready(), repeats)
    return {"latency": per_transfer,
            "bandwidth": nbytes / 2 / max(seconds["large copy"] - seconds["tiny copy"], 1e-9),
            "host_to_device": nbytes / 2 / seconds["from host"], "seconds": seconds}


def _xla(fn, args, width: int, specs):
    """XLA's own per-chip accounting of ``fn`` (what the simulator's roofline divides by the
    calibrated rates, so the rates are measured in the same units)."""
    import jax

    from ..backends.sim.cost import abstract_mesh, analyze, lower

    mesh = abstract_mesh((width,), ("x",))
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    return analyze(lower(fn, structs, mesh, specs), mesh)


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """``a + b x`` through ``points`` (x: devices, y: seconds), both at least 0, fit on
    relative error (weights 1 / y^2): the rates it predicts are then equally close at every
    slice size, where an ordinary fit would favour the largest costs."""
    import numpy as np

    x = np.array(list(points), float)
    y = np.maximum(np.array(list(points.values()), float), 1e-12)
    w = 1 / y

    def fit(design: np.ndarray) -> np.ndarray:
        return np.linalg.lstsq(design * w[:, None], y * w, rcond=None)[0]

    a, b = fit(np.stack([np.ones_like(x), x], 1))
    if a >= 0 and b >= 0:
        return float(a), float(b)
    through_origin = (0.0, max(0.0, float(fit(x[:, None])[0])))
    flat = (float(fit(np.ones((len(x), 1)))[0]), 0.0)
    error = [float(np.sum(((c + s * x - y) * w) ** 2)) for c, s in (through_origin, flat)]
    return through_origin if error[0] <= error[1] else flat


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

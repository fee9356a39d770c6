"""The simulator against this machine: predict the local benchmarks' rows from a calibration.

``dispatch_rows``, ``multitenancy_rows`` and ``parallel_dispatch_rows`` simulate, from a
calibration alone, the workloads of three local benchmarks
(``dispatch``, ``multitenancy``, ``parallel_dispatch``) in their ``mode``'s configuration on
the ``this-machine`` cluster (``Machine``: ``Cluster.from_calibration`` with the launching
thread's costs charged in line with the computations, see its docstring), with each
computation's cost from XLA's cost analysis on the measured roofline; ``compare`` also runs
the benchmarks and pairs each measured figure with its prediction. Nothing measured by the
benchmarks goes into the prediction: only the calibration's figures (``sim_calibrate.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..backends.sim import Cluster, NodeKind, SimNode, SimProgram, Simulator, estimate

F32 = jnp.float32


def matmul_rate(rates, flops: float) -> tuple[float, float]:
    """(FLOP/s of one device, parallelism) for a computation of ``flops`` per device, from the
    calibration's ``matmul_rates`` ([flops, rate, parallelism] by size): interpolated on log
    flops between the measured sizes, the nearest size's outside them."""
    points = sorted(rates)
    if flops <= points[0][0]:
        return points[0][1], points[0][2]
    for (f0, r0, p0), (f1, r1, p1) in zip(points, points[1:], strict=False):
        if flops <= f1:
            t = math.log(flops / f0) / math.log(f1 / f0)
            return r0 + t * (r1 - r0), p0 + t * (p1 - p0)
    return points[-1][1], points[-1][2]


class Machine:
    """This machine in the simulator's terms, from a calibration alone.

    The local runtime launches a computation on the thread that submitted it, and a small
    computation has ended when its launch returns; a program's submission runs on that thread
    too, just before its launches. So the host-side costs the calibration measured (per node
    and per device, per program and per device a program reaches) happen one after another
    with the computations, not ahead of them as a remote Pathways client's would: the model
    charges them as device time of the node they launch (``launch``) and of a program's first
    node (``program``), on a cluster whose client costs are zero. The devices share this
    machine's cores: a computation's compute and memory traffic are stretched by devices /
    the measured parallelism of each (``compute_parallelism``, ``memory_parallelism``; older
    calibrations: the cores); compute runs at the rate and parallelism measured for matrix
    products of about its flops per device (``matmul_rates``), where the calibration has
    them. A computation launched on its own writes its output into new buffers; those of 8 MiB
    and more get fresh pages from the system on every call, which costs
    ``fresh_output_s_per_byte`` (a loop inside one computation reuses its buffers)."""

    def __init__(self, cal: Mapping):
        self.cal = cal
        full = Cluster.from_calibration(cal)
        self.host = full.host
        self.cluster = full.with_host(client_per_node=0.0, fanout_per_host=0.0,
                                      client_per_program=0.0, program_fanout_per_host=0.0)

    def launch(self, devices: int, out_bytes: float = 0.0) -> float:
        """Host-side seconds per node on a slice of ``devices``: as measured on that slice size
        where the calibration has one (one device takes XLA's inline path, more devices a
        thread each: not a straight line), else the fitted line. On one device, a computation
        with more output than the tiny step's (``inline_output_bytes``) runs asynchronously:
        its end comes back through another thread (``per_node_async_1_device_s``)."""
        measured = self.cal.get("measured", {})
        if (devices == 1 and out_bytes > self.cal.get("inline_output_bytes", float("inf"))
                and "per_node_async_1_device_s" in measured):
            return float(measured["per_node_async_1_device_s"])
        return self._measured("per_node_by_devices_s", devices,
                              self.host.client_per_node + self.host.fanout_per_host * devices)

    def program(self, devices: int) -> float:
        """Host-side seconds per program reaching ``devices``, likewise."""
        return self._measured("per_program_by_devices_s", devices,
                              self.host.client_per_program
                              + self.host.program_fanout_per_host * devices)

    def _measured(self, key: str, devices: int, line: float) -> float:
        table = self.cal.get("measured", {}).get(key, {})
        return float(table.get(devices, table.get(str(devices), line)))

    def device_seconds(self, fn, shape: tuple, devices: int, spec) -> float:
        """One step of ``fn`` on ``devices`` as the devices run it (inside a loop, say): XLA's
        cost on the calibrated roofline, stretched where the devices share the cores."""
        c = estimate(fn, jax.ShapeDtypeStruct(shape, F32), cluster=self.cluster,
                     mesh=(devices,), axis_names=("x",), in_specs=spec)
        cores = self.cal.get("cores", devices)

        def stretch(kind: str) -> float:  # devices / their speed-up over one device alone
            if devices == 1:
                return 1.0
            return devices / min(devices, self.cal.get(f"{kind}_parallelism", cores))

        compute = c.compute_seconds * stretch("compute")
        rates = self.cal.get("matmul_rates")
        if rates and c.flops > 0:  # the rate measured for products of about this size
            rate, parallel = matmul_rate(rates, c.flops)
            compute = c.flops / rate * (devices / min(devices, parallel) if devices > 1 else 1)
        return (max(compute, c.memory_seconds * stretch("memory"))
                + self.cluster.chip.launch_overhead + c.collective_seconds)

    def fresh_output(self, nbytes: float) -> float:
        """Seconds to write ``nbytes`` of a launched computation's output (per device) into new
        pages: at the calibration's rate per byte for outputs at least as large as the one it
        measured (smaller buffers are recycled by the allocator: the 1 Mi element rows show
        no such cost), else 0; 0 for older calibrations."""
        if nbytes < self.cal.get("fresh_output_bytes", float("inf")):
            return 0.0
        return self.cal.get("fresh_output_s_per_byte", 0.0) * nbytes

    def computation(self, fn, shape: tuple, devices: int, spec, out_bytes: float,
                    steps: int = 1) -> float:
        """A computation launched on its own (``steps`` of ``fn`` in a loop, ``out_bytes`` of
        output per device): its launch, its steps, its output's fresh pages."""
        return (self.launch(devices, out_bytes)
                + steps * self.device_seconds(fn, shape, devices, spec)
                + self.fresh_output(out_bytes))


def _node(i: int, name: str, chips: tuple, seconds: float, inputs=()) -> SimNode:
    return SimNode(i, name, chips, tuple(inputs), seconds)


def _chain(name: str, chips: tuple, seconds: float, n: int, first: float = 0.0) -> SimProgram:
    """``n`` nodes, each reading the one before; ``first``: added to the first node (the
    program's submission, on this machine)."""
    return SimProgram(name, [_node(i, name, chips, seconds + (0.0 if i else first),
                                   (i - 1,) if i else ()) for i in range(n)])


def _programs(cluster: Cluster, program: SimProgram, count: int, multi: bool = False) -> float:
    """``count`` runs of ``program``, each reading the one before; until the client has heard
    the last one ended (``rpc_latency`` after it: the benchmark waits for the result)."""
    sim = Simulator(cluster, controller="multi" if multi else "single")
    previous = None
    for _ in range(count):
        previous = sim.submit(program, after=previous)
    return sim.run() + (0.0 if multi else cluster.host.rpc_latency)


def dispatch_rows(cal: Mapping, mode: str) -> list[dict]:
    """Steps per second of the dispatch benchmark's five variants, every slice and size."""
    from . import dispatch as bench

    cfg = bench.CONFIGS[mode]
    m = Machine(cal)
    pw = m.cluster
    jx = pw.with_host(client_per_node=cal["jax_dispatch"], host_per_node=0.0)
    rows = []
    for d in cfg["slices"]:
        chips = tuple(range(d))
        for size in cfg["sizes"]:
            size = math.lcm(size, d)
            n = bench.chain_length(cfg["chain"], size)
            reps = max(1, min(cfg["fused_reps"], cfg["fused_reps"] * 4096 // size))
            c = m.device_seconds(bench.step, (size,), d, P("x"))
            step = m.computation(bench.step, (size,), d, P("x"), 4 * size / d)
            fused = m.computation(bench.step, (size,), d, P("x"), 4 * size / d, steps=n)
            program = m.program(d)
            one = _chain("step", chips, step, 1, program)
            loop = _chain("fused", chips, fused, 1, program)
            rows.append({"devices": d, "size": size, "chain": n, "steps_per_s": {
                "pw_opbyop": n / _programs(pw, one, n),
                "pw_chained": n / _programs(pw, _chain("chain", chips, step, n, program), 1),
                "pw_fused": n * reps / _programs(pw, loop, reps),
                "jax_opbyop": n / _programs(jx, _chain("step", chips, c, 1), n, multi=True),
                "jax_fused": n * reps / _programs(jx, _chain("fused", chips, n * c, 1), reps,
                                                  multi=True)}})
    return rows


def multitenancy_rows(cal: Mapping, mode: str) -> list[dict]:
    """Computations per second with 1, 2, 4 clients sharing one 4-device slice."""
    from . import multitenancy as bench

    cfg = bench.CONFIGS[mode]
    m = Machine(cal)
    side = int(math.sqrt(cfg["size"]))
    c = m.computation(bench.work, (side, side), 4, P(), 4 * side * side)
    program = _chain("tenant", (0, 1, 2, 3), c, cfg["steps"], m.program(4))
    total = cfg["programs"] * max(cfg["clients"])
    rows = []
    for k in cfg["clients"]:
        end = _windowed(m.cluster, program, [f"c{i}" for i in range(k)], total // k,
                        cfg["window"])
        rows.append({"clients": k, "computations_per_s": total * cfg["steps"] / end})
    return rows


def _windowed(cluster: Cluster, program: SimProgram, clients: list[str], programs: int,
              window: int) -> float:
    """Each client keeps at most ``window`` programs in flight, submitting the next once it
    hears (``rpc_latency`` after the end) that its oldest is done, like the benchmark's
    threads. Returns when the last program ended."""
    sim = Simulator(cluster)
    left = dict.fromkeys(clients, programs)
    inflight: dict[str, list] = {c: [] for c in clients}

    def top_up(c: str, at: float) -> None:
        while left[c] and len(inflight[c]) < window:
            inflight[c].append(sim.submit(program, client=c, at=at))
            left[c] -= 1

    for c in clients:
        top_up(c, 0.0)
    end = 0.0
    while sim.next_time is not None:
        end = sim.run(until=sim.next_time)
        for c in clients:
            while inflight[c] and inflight[c][0].t_done is not None:
                inflight[c].pop(0)
                top_up(c, sim.now + cluster.host.rpc_latency)
    return end


def parallel_dispatch_rows(cal: Mapping, mode: str) -> list[dict]:
    """Stages per second of the alternating-islands chain, parallel and sequential."""
    from . import parallel_dispatch as bench

    cfg = bench.CONFIGS[mode]
    m = Machine(cal)
    cluster = m.cluster
    per_island = cluster.islands[0] * cluster.chips_per_host
    slices = [(0, 1), (per_island, per_island + 1)]
    rows = []
    for size in cfg["sizes"]:
        c = m.computation(bench.stage, (size,), 2, P("x"), 4 * size / 2)
        nodes: list[SimNode] = []
        for s in range(cfg["stages"]):
            inputs = ()
            if s:
                nodes.append(SimNode(len(nodes), f"copy{s}", slices[s % 2], (len(nodes) - 1,),
                                     kind=NodeKind.TRANSFER, nbytes=4 * size,
                                     src_devices=slices[(s - 1) % 2]))
                inputs = (len(nodes) - 1,)
            first = m.program(4) if not s else 0.0
            nodes.append(_node(len(nodes), f"stage{s}", slices[s % 2], c + first, inputs))
        program = SimProgram("alternating", nodes)
        rate = {}
        for mode_ in ("parallel", "sequential"):
            sim = Simulator(cluster, dispatch=mode_)
            sim.submit(program)
            rate[mode_] = cfg["stages"] / sim.run()
        rows.append({"size": size, "stages_per_s": rate})
    return rows


def row(benchmark: str, what: str, measured: Mapping | float, simulated: float) -> dict:
    """A table row; ``measured``: the benchmark's summary (median, min, max over its rounds)
    or one figure (a paired ratio)."""
    m = measured if isinstance(measured, Mapping) else {"median": measured}
    real = m["median"]
    return {"benchmark": benchmark, "what": what, "measured": real,
            "measured_min": m.get("min", real), "measured_max": m.get("max", real),
            "simulated": simulated,
            "error_pct": 100 * (simulated - real) / real if real else float("nan")}


def compare(cal: Mapping, mode: str = "quick") -> list[dict]:
    """Run the three local benchmarks (``mode``; the Ray row left out) and pair each figure
    with the simulator's prediction: rows of (benchmark, what, measured with its rounds' min
    and max, simulated, error)."""
    from . import dispatch, multitenancy, parallel_dispatch
    from .harness import interleave, paired_ratio, summarize

    out = []
    real = dispatch.run(mode).rows
    for r, s in zip(real, dispatch_rows(cal, mode), strict=True):
        for v in ("pw_opbyop", "pw_chained", "pw_fused"):
            out.append(row("dispatch", f"{v}, {r['devices']} dev, size {r['size']} (steps/s)",
                            r["steps_per_s"][v], s["steps_per_s"][v]))
    real = multitenancy.run(mode).rows
    for r, s in zip(real, multitenancy_rows(cal, mode), strict=True):
        out.append(row("multitenancy", f"{r['clients']} clients (computations/s)",
                        r["computations_per_s"], s["computations_per_s"]))
    import pwkernel as pw

    cfg = parallel_dispatch.CONFIGS[mode]
    ctl = pw.Controller(islands=(4, 4))
    try:
        for size, s in zip(cfg["sizes"], parallel_dispatch_rows(cal, mode), strict=True):
            samples = interleave(parallel_dispatch.variants(ctl, cfg["stages"], size,
                                                            cfg["programs"]),
                                 rounds=cfg["rounds"])
            for v in ("parallel", "sequential"):
                out.append(row("parallel-dispatch", f"{v}, size {size} (stages/s)",
                                summarize(samples[v]), s["stages_per_s"][v]))
            out.append(row("parallel-dispatch", f"parallel / sequential, size {size}",
                            paired_ratio(samples, "parallel", "sequential"),
                            s["stages_per_s"]["parallel"] / s["stages_per_s"]["sequential"]))
    finally:
        ctl.close()
    return out


def table(rows: list[dict]) -> str:
    """The comparison as text, with each measured figure's spread over its rounds (min and
    max against the median) and a count of the rows within 25 %."""
    lines = [f"{'benchmark':<18} {'what':<44} {'measured':>10} {'rounds':>13} "
             f"{'simulated':>10} {'error':>8}"]
    for r in rows:
        real = r["measured"]
        lo, hi = r.get("measured_min", real), r.get("measured_max", real)
        spread = (f"{100 * (lo - real) / real:+.0f}..{100 * (hi - real) / real:+.0f} %"
                  if real and (lo, hi) != (real, real) else "")
        lines.append(f"{r['benchmark']:<18} {r['what']:<44} {real:>10.1f} {spread:>13} "
                     f"{r['simulated']:>10.1f} {r['error_pct']:>+7.1f}%")
    within = sum(abs(r["error_pct"]) <= 25 for r in rows)
    inside = sum(r.get("measured_min", r["measured"]) <= r["simulated"]
                 <= r.get("measured_max", r["measured"]) for r in rows)
    lines.append(f"{within} of {len(rows)} rows within 25 %; {inside} predictions inside their "
                 "row's measured min..max")
    return "\n".join(lines)

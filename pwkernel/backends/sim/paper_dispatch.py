"""The paper's dispatch results on the simulator, and the one calibration that is allowed.

The paper's micro-benchmark (its Figure 5 and the text beside it): a trivial computation, one
all-reduce of a scalar and an addition, run over and over, each computation reading the one
before. Three ways on Pathways:

- **OpByOp**: each computation its own program (``Simulator.submit(..., after=previous)``);
- **Chained**: ``CHAIN`` computations traced into one program (a chain of nodes);
- **Fused**: the ``CHAIN`` computations compiled into one (one node of ``CHAIN`` times the
  work),

and the same on multi-controller JAX (``Simulator(controller="multi")``: every host dispatches
its own chips, no client, no RPC, no scheduler). The figure of merit is computations per
second in the steady state.

**The fit** (``fit``): the paper's "smallest computation at which Pathways matches JAX",
about 2.3 ms at 16 hosts and 35 ms at 512 hosts, is what this module reproduces by bisection
on the computation's duration (``break_even``), and it is the only thing parameters are fit
on. Two of the control plane's costs are fit, ``client_per_program`` and
``program_fanout_per_host`` (the client's work per program and per host a program reaches);
the others keep their stated assumptions (``ASSUMED``). Everything else the ``sim-paper``
benchmark prints is a prediction with these fitted values.

The paper counts "128 TPUs" at 16 hosts and "2048 TPUs" at 512 hosts: 8 per host (TPU v3, 4
chips of 2 TensorCores) and 4 per host (TPU v4, one device per chip; a v3 pod ends at 256
hosts). Each point runs on that hardware (``HARDWARE``), and the Chained/Fused sweep, whose
counts are cores, on TPU v3 at 8 cores per host (``SWEEP_HARDWARE``). ``what_if`` makes the
fit again with an assumption changed, to show what a predicted crossover leans on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .cluster import Cluster
from .engine import Simulator
from .errors import SimError
from .program import SimNode, SimProgram

#: the paper's break-even points: hosts -> seconds (secondary summaries of the paper)
BREAK_EVEN = {16: 2.3e-3, 512: 35e-3}
#: the hardware the paper's counts imply: "16 hosts with 128 TPUs" is 8 TensorCores per host,
#: TPU v3 (4 chips of 2 cores); "512 hosts with 2048 TPUs" is 4 per host, TPU v4 (megacore:
#: one device per chip; a v3 pod ends at 256 hosts)
HARDWARE = {16: "tpu-v3", 512: "tpu-v4"}
#: the hosts sweep (Chained, Fused against JAX), on the cores-per-host reading of its counts
SWEEP_HARDWARE = "tpu-v3"
CORES_PER_HOST = 8       # TPU v3: 4 chips of 2 TensorCores
SWEEP_HOSTS = (2, 4, 8, 16, 32, 64, 128, 256)   # up to a whole v3 pod (1024 chips)
MATCH = 0.95     # "matches": at least 95 % of JAX's throughput (as the local dispatch bench)
CHAIN = 128      # computations per Chained program / per Fused computation (assumed)
CHIPS_PER_HOST = 4
#: control-plane costs kept at stated assumptions (not fit); seconds
ASSUMED = {
    "client_per_node": (0.0, "per node of a traced program: 0, the program is traced and sent "
                             "once (its cost is client_per_program); the hosts do the per-node "
                             "work, in parallel"),
    "fanout_per_host": (0.0, "per node and host on the client: 0, a program's nodes travel to "
                             "a host in one message, charged per program "
                             "(program_fanout_per_host)"),
    "scheduler_per_host": (1e-6, "the island scheduler's launch message to each host of each "
                                 "computation (and the end it hears back), on its one thread: "
                                 "an asynchronous RPC's CPU cost, of the order of 1 us "
                                 "(assumed)"),
    "rpc_latency": (50e-6, "one message one way, a typical in-datacenter RPC (assumed)"),
    "host_per_node": (10e-6, "a host executor's enqueue of one computation (assumed)"),
    "jax_dispatch": (30e-6, "multi-controller JAX: one jitted call's dispatch on a host "
                            "(assumed; the order this machine measures for jax_opbyop)"),
}
FITTED = ("client_per_program", "program_fanout_per_host")
START = {"client_per_program": 1e-3, "program_fanout_per_host": 50e-6}


def assumptions(changed: Mapping[str, float] | None = None) -> dict[str, float]:
    """The values of ``ASSUMED`` and ``chain`` (``CHAIN``), with ``changed`` put in."""
    values = {k: v for k, (v, _) in ASSUMED.items()} | {"chain": CHAIN}
    unknown = sorted(set(changed or ()) - set(values))
    if unknown:
        raise SimError(f"the paper's dispatch model has no assumption {unknown}; expected some "
                       f"of {sorted(values)}. Maybe you want what_if(scheduler_per_host=2e-6).")
    return values | dict(changed or {})


def pathways_cluster(params: dict[str, float], hosts: int = 512, hardware: str = "tpu-v4",
                     assumed: Mapping[str, float] | None = None) -> Cluster:
    """An island of ``hosts`` hosts of ``hardware`` (a TPU preset) with the assumed
    control-plane costs (``assumed`` changes some) and the given ones."""
    base = Cluster.preset(hardware, chips=hosts * CHIPS_PER_HOST)
    values = assumptions(assumed)
    fixed = {k: values[k] for k in ASSUMED if k != "jax_dispatch"}
    return base.with_host(**{**fixed, **params})


def jax_cluster(hosts: int = 512, hardware: str = "tpu-v4",
                assumed: Mapping[str, float] | None = None) -> Cluster:
    """The same island as multi-controller JAX sees it: a host's dispatch costs
    ``jax_dispatch`` (``client_per_node`` in ``controller="multi"``); no scheduler."""
    base = Cluster.preset(hardware, chips=hosts * CHIPS_PER_HOST)
    values = assumptions(assumed)
    return base.with_host(client_per_node=values["jax_dispatch"],
                          host_per_node=values["host_per_node"])


def tiny_op_seconds(cluster: Cluster, chips: int) -> float:
    """The micro-benchmark's computation: an all-reduce of a 4-byte scalar over ``chips`` and an
    addition, on the cluster's ICI model, plus the device's launch overhead."""
    return cluster.ici.collective_seconds("all_reduce", 4, chips) + cluster.chip.launch_overhead


@dataclass(frozen=True)
class Rates:
    """Computations per second of each way, in the steady state."""

    pw_opbyop: float
    pw_chained: float
    pw_fused: float
    jax_opbyop: float
    jax_fused: float


def _steady_rate(sim: Simulator, per_run: int) -> float:
    """Computations per second between the end of the first quarter of runs and the last."""
    ends = sorted(r.t_done for r in sim.runs)
    skip = len(ends) // 4
    span = ends[-1] - ends[skip]
    return (len(ends) - 1 - skip) * per_run / span if span > 0 else float("inf")


def chain_of_programs(cluster: Cluster, hosts: int, seconds: float, n: int, multi: bool,
                       nodes: int = 1) -> float:
    chips = tuple(range(hosts * CHIPS_PER_HOST))
    sim = Simulator(cluster, controller="multi" if multi else "single")
    program = SimProgram("op", [SimNode(i, "op", chips, (i - 1,) if i else (), seconds,
                                        collective=True) for i in range(nodes)])
    previous = None
    for _ in range(n):
        previous = sim.submit(program, after=previous)
    sim.run()
    return _steady_rate(sim, nodes)


def rates(params: dict[str, float], hosts: int, seconds: float | None = None,
          programs: int = 24, hardware: str = SWEEP_HARDWARE,
          assumed: Mapping[str, float] | None = None) -> Rates:
    """Every way's throughput at ``hosts`` hosts of ``hardware`` for computations of
    ``seconds`` (default: the micro-benchmark's tiny computation)."""
    pw = pathways_cluster(params, hosts, hardware, assumed)
    jx = jax_cluster(hosts, hardware, assumed)
    chain = int(assumptions(assumed)["chain"])
    if seconds is None:
        seconds = tiny_op_seconds(pw, hosts * CHIPS_PER_HOST)
    fused = seconds * chain
    return Rates(
        pw_opbyop=chain_of_programs(pw, hosts, seconds, programs, False),
        pw_chained=chain_of_programs(pw, hosts, seconds, max(4, programs // 6), False, chain),
        pw_fused=chain_of_programs(pw, hosts, fused, programs, False) * chain,
        jax_opbyop=chain_of_programs(jx, hosts, seconds, programs, True),
        jax_fused=chain_of_programs(jx, hosts, fused, programs, True) * chain)


def break_even(params: dict[str, float], hosts: int, programs: int = 24,
               lo: float = 1e-5, hi: float = 0.5, steps: int = 22,
               assumed: Mapping[str, float] | None = None) -> float:
    """The smallest computation (seconds) at which Pathways OpByOp reaches ``MATCH`` of
    multi-controller JAX's throughput at ``hosts`` hosts (of ``HARDWARE[hosts]``, default
    TPU v4): bisection in log space."""
    hardware = HARDWARE.get(hosts, "tpu-v4")
    pw = pathways_cluster(params, hosts, hardware, assumed)
    jx = jax_cluster(hosts, hardware, assumed)

    def matches(seconds: float) -> bool:
        a = chain_of_programs(pw, hosts, seconds, programs, False)
        b = chain_of_programs(jx, hosts, seconds, programs, True)
        return a >= MATCH * b

    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if matches(mid) else (mid, hi)
    return hi


def fit(programs: int = 24, iterations: int = 3,
        assumed: Mapping[str, float] | None = None) -> dict:
    """Fit ``FITTED`` so the simulated break-even points are the paper's: Newton steps with a
    Jacobian by finite differences (each column one more pair of bisections). Returns the
    fitted values, the simulated break-even points and the iterations taken. ``assumed``:
    some assumptions changed (``assumptions``)."""
    hosts = sorted(BREAK_EVEN)
    theta = dict(START)

    def simulate(p: dict) -> list[float]:
        return [break_even(p, h, programs, assumed=assumed) for h in hosts]

    for it in range(iterations):
        now = simulate(theta)
        residual = [BREAK_EVEN[h] - v for h, v in zip(hosts, now, strict=True)]
        if max(abs(r) / BREAK_EVEN[h] for h, r in zip(hosts, residual, strict=True)) < 2e-3:
            return {"params": theta, "simulated": dict(zip(hosts, now, strict=True)),
                    "iterations": it}
        cols = []
        for name in FITTED:
            step = max(theta[name] * 0.2, 1e-6)
            moved = simulate({**theta, name: theta[name] + step})
            cols.append([(m - v) / step for m, v in zip(moved, now, strict=True)])
        (a, b), (c, d) = cols[0], cols[1]   # columns: d(break-even at h0, h1)/d(param)
        det = a * d - b * c
        if det == 0:
            break
        dx = (d * residual[0] - c * residual[1]) / det
        dy = (a * residual[1] - b * residual[0]) / det
        theta = {FITTED[0]: max(0.0, theta[FITTED[0]] + dx),
                 FITTED[1]: max(0.0, theta[FITTED[1]] + dy)}
    return {"params": theta, "simulated": dict(zip(hosts, simulate(theta), strict=True)),
            "iterations": iterations}


def crossover(params: dict[str, float], ok, hosts=SWEEP_HOSTS, programs: int = 24,
              assumed: Mapping[str, float] | None = None) -> int:
    """The paper's "matches JAX up to N cores", in hosts: the last of ``hosts`` (ascending) in
    the first unbroken run at which ``ok(rates)`` holds (0: it never holds). A small slice
    where it does not hold yet (the client's per-program cost longer than a Fused
    computation there) does not end the run; the first miss after a hold does."""
    last = 0
    for h in sorted(hosts):
        if ok(rates(params, h, programs=programs, assumed=assumed)):
            last = h
        elif last:
            break
    return last


def crossovers(params: dict[str, float], programs: int = 24, hosts=SWEEP_HOSTS,
               assumed: Mapping[str, float] | None = None) -> tuple[int, int]:
    """(Fused matches JAX Fused up to, Chained matches JAX OpByOp up to), in hosts."""
    fused = crossover(params, lambda r: r.pw_fused >= MATCH * r.jax_fused, hosts, programs,
                      assumed)
    chained = crossover(params, lambda r: r.pw_chained >= MATCH * r.jax_opbyop, hosts,
                        programs, assumed)
    return fused, chained


def what_if(programs: int = 24, **changed: float) -> dict:
    """The crossovers with some assumptions changed (any key of ``ASSUMED``, in seconds, or
    ``chain``: computations per Chained program and per Fused computation), the fit made again
    with them so the break-even points stay the paper's: how far each predicted crossover
    leans on an assumption the fit cannot see."""
    assumptions(changed)  # a clear error before minutes of work
    fitted = fit(programs=programs, assumed=changed)
    fused, chained = crossovers(fitted["params"], programs, assumed=changed)
    return {"fused": fused, "chained": chained, "params": fitted["params"],
            "simulated": fitted["simulated"]}

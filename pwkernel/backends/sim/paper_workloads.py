"""The paper's other results as simulated workloads: predictions, nothing here is fit.

Each function takes the control-plane costs (``paper_dispatch.fit``'s values and the stated
assumptions) and returns the simulated figure the paper reports:

- ``parallel_vs_sequential``: a pipeline of small stages, throughput with parallel dispatch
  over sequential;
- ``multitenancy``: aggregate throughput of several clients over one dedicated client, and the
  device-time shares of four clients at weights 1:2:4:8 under proportional share;
- ``pipelining``: a 3B decoder-only Transformer on 128 chips, 4/8/16 stages (16/32/64
  microbatches, GPipe) over SPMD;
- ``two_islands``: data parallelism across two islands over DCN over one island of as many chips.

The models' sizes are assumptions, stated in ``MODEL`` and ``docs/simulator.md``; compute is
the chip's roofline at peak (``6 x parameters x tokens`` FLOPs for a training step plus
attention) and communication the cluster's ICI/DCN model.
"""

from __future__ import annotations

from dataclasses import replace

from .cluster import Cluster
from .engine import Simulator
from .paper_dispatch import CHIPS_PER_HOST, chain_of_programs, pathways_cluster
from .program import NodeKind, SimNode, SimProgram
from .scale import pipeline

#: assumed model shapes (not in the paper's summary): the 3B decoder and the batch sizes
MODEL = {
    "3b": {"layers": 32, "d_model": 2816, "seq": 1024, "batch_tokens": 512 * 1024},
    "64b": {"params": 64e9, "batch_tokens": 1 << 20},
    "136b": {"params": 136e9, "batch_tokens": 1 << 20},
}
BF16 = 2


def parallel_vs_sequential(params: dict, stages: int = 8, microbatches: int = 16,
                           seconds: float = 2e-4) -> float:
    """A pipeline of ``stages`` stages of 4 chips, small computations (``seconds`` each):
    parallel dispatch's throughput over sequential dispatch's."""
    cluster = pathways_cluster(params, hosts=stages)
    out = {}
    for mode in ("parallel", "sequential"):
        sim = Simulator(cluster, dispatch=mode)
        sim.submit(pipeline(cluster, stages, microbatches, seconds, nbytes=1 << 20))
        out[mode] = 1 / sim.run()
    return out["parallel"] / out["sequential"]


def multitenancy(params: dict, clients: int, hosts: int = 16, seconds: float = 1e-3,
                 programs: int = 24) -> float:
    """``clients`` clients, each a chain of one-computation programs (OpByOp) on the same
    ``hosts`` hosts: their aggregate throughput over one dedicated client's."""
    cluster = pathways_cluster(params, hosts)
    one = chain_of_programs(cluster, hosts, seconds, programs, False)
    chips = tuple(range(hosts * CHIPS_PER_HOST))
    program = SimProgram("op", [SimNode(0, "op", chips, seconds=seconds, collective=True)])
    sim = Simulator(cluster)
    for c in range(clients):
        previous = None
        for _ in range(programs):
            previous = sim.submit(program, client=f"client{c}", after=previous)
    end = sim.run()
    start = sorted(r.t_done for r in sim.runs)[clients * programs // 4]
    done = sum(1 for r in sim.runs if r.t_done > start)
    return done / (end - start) / one


def shares(params: dict, weights=(1, 2, 4, 8), hosts: int = 16, seconds: float = 1e-3,
           programs: int = 60) -> dict[str, float]:
    """Four clients with a backlog each, proportional share at ``weights``: each client's
    percentage of device time while all four still have work."""
    cluster = pathways_cluster(params, hosts)
    chips = tuple(range(hosts * CHIPS_PER_HOST))
    program = SimProgram("step", [SimNode(i, "step", chips, (i - 1,) if i else (), seconds)
                                  for i in range(programs)])
    sim = Simulator(cluster, policy="share")
    for w in weights:
        sim.submit(program, client=f"w{w}", weight=float(w))
    sim.run()
    window = min(r.t_done for r in sim.runs)  # the first client to finish ends the window
    busy = {f"w{w}": 0.0 for w in weights}
    for e in sim.trace.events():
        if e.kind == "compute" and e.t_start < window:
            busy[e.client] += min(e.t_end, window) - e.t_start
    total = sum(busy.values())
    return {k: 100 * v / total for k, v in busy.items()}


# --- pipelining a 3B decoder-only Transformer on 128 chips ---------------------------------
def _flops_per_token(m: dict) -> float:
    params = 12 * m["layers"] * m["d_model"] ** 2
    return 6 * params + 12 * m["layers"] * m["seq"] * m["d_model"]


def _weights(m: dict) -> float:
    return 12 * m["layers"] * m["d_model"] ** 2 * BF16


def _fsdp_seconds(cluster: Cluster, nbytes: float, chips: int) -> float:
    """Weights sharded over ``chips`` (fully sharded data parallelism): gathered for the
    forward pass and again for the backward pass, the gradients reduce-scattered; no overlap
    with compute."""
    ici = cluster.ici
    return (2 * ici.collective_seconds("all_gather", nbytes, chips)
            + ici.collective_seconds("reduce_scatter", nbytes, chips))


def _spmd_step(cluster: Cluster, m: dict, chips: int) -> float:
    """One training step on ``chips`` chips, fully sharded data parallel."""
    compute = _flops_per_token(m) * m["batch_tokens"] / chips / cluster.chip.peak_flops
    return compute + _fsdp_seconds(cluster, _weights(m), chips)


def _gpipe(cluster: Cluster, m: dict, stages: int, micro: int) -> SimProgram:
    """GPipe on 128 chips: ``stages`` stages of 128/stages chips (fully sharded data
    parallel inside a stage, the weights gathered once per step), forward of every
    microbatch, then backward (twice the forward's work), then each stage's gradient
    reduce-scatter; activations move between stages over ICI."""
    chips = 128
    width = chips // stages
    slices = [tuple(range(s * width, (s + 1) * width)) for s in range(stages)]
    tokens = m["batch_tokens"] / micro
    fwd = _flops_per_token(m) / 3 * tokens / stages / width / cluster.chip.peak_flops
    act = int(tokens * m["d_model"] * BF16)
    weights = _weights(m) / stages  # each stage: its layers, fully sharded over its chips,
    gather = _fsdp_seconds(cluster, weights, width) / 3  # gathered once per step
    nodes: list[SimNode] = []

    def add(name, devices, inputs, seconds=0.0, **kw):
        nodes.append(SimNode(len(nodes), name, devices, tuple(inputs), seconds, **kw))
        return len(nodes) - 1

    first = [add(f"gather{s}", slices[s], [], gather, collective=True) for s in range(stages)]
    last_f: dict = {}
    for mb in range(micro):
        for s in range(stages):
            ins = [last_f[mb - 1, s]] if mb else [first[s]]
            if s:
                ins.append(add(f"act{s}", slices[s], [last_f[mb, s - 1]],
                               kind=NodeKind.TRANSFER, nbytes=act, src_devices=slices[s - 1]))
            last_f[mb, s] = add(f"fwd{s}", slices[s], ins, fwd)
    last_b: dict = {}
    for mb in range(micro):
        for s in reversed(range(stages)):
            ins = [last_b[mb - 1, s]] if mb else [last_f[micro - 1, s]]
            if s < stages - 1:
                ins.append(add(f"grad{s}", slices[s], [last_b[mb, s + 1]],
                               kind=NodeKind.TRANSFER, nbytes=act, src_devices=slices[s + 1]))
            last_b[mb, s] = add(f"bwd{s}", slices[s], ins, 2 * fwd)
    for s in range(stages):  # the backward pass's gather, then the gradients' reduce-scatter
        add(f"reduce{s}", slices[s], [last_b[micro - 1, s]], 2 * gather, collective=True)
    return SimProgram(f"gpipe{stages}", nodes)


def pipelining(params: dict, stages=(4, 8, 16)) -> dict[int, float]:
    """Each pipeline's tokens/s over SPMD's on the same 128 chips (32 hosts of 4)."""
    cluster = pathways_cluster(params, hosts=128 // CHIPS_PER_HOST)
    m = MODEL["3b"]
    chips = tuple(range(128))
    spmd = Simulator(cluster)
    spmd.submit(SimProgram("spmd", [SimNode(0, "step", chips, (), _spmd_step(cluster, m, 128),
                                            collective=True)]))
    base = spmd.run()
    out = {}
    for s in stages:
        sim = Simulator(cluster)
        sim.submit(_gpipe(cluster, m, s, 4 * s))
        out[s] = base / sim.run()
    return out


# --- two islands over DCN ------------------------------------------------------------------
def two_islands(params: dict, model: str = "64b", hosts_per_island: int = 128) -> float:
    """Data parallelism across two islands of ``hosts_per_island`` hosts (each holds the model
    sharded over its chips; the gradients cross DCN, every host sending its shard) over one
    island of the same chips (the gradients' all-reduce over ICI)."""
    m = MODEL[model]
    chips = 2 * hosts_per_island * CHIPS_PER_HOST
    one = pathways_cluster(params, hosts=2 * hosts_per_island)
    two = replace(Cluster.preset("tpu-v4", chips=chips, islands=2), host=one.host)
    compute = 6 * m["params"] * m["batch_tokens"] / chips / one.chip.peak_flops
    grads = m["params"] * BF16
    # one island: both halves' gradients meet over ICI (an all-reduce over pairs of chips)
    whole = tuple(range(chips))
    ici = one.ici.collective_seconds("all_reduce", grads / (chips // 2), 2)
    s1 = Simulator(one)
    s1.submit(SimProgram("one", [SimNode(0, "step", whole, (), compute + ici, collective=True)]))
    t1 = s1.run()
    a, b = two.island_devices(0), two.island_devices(1)
    half = int(grads / 2)  # reduce-scatter then all-gather across two: half each way, twice
    nodes = [SimNode(0, "step", a, (), compute), SimNode(1, "step", b, (), compute),
             SimNode(2, "grads", b, (0,), kind=NodeKind.TRANSFER, nbytes=2 * half, src_devices=a),
             SimNode(3, "grads", a, (1,), kind=NodeKind.TRANSFER, nbytes=2 * half, src_devices=b),
             SimNode(4, "apply", a, (0, 3), 0.0), SimNode(5, "apply", b, (1, 2), 0.0)]
    s2 = Simulator(two)
    s2.submit(SimProgram("two", nodes))
    return t1 / s2.run()

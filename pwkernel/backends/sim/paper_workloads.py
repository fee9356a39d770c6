"""The paper's other results as simulated workloads: predictions, nothing here is fit.

Each function takes the control-plane costs (``paper_dispatch.fit``'s values and the stated
assumptions) and returns the simulated figure the paper reports:

- ``parallel_vs_sequential``: a pipeline of small stages, throughput with parallel dispatch
  over sequential;
- ``multitenancy``: aggregate throughput of several clients over one dedicated client, and the
  device-time shares of four clients at weights 1:2:4:8 under proportional share;
- ``pipelining``: training a 3B decoder-only Transformer on 128 TPU v3 cores (64 chips),
  GPipe over 4/8/16 stages (16/32/64 microbatches) over SPMD (GSPMD's 2-D split);
- ``two_islands``: data parallelism across two islands over DCN over one island of as many chips.

The models' sizes are assumptions, stated in ``MODEL`` and ``docs/simulator.md``; compute is
the chip's roofline at peak (``6 x parameters x tokens`` FLOPs for a training step plus
attention; for the pipelining rows each computation's flops and HBM bytes through
``cost.roofline``) and communication the cluster's ICI/DCN model.
"""

from __future__ import annotations

from dataclasses import replace

from .cluster import Cluster
from .cost import Analysis, Collective, roofline
from .engine import Simulator
from .errors import SimError
from .paper_dispatch import CHIPS_PER_HOST, chain_of_programs, pathways_cluster
from .program import NodeKind, SimNode, SimProgram
from .scale import pipeline

#: assumed model shapes (not in the paper's summary): the 3B decoder (head dimension 128) and
#: the batch sizes; the 3B's 512 sequences are one per core per microbatch in every pipeline
#: (4S microbatches x 128/S cores), and SPMD trains on the same batch
MODEL = {
    "3b": {"layers": 32, "d_model": 2816, "heads": 22, "seq": 1024, "batch_tokens": 512 * 1024},
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
    """A client per weight (four by default), each with a backlog, proportional share at
    ``weights``: each client's percentage of device time while all still have work."""
    weights = tuple(weights)
    cluster = pathways_cluster(params, hosts)
    chips = tuple(range(hosts * CHIPS_PER_HOST))
    program = SimProgram("step", [SimNode(i, "step", chips, (i - 1,) if i else (), seconds)
                                  for i in range(programs)])
    sim = Simulator(cluster, policy="share")
    # a client per weight, "w4"; a weight given twice names its clients "w1", "w1#2", ...
    # (one name for both was one client, with all the device time: {'w1': 100.0})
    names = [f"w{w}" if weights[:i].count(w) == 0 else f"w{w}#{weights[:i].count(w) + 1}"
             for i, w in enumerate(weights)]
    for name, w in zip(names, weights, strict=True):
        sim.submit(program, client=name, weight=float(w))
    sim.run()
    window = min(r.t_done for r in sim.runs)  # the first client to finish ends the window
    busy = dict.fromkeys(names, 0.0)
    for e in sim.trace.events():
        if e.kind == "compute" and e.t_start < window:
            busy[e.client] += min(e.t_end, window) - e.t_start
    total = sum(busy.values())
    return {k: 100 * v / total for k, v in busy.items()}


# --- pipelining a 3B decoder-only Transformer on 128 TPU v3 cores --------------------------
#: the pipelining rows' hardware: the paper's "128 cores" are TPU v3 TensorCores (2 per chip,
#: each a JAX device), so 64 chips on 16 hosts, an 8 x 8 torus (the counts' reading of
#: ``paper_dispatch.HARDWARE``; docs/simulator.md gives the evidence)
PIPELINE_HARDWARE, PIPELINE_HOSTS = "tpu-v3", 16
#: SPMD as the same team's GShard dense LMs run on a v3-128 (tensorflow/lingvo,
#: lingvo/tasks/lm/params/synthetic_packed_input.py: ``DEVICE_MESH_SHAPE = [8, 16]`` over
#: 8 x 8 chips x 2 cores, DenseBuilder's 2-D split): in chips, (data, model) = (8, 8): the
#: batch and the weights' model dimension split 8 ways over one torus dimension, the
#: activations' model dimension and the weights' hidden dimension over the other
SPMD_MESH = (8, 8)
#: Adafactor (those configs' optimizer; factored second moments, no first moment): HBM bytes
#: per parameter of one update: the f32 weight and gradient read twice each, the weight
#: written once (the factored moments are a row and a column per matrix: ~0)
UPDATE_BYTES = 20
F32 = 4


def layer_flops(m: dict, tokens: float) -> float:
    """One layer's forward over ``tokens`` tokens: 2 x 12 d^2 per token for its matrices
    (QKV 3d^2, output d^2, feed-forward 2 x 4d^2) and 4 x seq x d for the attention scores and
    their product with V (dense: the causal mask saves nothing on a TPU's matrix unit)."""
    d = m["d_model"]
    return tokens * (24 * d * d + 4 * m["seq"] * d)


def _layer_bytes(m: dict, tokens: float, model: int) -> float:
    """One layer's forward activations through HBM on one chip, ``model``: how many ways the
    activations' model dimension is split: each matrix product's operands and result read or
    written once in bf16 (elementwise work fused into them): the inputs of the QKV and first
    feed-forward products whole (gathered), their partial-sum outputs whole (before the
    reduce-scatter), everything else split; the attention scores (heads x seq per token)
    written once and read once."""
    d, h, s = m["d_model"], m["heads"], m["seq"]
    return tokens * (4 * d + (16 * d + 2 * h * s) / model) * BF16


def _params(m: dict) -> float:
    return 12 * m["layers"] * m["d_model"] ** 2


def _seconds(cluster: Cluster, flops: float, nbytes: float, collectives=()) -> float:
    """cost.py's roofline: the chip's peak or its HBM bandwidth, whichever binds, its launch
    overhead, then each collective over the island's ICI model, none overlapped."""
    return roofline(Analysis(flops, 0.0, nbytes, tuple(collectives), False, 1), cluster).seconds


def spmd_parts(cluster: Cluster, m: dict, mesh: tuple[int, int] = SPMD_MESH) -> dict:
    """One SPMD training step on ``data x model`` chips (``mesh``), GSPMD's 2-D split of a
    dense Transformer: the batch and the weights' model dimension over ``data``, the
    activations' model dimension and the weights' hidden dimension (heads, feed-forward) over
    ``model``. Per layer, forward: the layer's weight shards all-gathered over ``data``; the
    inputs of the attention and feed-forward blocks all-gathered over ``model`` and their
    partial outputs reduce-scattered (2 + 2); backward: the same again, transposed, and the
    weights' f32 gradients reduce-scattered over ``data``; then the update of each chip's
    1/(data x model) of the weights. ``model`` = 1: fully sharded data parallelism.
    Returns each part's seconds (``forward``, ``backward``, ``update``), and of them the
    collectives' (``collectives``) and the matrix units' at peak (``compute``)."""
    data, model = mesh
    chips = data * model
    if chips != cluster.num_chips:
        raise SimError(f"the SPMD mesh must cover the island's {cluster.num_chips} chips, "
                       f"got {data} x {model} = {chips}; maybe you want mesh="
                       f"({max(1, cluster.num_chips // model)}, {model}).")
    L, tokens = m["layers"], m["batch_tokens"] / data  # each chip: its data row's tokens
    layer_w = 12 * m["d_model"] ** 2 / model            # a layer's weights after the gather
    act = int(tokens * m["d_model"] * BF16)              # a block's input, whole
    ag_w = Collective("all_gather", int(layer_w * BF16), data)
    act_c = [Collective("all_gather", act, model)] * 2 + [Collective("reduce_scatter", act,
                                                                     model)] * 2
    fwd_c = ([ag_w] + act_c) * L
    bwd_c = ([ag_w, Collective("reduce_scatter", int(layer_w * F32), data)] + act_c) * L
    flops = layer_flops(m, tokens) / model * L
    fwd_b = (_layer_bytes(m, tokens, model) + layer_w * BF16) * L
    bwd_b = (2 * _layer_bytes(m, tokens, model) + layer_w * (BF16 + F32)) * L
    ici = cluster.ici
    comm = sum(ici.collective_seconds(c.kind, c.nbytes, c.group) for c in fwd_c + bwd_c)
    return {"forward": _seconds(cluster, flops, fwd_b, fwd_c),
            "backward": _seconds(cluster, 2 * flops, bwd_b, bwd_c),
            "update": _seconds(cluster, 0.0, _params(m) / chips * UPDATE_BYTES),
            "collectives": comm, "compute": 3 * flops / cluster.chip.peak_flops}


def _spmd(cluster: Cluster, m: dict, mesh: tuple[int, int]) -> SimProgram:
    chips = tuple(range(mesh[0] * mesh[1]))
    parts = spmd_parts(cluster, m, mesh)
    return SimProgram("spmd", [SimNode(i, name, chips, (i - 1,) if i else (), parts[name],
                                       collective=True)
                               for i, name in enumerate(("forward", "backward", "update"))])


def gpipe_parts(cluster: Cluster, m: dict, stages: int, micro: int) -> dict:
    """GPipe's computations on one stage's chips: data parallel inside the stage (each chip
    holds the stage's layers whole, Lingvo's GPipe), so a microbatch's forward and backward
    have no collective; the backward (twice the forward's flops) adds its weight gradients
    into an f32 accumulator (read and written once per microbatch); once per step the
    accumulated gradients are all-reduced over the stage's chips and every chip applies the
    update to its copy. Seconds of each (``forward``, ``backward``, ``all_reduce``,
    ``update``), and the bytes between stages per microbatch (``activations``)."""
    width = cluster.num_chips // stages
    layers = m["layers"] // stages
    tokens = m["batch_tokens"] / micro / width  # one chip's share of a microbatch
    params = _params(m) / stages
    flops = layer_flops(m, tokens) * layers
    act = _layer_bytes(m, tokens, 1) * layers
    return {"forward": _seconds(cluster, flops, act + params * BF16),
            "backward": _seconds(cluster, 2 * flops, 2 * act + params * (BF16 + 2 * F32)),
            "all_reduce": cluster.ici.collective_seconds("all_reduce", params * F32, width),
            "update": _seconds(cluster, 0.0, params * UPDATE_BYTES),
            "activations": int(m["batch_tokens"] / micro * m["d_model"] * BF16)}


def _gpipe(cluster: Cluster, m: dict, stages: int, micro: int) -> SimProgram:
    """GPipe on the cluster's chips: ``stages`` stages of equal slices, the forward of every
    microbatch, then the backward of every microbatch (gradients accumulated), then each
    stage's gradient all-reduce and update; activations and their gradients move between
    stages over ICI (transfers, overlapping the computations)."""
    width = cluster.num_chips // stages
    slices = [tuple(range(s * width, (s + 1) * width)) for s in range(stages)]
    parts = gpipe_parts(cluster, m, stages, micro)
    act = parts["activations"]
    nodes: list[SimNode] = []

    def add(name, devices, inputs, seconds=0.0, **kw):
        nodes.append(SimNode(len(nodes), name, devices, tuple(inputs), seconds, **kw))
        return len(nodes) - 1

    last_f: dict = {}
    for mb in range(micro):
        for s in range(stages):
            ins = [last_f[mb - 1, s]] if mb else []
            if s:
                ins.append(add(f"act{s}", slices[s], [last_f[mb, s - 1]],
                               kind=NodeKind.TRANSFER, nbytes=act, src_devices=slices[s - 1]))
            last_f[mb, s] = add(f"fwd{s}", slices[s], ins, parts["forward"])
    last_b: dict = {}
    for mb in range(micro):
        for s in reversed(range(stages)):
            ins = [last_b[mb - 1, s]] if mb else [last_f[micro - 1, s]]
            if s < stages - 1:
                ins.append(add(f"grad{s}", slices[s], [last_b[mb, s + 1]],
                               kind=NodeKind.TRANSFER, nbytes=act, src_devices=slices[s + 1]))
            last_b[mb, s] = add(f"bwd{s}", slices[s], ins, parts["backward"])
    for s in range(stages):
        reduce = add(f"all_reduce{s}", slices[s], [last_b[micro - 1, s]], parts["all_reduce"],
                     collective=True)
        add(f"update{s}", slices[s], [reduce], parts["update"])
    return SimProgram(f"gpipe{stages}", nodes)


def pipeline_cluster(params: dict) -> Cluster:
    """The pipelining rows' island: 16 hosts of TPU v3 (64 chips, 128 cores)."""
    return pathways_cluster(params, hosts=PIPELINE_HOSTS, hardware=PIPELINE_HARDWARE)


def step_seconds(params: dict, stages: int | None = None,
                 mesh: tuple[int, int] = SPMD_MESH) -> float:
    """One training step's simulated seconds: GPipe over ``stages`` stages (4 x stages
    microbatches), or SPMD on ``mesh`` (``stages=None``)."""
    cluster = pipeline_cluster(params)
    m = MODEL["3b"]
    sim = Simulator(cluster)
    sim.submit(_spmd(cluster, m, mesh) if stages is None else _gpipe(cluster, m, stages,
                                                                        4 * stages))
    return sim.run()


def pipelining(params: dict, stages=(4, 8, 16),
               mesh: tuple[int, int] = SPMD_MESH) -> dict[int, float]:
    """Each pipeline's tokens/s over SPMD's (on ``mesh``) on the same 128 cores, the same
    batch."""
    base = step_seconds(params, None, mesh)
    return {s: base / step_seconds(params, s) for s in stages}


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

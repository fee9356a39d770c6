"""Compiled program plans: a traced graph's host-side work, done once per input signature.

A ``Plan`` is built the first time a graph is submitted and kept on it (graphs are cached per
input signature, and traced again when slices move, so the plan follows). It holds, per node,
everything a run needs and nothing a run changes: the executable with its fastest call path
(``Executable.call``: the compiled executable itself, whose C++ dispatch is what bare JAX pays,
and which never traces again), the value slots it reads and writes, its device set and bytes,
the scheduler's static part of it (``NodeSpec``), and who must be told when its outputs exist.
A run of a cached plan is then a few lists (values, times, counters), one small ``Task`` per
node and one scheduler event per island.

Readiness is split by who can see it cheapest. A computation reading a computation of the same
program on the same island becomes ready when that producer is *launched*, inside the gang
scheduler (``NodeSpec.waits``), so a chain launches ahead without a round trip per node. Every
other input (a program argument, a transfer, a computation that may run synchronously) is an
``external`` arrival the dispatcher counts.

A computation that donates a value waits, as one more external arrival, for every node that
read the value before it in program order (``gates``): for that reader's launch (parallel
dispatch; its end under sequential), or its failure. Under ``jax.jit`` those reads are
dispatched first and XLA holds the buffer for them; here such a reader may wait longer (for
an input from another island, for memory) than the donating call, which would then consume
the buffer before it was read.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

from .dtypes import as_dtype
from .effects_order import has_ordered_effects
from .graph import ComputeNode, Graph, TransferNode
from .guards import Guarded, guarded
from .objects import shard_bytes
from .scheduler import NodeSpec
from .trace import EventKind, Trace

# function -> {signature: an int the scheduler hashes}; an entry goes with its function (a
# ``%%pathways`` cell makes a new one each run: kept by ``id``, every run would add one)
_cost_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_cost_ids = itertools.count()
_cost_lock = threading.Lock()


def cost_key(fn, signature) -> int:
    """One int per compiled function and input signature: what the share policy's estimates
    are kept under (hashing the signature itself per launch would cost more)."""
    with _cost_lock:
        keys = _cost_keys.get(fn)
        if keys is None:
            keys = _cost_keys[fn] = {}
        out = keys.get(signature)
        if out is None:
            out = keys[signature] = next(_cost_ids)
        return out


def cost_keys_kept() -> int:
    """How many (function, signature) cost keys are kept now: those of live functions."""
    with _cost_lock:
        return sum(len(keys) for keys in list(_cost_keys.values()))


class Output(NamedTuple):
    """What a program output's ``Future`` is made of, computed once per plan (a tuple: the
    dispatcher unpacks it per output)."""

    slot: int
    producer: int              # node index; -1: an argument or constant returned as it is
    shape: tuple[int, ...]
    dtype: Any  # an np.dtype, or a JAX extended dtype (dtypes.py)
    sharding: Any
    island: int | None
    name: str                  # the producer's name
    weak: bool
    order: int                 # its position among the producer's outputs (-1: none)
    key: tuple                 # its part of a program's cache key (``Future.placement``)


@dataclass(slots=True, eq=False)
class PlanNode:
    """One node of a plan. ``inputs``/``outputs`` are value slots (graph value ids)."""

    index: int
    node: ComputeNode | TransferNode
    name: str
    island: int                   # computations: their island; transfers: the destination
    devices: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    is_compute: bool
    external: int = 0             # input slots whose arrival the dispatcher counts
    n_inputs: int = 0             # distinct input slots (sequential dispatch waits for all)
    distinct: tuple[int, ...] = ()  # its input slots, each once
    notifies: bool = False        # an output's arrival is counted by someone (parallel)
    foreign: bool = False         # reads a program argument (through transfers): what it may
                                  # queue behind is found when it is ready (other runs)
    # computations
    fn: Any = None                # the CompiledFunction
    exe: Any = None               # its Executable for this node's signature
    call: Any = None              # the fastest way to launch it: exe.call(*values)
    asynchronous: bool = True
    spec: NodeSpec | None = None
    # transfers
    sharding: Any = None          # the destination layout (an upload's: its first value's)
    shardings: tuple = ()         # per output (an upload of several host values: each one's)
    out_nbytes: tuple[dict[int, int], ...] = ()  # per output: bytes on each device (both)
    memory: int = 0               # bytes per device its outputs take (what a budget counts)
    returns: tuple[int, ...] = ()  # the slots of its outputs the user sees
    returns_nbytes: tuple[dict[int, int], ...] = ()  # and their ``out_nbytes``
    donates: tuple[int, ...] = ()  # positions of the inputs it donates (computations)
    donated_slots: tuple[int, ...] = ()  # and their slots
    # what of those a memory budget counts (``_donated``): bytes per device of the values the
    # run makes (given back when it launches), the same for arguments by slot (counted only
    # when a run's argument is a future the runtime made) and at most ``credit_room`` of them,
    # the made ones no future shows; ``reused``: XLA reuses every one (each is consumed)
    credit: int = 0
    donated_args: tuple[tuple[int, int], ...] = ()
    credit_room: int | None = None
    donated_internal: tuple[int, ...] = ()
    reused: bool = False
    moved: tuple[tuple[int, int], ...] = ()  # (donated slot, argument slot): a copy sharing
    #                                 the argument's buffers that only this node reads, of an
    #                                 argument only that copy reads (``moved_and_consumed``)
    internal: tuple[int, ...] = ()  # its distinct input slots made by the run (freed after
    #                                 their last reader; arguments and constants never are)
    gates: tuple[int, ...] = ()   # later nodes that donate what this one reads: they wait
    #                               for its first output's arrival, or its failure
    gated: int = 0                # how many such earlier readers this node waits for
    trace: tuple = ()             # its events' fields no run changes (``Trace.node_fields``)


@dataclass(slots=True, eq=False)
class Plan:
    """A graph's nodes prepared for dispatch (see the module docstring)."""

    graph: Graph
    nodes: list[PlanNode]
    nslots: int
    inputs: tuple[int, ...]               # program arguments' slots, in leaf order
    consts: tuple[tuple[int, Any], ...]   # (slot, host array) captured while tracing
    outputs: tuple[int, ...]              # the result's slots, in leaf order
    producer: tuple[int, ...]             # slot -> node index, -1 for arguments and consts
    notify: tuple[tuple[int, ...], ...]   # slot -> nodes that count its arrival (parallel)
    consumers: tuple[tuple[int, ...], ...]  # slot -> every node that reads it
    refs: tuple[int, ...]                 # slot -> how many nodes read it
    futures: frozenset[int]               # slots the user sees (a Future each)
    islands: dict[int, tuple[NodeSpec, ...]]  # island -> its computations, in program order
    external: tuple[int, ...]             # node -> external arrivals (parallel dispatch)
    n_inputs: tuple[int, ...]             # node -> distinct input slots (sequential)
    backend: dict[str, Any]               # what the executor prepared (e.g. exports)
    sources: tuple[int, ...] = ()         # argument and constant slots
    made: tuple[Output, ...] = ()         # per output: what its Future is made of
    makers: tuple = ()                    # slot -> (producer node, output position), or None
    gates: tuple[tuple[int, ...], ...] = ()  # slot -> nodes it gates (a reader's first output;
    #                                        empty when no node is gated)
    guarded: tuple[Guarded, ...] = ()     # transfers a transfer guard may refuse (guards.py)
    # across calls (``read_order.py``): (node, argument slot) per argument a computation
    # donates (or a copy of it moved, ``PlanNode.moved``); the argument slots none donates
    donated_inputs: tuple[tuple[int, int], ...] = ()
    read_inputs: tuple[int, ...] = ()
    # computations with ordered effects, in program order (``effects_order.py``)
    ordered: tuple[int, ...] = ()
    # the nodes that wait for earlier runs (those of ``donated_inputs`` and ``ordered``)
    gated: tuple[int, ...] = ()


def build(graph: Graph) -> Plan:
    """The plan of ``graph``: the executables its calls were traced with, readiness wired per
    island."""
    nslots = len(graph.values)
    producer = [-1] * nslots
    consumers: list[list[int]] = [[] for _ in range(nslots)]
    notify: list[list[int]] = [[] for _ in range(nslots)]
    nodes: list[PlanNode] = []
    argument = [False] * nslots  # the slot is a program argument, or copied from one
    for slot in graph.inputs:
        argument[slot] = True
    # (made once: per donating node, they were made again, quadratic in a program's calls)
    seen, inputs = frozenset(graph.outputs), frozenset(graph.inputs)
    ordered: list[int] = []  # computations with ordered effects (``effects_order.py``)
    for index, node in enumerate(graph.nodes):
        compute = isinstance(node, ComputeNode)
        ins, outs = node.inputs, node.outputs
        if compute:
            exe = node.exe  # (compiled for the devices it was traced on)
            p = PlanNode(index, node, node.name, node.island, node.devices, tuple(ins),
                         tuple(outs), True, fn=node.fn, exe=exe, call=exe.call,
                         asynchronous=exe.asynchronous, out_nbytes=exe.out_nbytes,
                         memory=exe.memory, donates=tuple(exe.donated))
        else:
            specs = [graph.values[o] for o in outs]
            nbytes = tuple(shard_bytes(v.shape, v.dtype, v.sharding) for v in specs)
            p = PlanNode(index, node, node.name, node.dst, node.devices, tuple(ins),
                         tuple(outs), False, sharding=specs[0].sharding,
                         shardings=tuple(v.sharding for v in specs), out_nbytes=nbytes,
                         memory=_per_device(nbytes))
        p.trace = Trace.node_fields(
            kind=EventKind.COMPUTE.value, name=p.name, island=p.island, devices=p.devices,
            node_id=node.id) if compute else Trace.node_fields(
            kind=EventKind.TRANSFER.value, name=p.name, island=p.island, devices=p.devices,
            nbytes=node.nbytes, src=node.src, dst=node.dst, src_devices=node.src_devices,
            link=node.link, node_id=node.id)
        distinct = tuple(dict.fromkeys(ins))
        p.n_inputs, p.distinct = len(distinct), distinct
        p.internal = tuple(s for s in distinct if producer[s] >= 0)
        p.donated_slots = tuple(ins[i] for i in p.donates)
        for r in sorted({r for s in set(p.donated_slots) for r in consumers[s]}):
            if nodes[r].outputs:  # an earlier reader of what it donates: launched first
                nodes[r].gates += (index,)
                p.gated += 1
        waits, after = [], []
        for slot in distinct:
            consumers[slot].append(index)
            src = producer[slot]
            srcnode = nodes[src] if src >= 0 else None
            if (compute and srcnode is not None and srcnode.is_compute
                    and srcnode.island == p.island and srcnode.asynchronous):
                waits.append(src)  # the scheduler sees its launch
            else:
                notify[slot].append(index)
                p.external += 1
        p.external += p.gated
        for k, slot in enumerate(outs):
            producer[slot] = index
            argument[slot] = not compute and argument[ins[k]]
        p.foreign = compute and any(argument[slot] for slot in distinct)
        if compute:
            if p.donates:
                _donated(p, nodes, producer, graph, seen, inputs)
            after = _island_ancestors(nodes, producer, distinct, p.island)
            in_order = has_ordered_effects(p.exe)
            if in_order:
                ordered.append(index)
            p.spec = NodeSpec(index=index, devices=frozenset(p.devices),
                              cost_key=cost_key(node.fn, node.signature), memory=p.memory,
                              waits=tuple(waits), after=tuple(after),
                              # an ordered one waits for the ordered work before it too, which
                              # only the dispatcher sees (``effects_order.py``): its ``Ready``
                              external=p.external > 0 or in_order,
                              credit=p.credit)
        nodes.append(p)
    for p in nodes:
        p.moved = tuple((s, nodes[producer[s]].inputs[0]) for s in dict.fromkeys(p.donated_slots)
                        if _moved_argument(s, nodes, producer, consumers, inputs))
        p.notifies = bool(p.gates) or any(notify[s] for s in p.outputs)
        p.returns = tuple(s for s in p.outputs if s in seen)
        p.returns_nbytes = tuple(p.out_nbytes[k] for k, s in enumerate(p.outputs) if s in seen)
    donated = tuple((p.index, a) for p in nodes if p.donates for a in dict.fromkeys(
        [*(s for s in p.donated_slots if s in inputs), *(a for _, a in p.moved)]))
    given, given_by = {a for _, a in donated}, {i for i, _ in donated}
    islands: dict[int, list[NodeSpec]] = {}
    for p in nodes:
        if p.is_compute:
            islands.setdefault(p.island, []).append(p.spec)
    return Plan(graph, nodes, nslots, tuple(graph.inputs), tuple(graph.consts.items()),
                tuple(graph.outputs), tuple(producer), tuple(map(tuple, notify)),
                tuple(map(tuple, consumers)), tuple(len(c) for c in consumers),
                frozenset(graph.outputs), {i: tuple(s) for i, s in islands.items()},
                tuple(p.external for p in nodes),
                tuple(p.n_inputs + p.gated for p in nodes), {},
                tuple(graph.inputs) + tuple(graph.consts),
                tuple(_output(s, v, producer[s], nodes) for s in graph.outputs
                      for v in (graph.values[s],)),
                tuple(None if p < 0 else (nodes[p], nodes[p].outputs.index(s))
                      for s, p in enumerate(producer)),
                _gates(nodes, producer), guarded(graph), donated,
                tuple(s for s in graph.inputs if s not in given), tuple(ordered),
                tuple(sorted(given_by.union(ordered))))


def _per_device(nbytes: tuple[dict[int, int], ...]) -> int:
    """The most bytes these outputs take together on one device."""
    total: dict[int, int] = {}
    for per in nbytes:
        for d, n in per.items():
            total[d] = total.get(d, 0) + n
    return max(total.values(), default=0)


def _gates(nodes: list[PlanNode], producer: list[int]) -> tuple[tuple[int, ...], ...]:
    """Per slot, the nodes its producer gates (on its first output), or () if none does."""
    if not any(p.gates for p in nodes):
        return ()
    return tuple(nodes[p].gates if p >= 0 and nodes[p].outputs[0] == s else ()
                 for s, p in enumerate(producer))


def _moved_argument(slot: int, nodes: list[PlanNode], producer: list[int],
                    consumers: list[list[int]], inputs: frozenset[int]) -> bool:
    """``slot`` is a copy that may share a program argument's buffers (a move onto a slice a
    device of which holds the same block), read by one node only, of an argument only that
    copy reads."""
    src = producer[slot]
    if src < 0 or nodes[src].is_compute or not nodes[src].node.shares_buffers:
        return False
    arg = nodes[src].inputs[0]
    return arg in inputs and len(consumers[arg]) == 1 and len(consumers[slot]) == 1


def _output(slot: int, v, producer: int, nodes: list[PlanNode]) -> Output:
    dtype, weak = as_dtype(v.dtype), bool(v.weak)
    return Output(slot, producer, v.shape, dtype, v.sharding, v.island,
                  nodes[producer].name if producer >= 0 else "", weak,
                  nodes[producer].outputs.index(slot) if producer >= 0 else -1,
                  ("dev", v.shape, dtype, v.sharding, weak))


def _donated(p: PlanNode, nodes: list[PlanNode], producer: list[int], graph: Graph,
             shown: frozenset[int], inputs: frozenset[int]) -> None:
    """What a memory budget counts of the values ``p`` donates, which the runtime gives back
    when ``p`` launches (``tasks.py``): a value the run makes was counted when it was made
    (a computation's output, a copy's); an argument only if it is a future the runtime made,
    known per run. Bytes are per device, on every one of ``p``'s devices (else none). No
    more is credited than XLA says it reuses (``Executable.aliased``): a donated input no
    output can take stays valid, and its bytes stay counted. ``shown``: the slots the user
    sees (the program's outputs); ``inputs``: its arguments' slots."""
    def on_all(nbytes: dict[int, int]) -> int:
        return max(nbytes.values()) if nbytes and all(d in nbytes for d in p.devices) else 0

    credit, args, internal = 0, [], []
    total, whole = 0, True  # the donated bytes per device; each known on all p's devices
    for s in dict.fromkeys(p.donated_slots):
        src, spec = producer[s], graph.values[s]
        if src >= 0:
            made = nodes[src]
            n = on_all(made.out_nbytes[made.outputs.index(s)])
            credit += n
            if s not in shown:
                internal.append(s)
        else:
            n = on_all(shard_bytes(spec.shape, spec.dtype, spec.sharding)
                       if spec.sharding is not None else {})
            if s in inputs:
                args.append((s, n))
        total, whole = total + n, whole and n > 0
    aliased = p.exe.aliased
    if aliased is not None:
        credit = min(credit, aliased)
        p.credit_room = aliased - credit
    p.reused = aliased is not None and whole and aliased >= total
    p.credit, p.donated_args, p.donated_internal = credit, tuple(args), tuple(internal)


def _island_ancestors(nodes: list[PlanNode], producer: list[int], slots, island: int) -> list:
    """The computations on ``island`` whose outputs reach these slots, through transfers."""
    out, todo, seen = [], list(slots), set()
    while todo:
        slot = todo.pop()
        src = producer[slot]
        if src < 0 or src in seen:
            continue
        seen.add(src)
        node = nodes[src]
        if node.is_compute:
            if node.island == island:
                out.append(src)
        else:
            todo.extend(node.inputs)
    return sorted(out)

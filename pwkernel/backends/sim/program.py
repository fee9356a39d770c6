"""Programs the simulator runs: graphs of compute and transfer nodes with devices, sizes and
costs, the adapter from a traced ``pwkernel.runtime.graph.Graph``, and how a ``pw.function``
is lowered for simulated chips (``lower_for_chips``, the simulated executor's ``compile``
hook) with its ``sim_cost`` hint (``hinted_seconds``).

A ``SimProgram`` is plain data: nodes in topological order, each naming the nodes whose outputs
it reads. Chip ids are the simulated cluster's (``Cluster.island_devices``).

>>> p = SimProgram("chain", [SimNode(0, "a", (0, 1), seconds=1e-3),
...                          SimNode(1, "b", (0, 1), inputs=(0,), seconds=2e-3)])
>>> [n.name for n in p.nodes]
['a', 'b']
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import jax
from jax.extend.mlir import ir, passmanager
from jax.extend.mlir.dialects import sdy
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from ...runtime import callbacks
from ...runtime.errors import ProgramError
from ...runtime.executable import Executable
from ...runtime.graph import ComputeNode, Graph, TransferNode
from ...runtime.specialization import Specialization
from ...runtime.units import human_bytes
from .cluster import Cluster
from .cost import Cost, abstract_mesh, analyze, lower, roofline, warn_uncounted_loops
from .errors import SimError
from .meshes import abstract_meshes


class NodeKind(StrEnum):
    COMPUTE = "compute"
    TRANSFER = "transfer"


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node. A computation runs ``seconds`` on ``devices``; ``collective``: it waits for
    all of them (a collective inside; matters with ``gang=False``). A transfer (``kind=
    TRANSFER``) moves ``nbytes`` from ``src_devices`` (``()``: the host) to ``devices``."""

    id: int
    name: str
    devices: tuple[int, ...]
    inputs: tuple[int, ...] = ()
    seconds: float = 0.0
    kind: NodeKind = NodeKind.COMPUTE
    nbytes: int = 0
    src_devices: tuple[int, ...] = ()
    collective: bool = False

    def __post_init__(self) -> None:
        # chip and node ids given as a list, a range or an array are taken as a tuple (a list
        # was a bare "unhashable type" TypeError from inside submit)
        for name in ("devices", "inputs", "src_devices"):
            ids = getattr(self, name)
            if type(ids) is not tuple:
                object.__setattr__(self, name, _ids(ids, name, self.name))


@dataclass(frozen=True)
class SimProgram:
    """A program: ``nodes`` in topological order (a node reads only earlier nodes), with ids
    0, 1, 2, ... in that order."""

    name: str
    nodes: Sequence[SimNode]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:  # (its run would never end, and after= it had nothing to read)
            raise SimError(f"program {self.name!r} has no nodes; a program runs at least one "
                           "SimNode, e.g. SimProgram(name, [SimNode(0, 'step', chips, "
                           "seconds=1e-3)]).")
        for i, n in enumerate(self.nodes):
            if not isinstance(n, SimNode):
                raise SimError(f"program {self.name!r}: node {i} is a {type(n).__name__}, "
                               "expected a SimNode.")
            if n.id != i:
                raise SimError(f"program {self.name!r}: node {i} has id {n.id}; ids must be "
                               "0, 1, 2, ... in the order of the nodes.")
            late = [j for j in n.inputs if not 0 <= j < i]
            if late:
                raise SimError(f"program {self.name!r}: node {i} ({n.name}) reads nodes {late}, "
                               "which do not come before it; list nodes in topological order.")
            if not n.devices:
                raise SimError(f"program {self.name!r}: node {i} ({n.name}) has no devices.")
            if n.kind is NodeKind.TRANSFER and len(n.inputs) > 1:
                raise SimError(f"program {self.name!r}: transfer {i} ({n.name}) reads "
                               f"{len(n.inputs)} nodes; a transfer moves one value.")
            for field, value in (("seconds", n.seconds), ("nbytes", n.nbytes)):
                if not isinstance(value, numbers.Real) or isinstance(value, bool):
                    raise SimError(f"program {self.name!r}: node {i} ({n.name}) has {field}="
                                   f"{value!r}, a {type(value).__name__}; expected a number, "
                                   f"e.g. {field}={'1e-3' if field == 'seconds' else '4096'}.")
            if not 0 <= n.seconds < math.inf:  # (NaN fails both)
                raise SimError(f"program {self.name!r}: node {i} ({n.name}) has seconds="
                               f"{n.seconds!r}; expected a finite duration >= 0.")
            if not 0 <= n.nbytes < math.inf:  # (a negative one freed its ports back in time)
                raise SimError(f"program {self.name!r}: node {i} ({n.name}) has nbytes="
                               f"{n.nbytes!r}; expected a finite number of bytes >= 0.")

    def check(self, cluster: Cluster) -> None:
        """Raise ``SimError`` unless every node fits ``cluster`` (chips exist; a computation
        on one island; a transfer's bytes, spread over its chips, fit their HBM)."""
        n_chips, hbm = cluster.num_chips, cluster.chip.hbm_bytes
        for n in self.nodes:
            if n.kind is NodeKind.TRANSFER and n.nbytes / len(n.devices) > hbm:
                raise SimError(
                    f"program {self.name!r}: {n.name!r} moves {human_bytes(n.nbytes)} onto "
                    f"{len(n.devices)} chips, at least {human_bytes(n.nbytes / len(n.devices))} "
                    f"on each, more than Chip.hbm_bytes (valid: at most {hbm:.0f} B per chip, "
                    f"{human_bytes(hbm)}). Maybe you want it spread over more chips.")
            bad = [d for d in (*n.devices, *n.src_devices) if not 0 <= d < n_chips]
            if bad:
                raise SimError(f"program {self.name!r}: node {n.id} ({n.name}) uses chips {bad}, "
                               f"but the cluster has chips 0..{n_chips - 1}.")
            islands = set(cluster.island_of[list(n.devices)].tolist())
            if len(islands) > 1:
                raise SimError(f"program {self.name!r}: node {n.id} ({n.name}) spans islands "
                               f"{sorted(islands)}; a computation runs on one island. Maybe "
                               "you want a transfer between two computations, one per island.")


def _ids(ids, field: str, node: str) -> tuple[int, ...]:
    """A node's chip or node ids as a tuple of ints, or a ``SimError`` naming the field."""
    try:
        out = tuple(ids)
    except TypeError:
        out = None
    if out is None or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                              for i in out):
        raise SimError(f"SimNode {node!r}: {field} must be a sequence of ints (chip ids for "
                       f"devices/src_devices, earlier node ids for inputs), got {ids!r}. "
                       f"Maybe you want {field}=(0, 1).")
    return tuple(int(i) for i in out)


CostFn = Callable[[ComputeNode], "Cost | float"]


def from_graph(graph: Graph, cluster: Cluster, cost: CostFn | float | None = None,
               devices: Mapping[int, int] | Callable[[int], int] | None = None) -> SimProgram:
    """The simulated program of a traced ``Graph`` (``pw.program(f).trace(*args)``).

    ``cost``: a computation's ``Cost`` or seconds, a function of its ``ComputeNode``, or
    ``None``: its function's ``sim_cost`` where it was given one, as the simulated controller
    takes it, else XLA's cost analysis of its executable's function, lowered on an abstract
    mesh shaped like its slice (``xla_cost``). ``devices`` maps the graph's device ids to chips
    (default: the same numbers). Values the graph reads from outside (its arguments) are
    taken to exist when it starts; host arguments become host-to-device transfers.
    """
    chip = _chip_map(devices)
    if cost is None:
        cost = xla_cost(cluster)
    producer: dict[int, int] = {}
    nodes: list[SimNode] = []
    for node in graph.nodes:
        i = len(nodes)
        if isinstance(node, ComputeNode):
            c = cost(node) if callable(cost) else cost
            c = c if isinstance(c, Cost) else Cost.given(c)
            ins = tuple(sorted({producer[v] for v in node.inputs if v in producer}))
            nodes.append(SimNode(i, node.name, tuple(chip(d) for d in node.devices), ins,
                                 c.seconds, collective=c.has_collectives))
            for v in node.outputs:
                producer[v] = i
        elif isinstance(node, TransferNode):
            ins = (producer[node.input],) if node.input in producer else ()
            nodes.append(SimNode(i, node.name, tuple(chip(d) for d in node.devices), ins,
                                 kind=NodeKind.TRANSFER, nbytes=node.nbytes,
                                 src_devices=tuple(chip(d) for d in node.src_devices)))
            for v in node.outputs:  # (an upload of several host values: all of them)
                producer[v] = i
        else:
            raise SimError(f"graph {graph.name!r} has a node of unknown kind {node!r}.")
    program = SimProgram(graph.name, nodes)
    program.check(cluster)
    return program


def xla_cost(cluster: Cluster) -> CostFn:
    """A cost function for ``from_graph``: a function's ``sim_cost`` where it has one (as the
    simulated controller takes it), else each compiled function lowered once per input
    signature on an abstract mesh of its slice's shape, with the same shardings."""
    cache: dict = {}  # (id(fn), signature) -> (fn, cost); fn is kept so its id stays unique

    def cost(node: ComputeNode) -> Cost:
        fn = node.fn
        key = (id(fn), node.signature)
        if key not in cache:
            seconds = hinted_seconds(fn.name, fn.hint)
            if seconds is not None:
                given = fn.hint if isinstance(fn.hint, Cost) else Cost.given(seconds)
                cache[key] = (fn, given)
                return given
            exe = node.exe
            mesh = abstract_mesh(tuple(fn.slice.shape), tuple(fn.slice.axis_names),
                                 fn.slice.axis_types)  # (the slice's: explicit or auto)
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exe.structs]
            try:
                lowered = lower(exe.flat, args, mesh, tuple(sh.spec for sh in exe.in_shardings),
                                tuple(sh.spec for sh in exe.out_shardings))
            except SimError as e:  # (which says 'flat', the name of the replayed body)
                raise SimError(f"could not lower {fn.name} on an abstract mesh "
                               f"{dict(mesh.shape)}: {e.__cause__}. Maybe you want "
                               "pw.function(..., sim_cost=seconds) (both simulators take it), "
                               "or from_graph(..., cost=).") from e.__cause__
            warn_uncounted_loops(fn.name, exe.jaxpr)
            cache[key] = (fn, roofline(analyze(lowered, mesh, exe.jaxpr), cluster))
        return cache[key][1]

    return cost


def _chip_map(devices) -> Callable[[int], int]:
    if devices is None:
        return int
    if callable(devices):
        return devices
    if isinstance(devices, Mapping):
        return lambda d: devices[d]
    raise SimError(f"devices must map graph device ids to chips (a dict or a function), got "
                   f"{type(devices).__name__}.")


# --- pw.function on simulated chips ---------------------------------------------------------
def hinted_seconds(name: str, hint: Any) -> float | None:
    """The seconds a ``pw.function``'s ``sim_cost`` hint gives (None: none given, XLA's cost
    analysis decides); ``ProgramError`` for anything but seconds >= 0 or a ``Cost``."""
    if hint is None:
        return None
    seconds = getattr(hint, "seconds", hint)
    if (not isinstance(seconds, numbers.Real) or isinstance(seconds, bool)
            or not 0 <= seconds < math.inf):
        raise ProgramError(
            f"{name}: sim_cost must be seconds >= 0 (or a pw.sim.Cost), the duration of one "
            f"call on a simulated cluster, got {hint!r}. Maybe you want sim_cost=1e-3.")
    return float(seconds)


def lower_for_chips(spec: Specialization) -> Executable:
    """A simulated slice's specialization: lowered on the abstract mesh of its chips (no
    devices needed), for the cost model; nothing is compiled. An inferred output is laid out
    as a real backend's compiler lays it out: on explicit axes by JAX's types; where the
    slice has auto axes, by XLA's own sharding propagation (Shardy's, the pass XLA runs when
    it compiles) over the lowered function, so specs given inside it (a nested
    ``pw.function``'s ``out_specs`` per leaf, ``with_sharding_constraint``) and its inputs'
    shardings reach its outputs (``propagated_specs``); else replicated. A body that cannot
    be lowered needs its duration (``sim_cost``)."""
    spec = replace(spec, jaxpr=abstract_meshes(spec.jaxpr))  # (shard_map(mesh=slice.mesh))
    vs = spec.slice
    mesh = vs.mesh
    auto = any(t == AxisType.Auto for t in mesh.axis_types)
    typed = [given if given is not None or auto or o.sharding is None else NamedSharding(
        mesh, o.sharding.spec)
        for given, o in zip(spec.out_shardings, spec.out_types, strict=True)]
    lowered, out_shardings = None, typed
    try:
        lowered = _lowered(spec, typed)
        if any(sh is None for sh in typed):  # (auto axes, untyped: what propagation gives)
            found = propagated_specs(lowered, tuple(mesh.axis_names))
            avals = spec.jaxpr.out_avals
            out_shardings = [sh if sh is not None else NamedSharding(mesh, _as_typed(got, a))
                             for sh, got, a in zip(typed, found, avals, strict=True)]
            lowered = _lowered(spec, out_shardings)  # (lowered as the futures say it is laid out)
    except Exception as e:
        if spec.hint is None:
            host = callbacks.found(spec.jaxpr)  # (XLA's words: "the platform ... is different")
            if host:
                calls = ", ".join(callbacks.CALLBACKS.get(p, "jax.debug.print") for p in host)
                raise ProgramError(
                    f"{spec.name} calls the host ({calls}), which simulated chips cannot "
                    "lower, and a simulation runs no function. Give its duration, "
                    "pw.function(..., sim_cost=seconds) (the callback is then not called), or "
                    "leave the call out when simulating.") from e
            raise ProgramError(
                f"{spec.name} could not be lowered for the simulated chips ({e}), so its "
                "cost cannot be estimated. Give its duration: pw.function(..., "
                "sim_cost=seconds).") from e
        out_shardings = [sh if sh is not None else NamedSharding(mesh, P()) for sh in typed]
    return spec.executable(out_shardings, lowered=lowered)


def _as_typed(found: P | None, aval) -> P:
    """A propagated spec (None: replicated), written as the output's type writes it when
    they say the same (``P('data', None)`` on a mesh with explicit axes, not ``P('data')``)."""
    found = P() if found is None else found
    typed = getattr(getattr(aval, "sharding", None), "spec", None)
    return typed if typed is not None and _trimmed(typed) == _trimmed(found) else found


def _trimmed(spec: P) -> tuple:
    dims = list(spec)
    while dims and dims[-1] is None:
        dims.pop()
    return tuple(dims)


def _lowered(spec: Specialization, out_shardings) -> jax.stages.Lowered:
    """``spec``'s body lowered for the chips; None in ``out_shardings``: left to XLA."""
    vs = spec.slice
    am = vs.mesh.abstract_mesh
    with vs.ambient():
        placed = tuple(NamedSharding(am, sh.spec) for sh in spec.in_shardings)
        args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=None if a.sharding is None
                                     else sh)  # (a host value under in_shardings: untyped)
                for a, sh in zip(spec.structs, placed, strict=True)]
        return jax.jit(spec.replay, keep_unused=spec.keep_unused, in_shardings=placed,
                       out_shardings=tuple(
            None if sh is None else NamedSharding(am, sh.spec) for sh in out_shardings)).trace(
                *args).lower(lowering_platforms=("tpu",))


def propagated_specs(lowered: jax.stages.Lowered, axis_names: Sequence[str]) -> list[P | None]:
    """Each output's ``PartitionSpec`` after XLA's sharding propagation (Shardy's
    ``sdy-propagation-pipeline``, run here on a copy of the lowered module, as XLA runs it
    when it compiles): what a compiled executable's output shardings would say, without
    devices. None for an output it leaves without a layout, or one it splits an axis for
    (a sub-axis has no ``PartitionSpec``): the caller replicates those."""
    n = len(jax.tree_util.tree_leaves(lowered.out_info))
    module = lowered.compiler_ir("stablehlo")
    with module.context:
        copy = module.operation.clone()
        try:
            passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)").run(copy)
        except Exception:  # noqa: BLE001 - a module it cannot take: replicated, as before
            return [None] * n
        main = next(op for op in copy.regions[0].blocks[0].operations
                    if op.operation.name == "func.func"
                    and ir.StringAttr(op.attributes["sym_name"]).value == "main")
        results = ([ir.DictAttr(a) for a in ir.ArrayAttr(main.attributes["res_attrs"])]
                   if "res_attrs" in main.attributes else [])
        found = [_spec_of(a["sdy.sharding"], axis_names) if "sdy.sharding" in a else None
                 for a in results]
    return (found + [None] * n)[:n]


def _spec_of(attr, axis_names: Sequence[str]) -> P | None:
    """An ``sdy.sharding`` attribute as a ``PartitionSpec`` (None: not expressible as one)."""
    dims = []
    for dim in sdy.TensorShardingAttr(attr).dimension_shardings:
        axes = [sdy.AxisRefAttr(a) for a in sdy.DimensionShardingAttr(dim).axes]
        if any(a.sub_axis_info is not None or a.name not in axis_names for a in axes):
            return None
        names = tuple(a.name for a in axes)
        dims.append(None if not names else names[0] if len(names) == 1 else names)
    while dims and dims[-1] is None:  # (as a compiled executable's shardings read)
        dims.pop()
    return P(*dims)

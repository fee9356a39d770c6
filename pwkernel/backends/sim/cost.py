"""How long a computation takes on a simulated chip: XLA's cost analysis on the roofline, plus
the collectives it runs over the island's interconnect, or a duration the user gives.

The function is lowered on a ``jax.sharding.AbstractMesh`` of the simulated chips, which needs
no devices: ``Lowered.cost_analysis()`` gives its flops and bytes accessed, and the lowered
text shows the collectives written with ``shard_map`` (``psum``, ``all_gather``, ``ppermute``,
``all_to_all``, ``psum_scatter``) with their operand sizes and group sizes.

Per chip: ``max(flops / peak, bytes / HBM bandwidth) + launch overhead``, then each collective
in turn (``Interconnect.collective_seconds``), with no overlap between them. What XLA reports
for a ``jit`` with shardings is the whole array's work (it is not partitioned yet); it is
divided by the product of the mesh axes its inputs and outputs are sharded over. Inside
``shard_map`` XLA already counts one shard's work. What this ignores: ``docs/simulator.md``.

>>> c = Cluster.preset("tpu-v4", chips=8)                                  # doctest: +SKIP
>>> estimate(lambda x: x @ x, jax.ShapeDtypeStruct((4096, 4096), "bfloat16"),
...          cluster=c, mesh=(8,), in_specs=P("x")).seconds                # doctest: +SKIP
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src.lib import _jax, xla_client  # (HLO modules: JAX has no public API for them)
from jax.extend import core as jcore
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ...runtime.program import spec_leaves
from ...runtime.specs import BATCH, INFERRED, prefix_leaves
from . import fused
from .cluster import Cluster
from .errors import SimError, UncountedLoopWarning
from .fused import copies
from .meshes import abstract_mesh  # noqa: F401 (also cost's, as before)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of a computation: ``nbytes`` on each chip (the larger of its operands
    and results), over groups of ``group`` chips."""

    kind: str
    nbytes: int
    group: int


@dataclass(frozen=True, slots=True)
class Cost:
    """A computation's time on its chips (``seconds``) and how it was reached. ``source``:
    ``"xla"`` (cost analysis and roofline) or ``"given"`` (the user's duration)."""

    seconds: float
    flops: float = 0.0            # per chip
    bytes_accessed: float = 0.0   # per chip
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    collective_seconds: float = 0.0
    collectives: tuple[Collective, ...] = ()
    source: str = "xla"
    has_collectives: bool = False

    @classmethod
    def given(cls, seconds: float, collectives: bool = False) -> Cost:
        """A duration the user knows (for what XLA cannot estimate). ``collectives``: the
        computation waits for all its chips (matters only with ``gang=False``)."""
        if (not isinstance(seconds, numbers.Real) or isinstance(seconds, bool)
                or not seconds >= 0 or math.isinf(seconds)):
            raise SimError(f"a given cost must be seconds >= 0, got {seconds!r}; "
                           "e.g. Cost.given(1e-3) for one millisecond.")
        return cls(float(seconds), source="given", has_collectives=bool(collectives))


@dataclass(frozen=True, slots=True)
class Analysis:
    """What XLA says about a lowered function, per chip."""

    flops: float
    transcendentals: float
    bytes_accessed: float
    collectives: tuple[Collective, ...]
    f32: bool       # its matrix products run in f32 (or wider)
    shards: int     # what the whole-array figures were divided by


def lower(fn: Callable, args: Sequence[Any], mesh: AbstractMesh, in_specs=None,
          out_specs=None) -> jax.stages.Lowered:
    """``fn`` lowered for TPU on ``mesh`` (no devices needed). ``args``: arrays or
    ``jax.ShapeDtypeStruct``s; ``in_specs``/``out_specs``: ``PartitionSpec``s as in
    ``pw.function`` (default: replicated)."""
    return _traced_and_lowered(fn, args, mesh, in_specs, out_specs)[1]


def _traced_and_lowered(fn: Callable, args: Sequence[Any], mesh: AbstractMesh, in_specs=None,
                        out_specs=None) -> tuple[jax.stages.Traced, jax.stages.Lowered]:
    args = tuple(args)
    leaves, tree = jax.tree_util.tree_flatten(args)
    specs = spec_leaves(in_specs, args)
    _check_axes(specs + jax.tree_util.tree_leaves(
        out_specs, is_leaf=lambda v: isinstance(v, P)), mesh)
    structs = [_struct(x, _sharding(s, np.shape(x), mesh, f"input {i}")
                       or NamedSharding(mesh, P()))
               for i, (x, s) in enumerate(zip(leaves, specs, strict=True))]
    kwargs = {}
    name = getattr(fn, "__name__", "fn")
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            if out_specs is not None:  # (one sharding per output leaf; None: left to XLA)
                out = jax.eval_shape(fn, *jax.tree_util.tree_unflatten(tree, structs))
                outs, out_tree = jax.tree_util.tree_flatten(out)
                kwargs["out_shardings"] = jax.tree_util.tree_unflatten(out_tree, [
                    _sharding(s, o.shape, mesh, f"output {i}") for i, (o, s) in enumerate(
                        zip(outs, prefix_leaves(out_specs, out, "out_specs"), strict=True))])
            traced = jax.jit(fn, **kwargs).trace(*jax.tree_util.tree_unflatten(tree, structs))
            return traced, traced.lower(lowering_platforms=("tpu",))
    except Exception as e:
        raise SimError(f"could not lower {name} on an abstract mesh {dict(mesh.shape)}: {e}. "
                       "Maybe you want to give its duration instead (Cost.given(seconds)) "
                       "for what XLA cannot estimate.") from e


def _struct(x, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    """An argument as ``jax.jit`` types it, on ``sharding``: an array's (or a struct's) shape
    and dtype; a Python scalar weakly typed (before, a Python scalar had no ``dtype``)."""
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding,
                                    weak_type=bool(getattr(x, "weak_type", False)))
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding,
                                weak_type=aval.weak_type)


def _sharding(spec, shape: tuple[int, ...], mesh: AbstractMesh,
              what: str) -> NamedSharding | None:
    """One leaf's spec as ``pw.function`` reads it: a ``PartitionSpec``; ``pw.BATCH`` (the
    leading axis over every mesh axis; a scalar replicated); None or ``pw.INFERRED``: None
    (an input is then replicated, an output left to XLA)."""
    if spec is None or spec is INFERRED:
        return None
    if spec is BATCH:
        if not shape or mesh.size == 1:
            return NamedSharding(mesh, P())
        if shape[0] % mesh.size:
            raise SimError(f"{what}: pw.BATCH shards the leading axis (size {shape[0]}) over "
                           f"the mesh's {mesh.size} chips, and {shape[0]} is not divisible by "
                           f"{mesh.size}. Maybe you want a size that is a multiple of "
                           f"{mesh.size}, or P() to replicate it.")
        names = tuple(mesh.axis_names)
        return NamedSharding(mesh, P(names[0] if len(names) == 1 else names))
    return NamedSharding(mesh, spec)


def _check_axes(specs: list, mesh: AbstractMesh) -> None:
    """Every axis the ``PartitionSpec``s name is one of the mesh's (JAX's own error names no
    fix: the mesh's axes are ``x, y, ...`` unless ``axis_names=`` says otherwise)."""
    names = tuple(mesh.axis_names)
    for spec in specs:
        if not isinstance(spec, P):
            continue
        for entry in spec:
            for axis in entry if isinstance(entry, tuple) else (entry,):
                if isinstance(axis, str) and axis not in names:
                    raise SimError(f"{spec} names axis {axis!r}, but the mesh {dict(mesh.shape)} "
                                   f"has axes {names}. Maybe you want axis_names=, one name per "
                                   f"mesh axis ({len(names)}), {axis!r} among them.")


def analyze(lowered: jax.stages.Lowered, mesh: AbstractMesh, jaxpr=None) -> Analysis:
    """Per-chip flops, bytes and collectives of a function lowered on ``mesh``. ``jaxpr``:
    the function's (a ``ClosedJaxpr``), whose loops of known length (``lax.scan``, and
    ``fori_loop`` with static bounds, which JAX writes as a scan) then count every trip:
    XLA's cost analysis counts a loop's body once (``loop_work``); and cumulative reductions
    and random bits count what their compiled kernels do (``fused``)."""
    text = lowered.as_text()
    work = np.array(_xla_work(lowered))
    if jaxpr is not None:  # (never below nothing, whatever the corrections take away)
        work = np.maximum(work + loop_work(jaxpr, mesh), 0.0)
    shards = _shards(text, dict(mesh.shape))
    flops, transcendentals, nbytes = (float(w) / shards for w in work)
    return Analysis(flops, transcendentals, nbytes, tuple(_collectives(text)),
                    _f32_matmuls(text), shards)


def _xla_work(lowered: jax.stages.Lowered) -> tuple[float, float, float]:
    """XLA's whole-array flops, transcendentals and bytes accessed, less what XLA's own
    passes remove before the program runs (``_live``)."""
    live = _live(lowered)
    costs = (lowered.cost_analysis() if live is None else _jax.hlo_module_cost_analysis(
        jax.extend.backend.get_backend(), live)) or {}
    if isinstance(costs, list | tuple):  # older JAX: one dict per computation
        costs = costs[0] if costs else {}
    return tuple(max(float(costs.get(k, 0.0)), 0.0)
                 for k in ("flops", "transcendentals", "bytes accessed"))


_LINE = re.compile(r"^(\s+(?:ROOT )?%(\S+) = (\S+) )reshape\(%(\S+)\)")
_TYPED = re.compile(r"^\s+(?:ROOT )?%(\S+) = (\S+) ")


def _live(lowered: jax.stages.Lowered):
    """The lowered HLO module with each reshape to its operand's own shape (and layout) made
    a bitcast, which reads and writes nothing (None if it has none). Given output shardings,
    JAX's HLO holds each output's in such a reshape; XLA's algebraic simplifier drops them
    before partitioning, but the cost analysis of the unoptimized module counts each as a
    read and a write of the whole output, even inside ``shard_map`` (tutorial 09's stage
    forward read 5.8 times its bytes)."""
    text = lowered.compiler_ir("hlo").get_hlo_module().to_string()
    lines = text.splitlines()
    types = {m.group(1): m.group(2) for ln in lines if (m := _TYPED.match(ln))}
    found = False
    for k, ln in enumerate(lines):
        m = _LINE.match(ln)
        if m and types.get(m.group(4)) == m.group(3):
            lines[k] = f"{m.group(1)}bitcast(%{m.group(4)}){ln[m.end():]}"
            found = True
    return xla_client.hlo.hlo_module_from_text("\n".join(lines)) if found else None


def loop_work(jaxpr, mesh: AbstractMesh, manual: tuple | None = None) -> np.ndarray:
    """The whole-array (flops, transcendentals, bytes) that XLA's cost analysis leaves out of
    ``jaxpr``: it counts the body of a loop once, so a scan of length n misses n - 1 runs
    of its body (fewer when unrolled: XLA counts the copies it lowers), and n runs of what the
    body's own loops miss; less what it counts beyond the compiled kernel for cumulative
    reductions and random bits (``fused.excess``, negative), every run of them. Inside
    ``shard_map`` (``manual``: its mesh and manual axes) a body is one shard's work, lowered
    on its shard's shapes inside a ``shard_map`` of its own over the same axes. Still counted
    once: a ``while_loop`` whose trip count is data, a loop inside ``shard_map`` whose body
    runs a reduction (``psum`` of a varying value cannot be replayed on the body's types
    alone); ``cond`` branches are not searched."""
    missing = np.zeros(3)
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        missing += fused.excess(eqn)
        if name == "scan":
            body, length = eqn.params["jaxpr"], int(eqn.params["length"])
            once, counted = _body_work(body, mesh, manual), copies(eqn.params.get("unroll", 1),
                                                                   length)
            if once is not None:
                inner = loop_work(body.jaxpr, mesh, manual)
                missing += (length - counted) * np.array(once) + length * inner
            else:  # counted as XLA counts it: its excess too
                missing += counted * fused.counted_excess(body.jaxpr)
        elif name != "cond":
            inside = manual
            if name == "shard_map":
                params = eqn.params
                axes = params.get("newly_manual_axes", params.get("axis_names", ()))
                inside = (params.get("mesh", mesh), frozenset(axes) | (
                    manual[1] if manual else frozenset()))
            for sub in jcore.jaxprs_in_params(eqn.params):
                missing += loop_work(sub, mesh, inside)
    return missing


def while_loops(jaxpr) -> int:
    """How many ``while_loop``s ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) runs, nested ones
    included: loops whose trip count is data (a ``fori_loop`` with static bounds is a scan),
    whose bodies XLA's cost analysis, and so the simulator, counts once."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return sum((eqn.primitive.name == "while") + sum(
        while_loops(sub) for sub in jcore.jaxprs_in_params(eqn.params)) for eqn in jaxpr.eqns)


def warn_uncounted_loops(name: str, jaxpr) -> None:
    """Warn (``UncountedLoopWarning``) when ``name``'s simulated duration counts the body of a
    loop with a data-dependent trip count once: the simulator cannot know how often it runs."""
    n = while_loops(jaxpr) if jaxpr is not None else 0
    if n:
        loops = "a while_loop" if n == 1 else f"{n} while_loops"
        warnings.warn(
            f"{name}: its simulated duration counts the body of {loops} once, because the "
            "trip count is data that a simulation never computes (a while_loop, or a "
            "fori_loop with traced bounds), so the time is too short. Maybe you want "
            "pw.function(..., sim_cost=seconds) with its real duration, or a fori_loop with "
            "static bounds (a scan, counted in full).", UncountedLoopWarning, stacklevel=3)


def _body_work(body, mesh: AbstractMesh,
               manual: tuple | None = None) -> tuple[float, float, float] | None:
    """XLA's figures for a loop body alone (a ``ClosedJaxpr``), lowered with the shardings
    its types carry, on the mesh they name (else ``mesh``); ``manual`` (inside ``shard_map``:
    its mesh and manual axes): on its shard's shapes, inside a ``shard_map`` over those axes.
    None if it cannot be."""
    shardings = [None if manual else getattr(a, "sharding", None) for a in body.in_avals]
    named = [sh.mesh for sh in shardings
             if isinstance(getattr(sh, "mesh", None), AbstractMesh) and not sh.mesh.empty]
    mesh = named[0] if named else mesh  # (the types' own: their axis types must match)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=None if sh is None or getattr(
        sh, "spec", None) is None else NamedSharding(mesh, sh.spec))
        for a, sh in zip(body.in_avals, shardings, strict=True)]
    fn = jcore.jaxpr_as_fun(body)
    if manual:
        mesh = manual[0]
        fn = jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), axis_names=manual[1],
                           check_vma=False)
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            lowered = jax.jit(fn).trace(*structs).lower(
                lowering_platforms=("tpu",))
    except Exception:  # noqa: BLE001 - then it counts once, as XLA counted it
        return None
    return _xla_work(lowered)


def roofline(analysis: Analysis, cluster: Cluster) -> Cost:
    """The analysis on ``cluster``'s chip and interconnect."""
    chip = cluster.chip
    peak = (chip.peak_flops_f32 or chip.peak_flops) if analysis.f32 else chip.peak_flops
    compute = analysis.flops / peak
    memory = analysis.bytes_accessed / chip.hbm_bandwidth
    comm = sum(cluster.ici.collective_seconds(c.kind, c.nbytes, c.group)
               for c in analysis.collectives)
    return Cost(max(compute, memory) + chip.launch_overhead + comm, analysis.flops,
                analysis.bytes_accessed, compute, memory, comm, analysis.collectives, "xla",
                bool(analysis.collectives))


def estimate(fn: Callable, *args, cluster: Cluster | str, mesh=1, axis_names=None,
             in_specs=None, out_specs=None, axis_types="auto") -> Cost:
    """The cost of ``fn(*args)`` on a slice of ``cluster`` (a ``Cluster`` or a preset's name)
    shaped ``mesh`` (an int, a tuple, or an ``AbstractMesh``), its axes ``axis_types``
    (``"explicit"`` to type them as a slice's are by default). ``args``: arrays,
    ``jax.ShapeDtypeStruct``s or Python scalars (weakly typed, as ``jax.jit`` reads them)."""
    if isinstance(cluster, str):
        cluster = Cluster.preset(cluster)
    elif not isinstance(cluster, Cluster):
        raise SimError(f"estimate's cluster= must be a pw.sim.Cluster or a preset's name, got "
                       f"{type(cluster).__name__}. Maybe you want cluster='tpu-v4' or "
                       "pw.sim.Cluster.preset('tpu-v4', chips=2048).")
    m = abstract_mesh(mesh, axis_names, axis_types)
    traced, lowered = _traced_and_lowered(fn, args, m, in_specs, out_specs)
    warn_uncounted_loops(getattr(fn, "__name__", "fn"), traced.jaxpr)
    return roofline(analyze(lowered, m, traced.jaxpr), cluster)


# --- reading the lowered text ----------------------------------------------------------------
_ITEMSIZE = {"i1": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4,
             "i64": 8, "ui8": 1, "ui16": 2, "ui32": 4, "ui64": 8}
_TENSOR = re.compile(r"tensor<((?:\d+x)*)(complex<\w+>|[a-zA-Z]\w*)>")
_OP = re.compile(r'"stablehlo\.(' + "|".join(COLLECTIVES) + r')"')
_GROUPS = re.compile(r"(?:replica_groups|source_target_pairs) = dense<[^>]*> : "
                     r"tensor<(\d+)x(\d+)xi64>")
_SIGNATURE = re.compile(r"[)>] : \((.*)\) -> (.*)$")
_REPLICAS = re.compile(r"replica_groups = (?:dense<[^>]*>|"
                       r"#stablehlo\.replica_group_mesh_axes<.*?\]>)")
# newer JAX (0.11+) names the mesh axes a collective spans, not its groups' device ids
_MESH_AXES = re.compile(r"replica_group_mesh_axes<mesh = @([\w.]+), axes = \[(.*?)\]>")
_MESH = re.compile(r"sdy\.mesh @([\w.]+) = <\[(.*?)\]")
_PAIRS = re.compile(r"source_target_pairs = dense<([^>]*)>")
_REDUCTION = re.compile(r"stablehlo\.(\w+) %")
_RESULT = re.compile(r"^\s*(%[\w#]+)\s*=")
_OPERANDS = re.compile(r'"stablehlo\.\w+"\(([^)]*)\)')
_MANUAL = re.compile(r"manual_axes=\{([^}]*)\}")
_SHARDED = re.compile(r"sdy\.sharding<@\w+, \[(.*?)\]>")


def _nbytes(types: str) -> int:
    total = 0
    for dims, dtype in _TENSOR.findall(types):
        if dtype.startswith("complex"):
            size = 2 * _ITEMSIZE.get(dtype[8:-1], 4)
        else:
            size = _ITEMSIZE.get(dtype, 1 if dtype.startswith("f8") else 4)
        total += math.prod(int(d) for d in dims.split("x") if d) * size
    return total


def _collectives(text: str) -> list[Collective]:
    """Every collective op, with its bytes per chip and group size, all-reduces combined as
    XLA's ``AllReduceCombiner`` combines them (``_combined``). An op's type signature is on its
    own line, or (for ops with a reduction body) on the line that closes the body."""
    ops: list[_Op] = []
    lines = text.splitlines()
    meshes = {m[1]: {a: int(n) for a, n in re.findall(r'"([^"]+)"=(\d+)', m[2])}
              for m in _MESH.finditer(text)}
    for i, line in enumerate(lines):
        op = _OP.search(line)
        if op is None:
            continue
        groups, axes = _GROUPS.search(line), _MESH_AXES.search(line)
        size = int(groups.group(2)) if groups else 2
        if axes and not groups:
            size = math.prod(meshes.get(axes[1], {}).get(a, 1)
                             for a in re.findall(r'name = "([^"]+)"', axes[2]))
        if op.group(1) == "collective_permute" and _to_itself(line):
            size = 1  # (nothing crosses a link)
        sig, end, reduction = None, i, ""
        if line.rstrip().endswith("({"):  # a reduction body: the types follow its end
            indent = len(line) - len(line.lstrip())
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].startswith(" " * indent + "})")), i)
            sig = _SIGNATURE.search(lines[end])
            reduction = next((m.group(1) for ln in lines[i + 1:end]
                              if (m := _REDUCTION.search(ln))), "")
        else:
            sig = _SIGNATURE.search(line)
        nbytes = max(_nbytes(sig.group(1)), _nbytes(sig.group(2))) if sig else 0
        dtype = (_TENSOR.findall(sig.group(1)) or [("", "")])[0][1] if sig else ""
        result, operands = _RESULT.match(line), _OPERANDS.search(line)
        replicas = _REPLICAS.search(line)
        ops.append(_Op(Collective(op.group(1), nbytes, size), i, end,
                       (reduction, dtype, replicas[0] if replicas else ""),
                       result.group(1) if result else "",
                       operands.group(1).replace(" ", "").split(",") if operands else []))
    return _combined(ops)


def _to_itself(line: str) -> bool:
    """Each source of a ``collective_permute`` is its target (one chip): a copy, no link."""
    found = _PAIRS.search(line)
    if found is None:
        return False
    ids = [int(v) for v in re.findall(r"-?\d+", found.group(1))]
    return len(set(ids)) == 1 or all(a == b for a, b in zip(ids[::2], ids[1::2], strict=True))


#: XLA's default threshold for combining all-reduces (``kDefaultAllReduceCombineThreshold``
#: in xla/service/collective_utils.h, the GPU compilers' default; TPU's is not published)
COMBINE_BYTES = 30 * 2**20 + 7


@dataclass(frozen=True, slots=True)
class _Op:
    collective: Collective
    start: int                  # its first and last line in the lowered text
    end: int
    key: tuple[str, str, str]   # (reduction, element type, replica groups): what XLA matches
    result: str
    operands: list[str]


def _combined(ops: list[_Op]) -> list[Collective]:
    """The collectives as XLA runs them: a run of all-reduces written one after another (one
    ``psum`` of a pytree writes one per leaf), none reading another's result, becomes one
    all-reduce per (reduction, element type, replica groups), each up to ``COMBINE_BYTES``
    (XLA's ``AllReduceCombiner``; its key is the same), in the order the first of each
    comes."""
    out: list[Collective] = []
    run: list[_Op] = []

    def flush():
        buckets: list[tuple[tuple, list[int]]] = []  # (key, [bytes, group]) in first order
        open_: dict[tuple, list[int]] = {}
        for o in run:
            c, bucket = o.collective, open_.get(o.key)
            if bucket is None or bucket[0] + c.nbytes > COMBINE_BYTES:
                bucket = open_[o.key] = [0, c.group]
                buckets.append((o.key, bucket))
            bucket[0] += c.nbytes
        out.extend(Collective("all_reduce", b[0], b[1]) for _, b in buckets)
        run.clear()
    for o in ops:
        if o.collective.kind != "all_reduce":
            flush()
            out.append(o.collective)
            continue
        follows = run and run[-1].end + 1 == o.start
        if not follows or any(r.result and r.result in o.operands for r in run):
            flush()
        run.append(o)
    flush()
    return out


def _f32_matmuls(text: str) -> bool:
    for line in text.splitlines():
        if "stablehlo.dot_general" in line or "stablehlo.convolution" in line:
            sig = re.search(r": \((.*)\) ->", line)
            if sig and any(t in ("f32", "f64") for _, t in _TENSOR.findall(sig.group(1))):
                return True
    return False


def _shards(text: str, mesh: dict[str, int]) -> int:
    """What XLA's whole-array figures divide by: the product of the mesh axes that the
    function's inputs and outputs are sharded over, leaving out manual axes (``shard_map``
    already counts one shard's work along those)."""
    manual: set[str] = set()
    for found in _MANUAL.findall(text):
        manual |= set(re.findall(r'"(\w+)"', found))
    header = next((ln for ln in text.splitlines() if "func.func public @main" in ln), "")
    axes: set[str] = set()
    for found in _SHARDED.findall(header):
        axes |= set(re.findall(r'"(\w+)"', found))
    return max(1, math.prod(mesh.get(a, 1) for a in axes - manual))

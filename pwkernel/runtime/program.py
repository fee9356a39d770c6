"""Compiled functions on slices (``pw.function``) and the ``@pw.program`` tracer.

A compiled function is ``jax.jit`` with input and output shardings over a virtual slice's mesh.
Because it is regular, its output shapes, dtypes and shardings are known from its input
signature alone, before its inputs are computed: that is what lets the dispatcher prepare every
node of a program ahead of time.

``@pw.program`` runs the Python function once per input signature with placeholder ``Value``s;
each compiled-function call records a node in a ``Graph``. Calling the program submits the whole
graph at once and returns futures in the shape of the function's result. A compiled function
called outside a program is a one-node program.
"""

from __future__ import annotations

import enum
import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .errors import ProgramError, SliceError, SpecError
from .graph import Graph
from .objects import Future, shard_bytes
from .resources import VirtualSlice

_tracing = threading.local()
_flatten, _unflatten = jax.tree_util.tree_flatten, jax.tree_util.tree_unflatten


class Inferred(enum.Enum):
    """``out_specs=pw.INFERRED``: an output is laid out as JAX lays it out in a plain
    ``jax.jit`` over the slice's mesh: by its type on explicit axes (sharding in types), by
    the compiler's sharding propagation on auto axes. Read back from the compiled executable,
    so it is still known before anything runs."""

    INFERRED = "inferred"


INFERRED = Inferred.INFERRED
_NUMERIC = "biufcV"  # bool, ints, floats, complex (and bfloat16-like void types)


def _current_graph() -> Graph | None:
    return getattr(_tracing, "graph", None)


class Value:
    """A placeholder for a value while a program is traced: shape, dtype and sharding only."""

    __slots__ = ("graph", "id", "shape", "dtype", "sharding")

    def __init__(self, graph: Graph, vid: int):
        spec = graph.values[vid]
        self.graph, self.id = graph, vid
        self.shape, self.dtype, self.sharding = spec.shape, spec.dtype, spec.sharding

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _refuse(self, *_, **__):
        raise ProgramError(
            f"inside @pw.program, values (here one of shape {self.shape}) are futures of "
            "computations that have not run yet; only compiled functions can operate on them. "
            "Maybe you want to put this operation inside a pw.function."
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = __pow__ = _refuse
    __getitem__ = __array__ = __bool__ = __float__ = __int__ = __iter__ = _refuse

    def __repr__(self) -> str:
        return f"Value(shape={self.shape}, dtype={self.dtype})"


@dataclass(frozen=True)
class Executable:
    """One compiled specialization of a compiled function, and what it needs and makes."""

    compiled: Any
    in_shardings: tuple[Any, ...]
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]
    out_shardings: tuple[Any, ...]
    out_tree: Any
    memory: int  # output bytes on each of the slice's devices
    out_nbytes: tuple[dict[int, int], ...]  # per output: bytes on each device
    asynchronous: bool = True  # launching returns at once (no host callbacks inside)
    # How launches call it: the compiled executable itself (C++ dispatch after its first call;
    # unlike the jit object it never traces again, whatever mesh is ambient in that thread)
    call: Any = None
    # On a simulated island: the function lowered for its chips (never compiled), which the
    # simulator's cost model reads
    lowered: Any = None


def spec_leaves(specs, args: tuple) -> list[Any]:
    """One PartitionSpec (or None) per flattened argument leaf."""
    nleaves = [len(jax.tree_util.tree_leaves(a)) for a in args]
    if specs is None or isinstance(specs, P):
        return [specs] * sum(nleaves)
    if not isinstance(specs, tuple | list) or len(specs) != len(args):
        raise SpecError(
            f"in_specs must be one PartitionSpec, or a tuple with one entry per argument "
            f"({len(args)} here), got {specs!r}. Maybe you want in_specs=P('x')."
        )
    out: list[Any] = []
    for spec, n in zip(specs, nleaves, strict=True):
        if spec is None or isinstance(spec, P):
            out.extend([spec] * n)
            continue
        leaves = jax.tree_util.tree_leaves(spec, is_leaf=lambda s: s is None or isinstance(s, P))
        if len(leaves) != n:
            raise SpecError(f"in_specs entry {spec!r} has {len(leaves)} leaves but its argument "
                            f"has {n}; give one PartitionSpec per array, or one for all.")
        out.extend(leaves)
    return out


def _default_spec(shape: tuple[int, ...], vs: VirtualSlice) -> P:
    # Shard the leading axis over the whole slice when it divides; otherwise replicate.
    if shape and shape[0] % vs.size == 0 and vs.size > 1:
        names = vs.axis_names
        return P(names[0] if len(names) == 1 else tuple(names))
    return P()


def _check_spec(spec: P, shape: tuple[int, ...], mesh, what: str) -> None:
    if len(spec) > len(shape):
        raise SpecError(f"{what}: {spec} names {len(spec)} dimensions but the array has shape "
                        f"{shape} ({len(shape)} dimensions). Maybe you want P() (replicate).")
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if name not in mesh.shape:
                raise SpecError(f"{what}: {spec} uses mesh axis {name!r}, but the slice's mesh "
                                f"has axes {tuple(mesh.axis_names)}.")
            if name in used:
                raise SpecError(f"{what}: {spec} uses mesh axis {name!r} twice.")
            used.add(name)
        size = math.prod(mesh.shape[n] for n in names)
        if shape[dim] % size:
            raise SpecError(
                f"{what}: {spec} shards dimension {dim} (size {shape[dim]}) over mesh axis "
                f"{'x'.join(names)} of size {size}, and {shape[dim]} is not divisible by {size}."
                f" Maybe you want P() to replicate it, or a size that is a multiple of {size}."
            )


class CompiledFunction:
    """A function compiled for a virtual slice: ``jax.jit`` with shardings over its mesh.

    >>> double = pw.function(lambda x: x * 2, slice=s0, in_specs=P("x"))   # doctest: +SKIP
    >>> double(np.arange(4.0)).result()                                    # doctest: +SKIP
    Array([0., 2., 4., 6.], dtype=float32)
    """

    def __init__(self, fn: Callable, slice: VirtualSlice, in_specs=None, out_specs=None,
                 name: str | None = None, sim_cost=None):
        if not callable(fn):
            raise ProgramError(f"pw.function needs a callable, got {type(fn).__name__}.")
        if sim_cost is not None and not _is_duration(sim_cost):
            raise ProgramError(
                f"sim_cost must be seconds >= 0 (or a pw.sim.Cost), the duration of one call "
                f"on a simulated cluster, got {sim_cost!r}. Maybe you want sim_cost=1e-3.")
        if not isinstance(slice, VirtualSlice):
            raise SliceError(
                f"pw.function needs slice= a VirtualSlice (from ctl.slice(...)), got "
                f"{type(slice).__name__}. Maybe you want slice=ctl.slice(2)."
            )
        self.fn, self.slice = fn, slice
        self.in_specs, self.out_specs = in_specs, out_specs
        self.sim_cost = sim_cost
        self.name = name or getattr(fn, "__name__", "fn")
        if self.name == "<lambda>":
            self.name = "lambda"
        self._cache: dict[Any, Executable] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn, updated=())

    @property
    def controller(self):
        return self.slice._manager.controller

    def executable(self, signature) -> Executable:
        """The compiled specialization for ``signature`` ((tree, ((shape, dtype), ...)))."""
        key = (self.slice.version, signature)
        exe = self._cache.get(key)
        if exe is None:
            with self._lock:
                exe = self._cache.get(key) or self._compile(*signature)
                self._cache[key] = exe
        return exe

    def _compile(self, in_tree, in_avals) -> Executable:
        vs = self.slice
        mesh = vs.mesh
        args = jax.tree_util.tree_unflatten(in_tree, [jax.ShapeDtypeStruct(s, d)
                                                     for s, d in in_avals])
        specs = spec_leaves(self.in_specs, args if isinstance(args, tuple) else (args,))
        in_shardings = []
        for i, ((shape, _), spec) in enumerate(zip(in_avals, specs, strict=True)):
            spec = _default_spec(shape, vs) if spec is None else spec
            _check_spec(spec, shape, mesh, f"{self.name}: input {i} in_specs")
            in_shardings.append(NamedSharding(mesh, spec))

        def flat(*leaves):
            return tuple(jax.tree_util.tree_leaves(self.fn(*jax.tree_util.tree_unflatten(in_tree,
                                                                                  leaves))))
        structs = [jax.ShapeDtypeStruct(s, d, sharding=sh)
                   for (s, d), sh in zip(in_avals, in_shardings, strict=True)]
        try:
            with vs.ambient():
                out_struct = jax.eval_shape(lambda *a: self.fn(*jax.tree_util.tree_unflatten(
                    in_tree, a)), *structs)
        except Exception as e:
            raise ProgramError(f"{self.name} could not be traced for inputs "
                               f"{[(s, str(d)) for s, d in in_avals]}: {e}") from e
        out_leaves, out_tree = jax.tree_util.tree_flatten(out_struct)
        out_specs = self._out_spec_leaves(out_struct, len(out_leaves))
        out_shardings = []
        for i, (o, spec) in enumerate(zip(out_leaves, out_specs, strict=True)):
            if spec is INFERRED:
                out_shardings.append(None)  # jit: left to JAX, read back once compiled
                continue
            spec = _default_spec(o.shape, vs) if spec is None else spec
            _check_spec(spec, o.shape, mesh, f"{self.name}: output {i} out_specs")
            out_shardings.append(NamedSharding(mesh, spec))
        if vs.island.simulated:
            return self._lower_simulated(flat, structs, in_shardings, out_shardings,
                                         out_leaves, out_tree)
        jitted = jax.jit(flat, in_shardings=tuple(in_shardings),
                         out_shardings=tuple(out_shardings))
        with vs.ambient():
            compiled = jitted.lower(*structs).compile()
        out_shardings = [given if given is not None else made for given, made in
                         zip(out_shardings, compiled.output_shardings, strict=True)]
        out_nbytes = tuple(shard_bytes(o.shape, o.dtype, sh)
                           for o, sh in zip(out_leaves, out_shardings, strict=True))
        memory = sum(max(n.values()) for n in out_nbytes)
        # A computation that calls back into Python may run in the launching thread: those
        # are launched by the island's workers, never by the thread that submits.
        asynchronous = "callback" not in compiled.as_text()
        return Executable(compiled, tuple(in_shardings),
                          tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in out_leaves),
                          tuple(out_shardings), out_tree, memory, out_nbytes, asynchronous,
                          compiled)

    def _lower_simulated(self, flat, structs, in_shardings, out_shardings, out_leaves,
                         out_tree) -> Executable:
        """A simulated slice's specialization: lowered on the abstract mesh of its chips (no
        devices needed), for the simulator's cost model; nothing is compiled. Inferred output
        layouts are what JAX's types say (explicit axes), else replicated."""
        vs = self.slice
        mesh = vs.mesh
        am = mesh.abstract_mesh
        out_shardings = [given if given is not None else NamedSharding(
            mesh, getattr(o.sharding, "spec", None) or P())
            for given, o in zip(out_shardings, out_leaves, strict=True)]
        lowered = None
        try:
            with vs.ambient():
                args = [jax.ShapeDtypeStruct(a.shape, a.dtype,
                                             sharding=NamedSharding(am, sh.spec))
                        for a, sh in zip(structs, in_shardings, strict=True)]
                lowered = jax.jit(flat, out_shardings=tuple(
                    NamedSharding(am, sh.spec) for sh in out_shardings)).trace(*args).lower(
                        lowering_platforms=("tpu",))
        except Exception as e:
            if self.sim_cost is None:
                raise ProgramError(
                    f"{self.name} could not be lowered for the simulated chips ({e}), so its "
                    "cost cannot be estimated. Give its duration: pw.function(..., "
                    "sim_cost=seconds).") from e
        out_nbytes = tuple(shard_bytes(o.shape, o.dtype, sh)
                           for o, sh in zip(out_leaves, out_shardings, strict=True))
        return Executable(None, tuple(in_shardings),
                          tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in out_leaves),
                          tuple(out_shardings), out_tree,
                          sum(max(n.values()) for n in out_nbytes), out_nbytes, True, None,
                          lowered)

    def _out_spec_leaves(self, out_struct, n: int) -> list[Any]:
        if self.out_specs is None or isinstance(self.out_specs, P | Inferred):
            return [self.out_specs] * n
        leaves = jax.tree_util.tree_leaves(
            self.out_specs, is_leaf=lambda s: s is None or isinstance(s, P | Inferred))
        if len(leaves) != n:
            raise SpecError(f"{self.name}: out_specs {self.out_specs!r} has {len(leaves)} "
                            f"entries but the function returns {n} arrays.")
        return leaves

    def __call__(self, *args):
        graph = getattr(_tracing, "graph", None)
        if graph is not None:
            return _record_call(graph, self, args)
        return self._program_wrapper(*args)

    @functools.cached_property
    def _program_wrapper(self) -> Program:
        return Program(lambda *a: self(*a), name=self.name)

    def _as_program(self) -> Program:
        return self._program_wrapper

    def __repr__(self) -> str:
        return f"pw.function({self.name}, slice={self.slice!r})"


def _is_duration(cost) -> bool:
    seconds = getattr(cost, "seconds", cost)
    return (isinstance(seconds, int | float) and not isinstance(seconds, bool)
            and 0 <= seconds < math.inf)


def _record_call(graph: Graph, fn: CompiledFunction, args: tuple):
    """Add one compute node (and the transfers its inputs need) to the graph being traced."""
    vs = fn.slice
    island, devices = vs.island.id, vs.device_ids
    ctl = fn.controller
    if graph.controller is None:
        graph.bind(ctl, ctl.resources.epoch, ctl.resources.island_of)
    elif graph.controller is not ctl:
        raise ProgramError(f"{fn.name} belongs to another controller than the functions called "
                           "before it; a program runs on one controller.")
    leaves, in_tree = jax.tree_util.tree_flatten(args)
    vids = [_as_value_id(graph, leaf, fn) for leaf in leaves]
    avals = tuple((graph.values[v].shape, graph.values[v].dtype) for v in vids)
    signature = (in_tree, avals)
    exe = fn.executable(signature)
    inputs = [graph.placed(v, sh, island, devices)
              for v, sh in zip(vids, exe.in_shardings, strict=True)]
    outs = [graph.new_value(o.shape, o.dtype, sh, island)
            for o, sh in zip(exe.out_shapes, exe.out_shardings, strict=True)]
    graph.add_compute(fn.name, fn, signature, inputs, [o.id for o in outs], island, devices)
    return jax.tree_util.tree_unflatten(exe.out_tree, [Value(graph, o.id) for o in outs])


def _as_value_id(graph: Graph, leaf, fn: CompiledFunction) -> int:
    if isinstance(leaf, Value):
        if leaf.graph is not graph:
            raise ProgramError("a Value from another program's trace was used; pass futures "
                               "between programs, not traced values.")
        return leaf.id
    if isinstance(leaf, Future):
        raise ProgramError(
            f"{fn.name} got a Future while a program was being traced; pass futures as "
            "arguments of the program instead of capturing them."
        )
    try:
        arr = np.asarray(leaf)
    except Exception:
        arr = None
    if arr is None or arr.dtype.kind not in _NUMERIC:
        raise ProgramError(f"{fn.name} got an argument of type {type(leaf).__name__}; compiled "
                           "functions take arrays, scalars and pytrees of them. Maybe you want "
                           "functools.partial for static arguments.")
    arr = _canonical(arr)
    spec = graph.new_value(arr.shape, arr.dtype)
    graph.consts[spec.id] = arr
    return spec.id


def _canonical(arr: np.ndarray) -> np.ndarray:
    # What jax would turn a host value into (float64 -> float32 unless x64 is on).
    dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
    return arr if arr.dtype == dtype else arr.astype(dtype)


def leaf_placement(leaf) -> tuple:
    """A program argument's part of the cache key: how it is laid out now."""
    if isinstance(leaf, Future):
        return ("dev", leaf.shape, leaf.dtype, leaf.sharding)
    if isinstance(leaf, jax.Array):
        return ("dev", leaf.shape, leaf.dtype, leaf.sharding)
    try:
        arr = np.asarray(leaf)
    except Exception:
        arr = np.asarray(None)
    if arr.dtype.kind not in _NUMERIC:
        raise ProgramError(f"a program got an argument of type {type(leaf).__name__}; programs "
                           "take arrays, scalars, futures and pytrees of them. Maybe you want "
                           "functools.partial for static arguments.")
    return ("host", arr.shape, jax.dtypes.canonicalize_dtype(arr.dtype), None)


class Program:
    """A Python function over compiled functions, traced into one dataflow graph.

    >>> @pw.program
    ... def f(v):
    ...     x = a(v)
    ...     return b(x), a(c(x))
    >>> y, z = f(np.array([1.0, 2.0]))        # doctest: +SKIP
    """

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "program")
        self._graphs: dict[Any, Graph] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn, updated=())

    def trace(self, *args) -> Graph:
        """The graph for these arguments (traced now, or from the cache)."""
        leaves, tree = jax.tree_util.tree_flatten(args)
        return self._graph(tree, leaves)

    def _graph(self, tree, leaves) -> Graph:
        key = (tree, tuple([leaf_placement(leaf) for leaf in leaves]))
        graph = self._graphs.get(key)
        if graph is None or graph.stale():
            with self._lock:
                graph = self._graphs.get(key)
                if graph is None or graph.stale():
                    graph = self._graphs[key] = self._build(key)
        return graph

    def _build(self, key) -> Graph:
        tree, placement = key
        graph = Graph(self.name)
        values = []
        for kind, shape, dtype, sharding in placement:
            spec = graph.new_value(shape, dtype, sharding if kind == "dev" else None)
            graph.inputs.append(spec.id)
            values.append(Value(graph, spec.id))
        _tracing.graph = graph
        try:
            result = self.fn(*jax.tree_util.tree_unflatten(tree, values))
        finally:
            _tracing.graph = None
        out_leaves, graph.out_tree = jax.tree_util.tree_flatten(result)
        for leaf in out_leaves:
            if not isinstance(leaf, Value) or leaf.graph is not graph:
                raise ProgramError(f"program {self.name} returned a {type(leaf).__name__}; a "
                                   "program returns the values of compiled-function calls.")
            graph.outputs.append(leaf.id)
        if graph.controller is None:
            raise ProgramError(f"program {self.name} called no compiled function; wrap the "
                               "work in pw.function(fn, slice=...) and call that.")
        return graph

    def __call__(self, *args, dispatch: str | None = None):
        """Submit the program on ``args``; ``dispatch="sequential"`` (or ``"parallel"``) for
        this call only, else the controller's mode. Inside another program: inlined."""
        if getattr(_tracing, "graph", None) is not None:
            return self.fn(*args)  # inside another trace: inline this program's calls
        leaves, tree = _flatten(args)
        graph = self._graph(tree, leaves)
        futures = graph.controller.submit(graph, leaves, dispatch)
        return _unflatten(graph.out_tree, futures)

    def __repr__(self) -> str:
        return f"pw.program({self.name})"


def program(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: trace ``fn`` into one dataflow program (see ``Program``)."""
    if fn is None:
        return lambda f: Program(f, name=name)
    return Program(fn, name=name)


def function(fn: Callable | None = None, *, slice: VirtualSlice, in_specs=None, out_specs=None,
             name: str | None = None, sim_cost=None):
    """A compiled function on ``slice``; usable as ``pw.function(fn, slice=s)`` or a decorator.

    ``in_specs``/``out_specs``: a ``PartitionSpec`` for every array, or one entry per argument
    (output). Default: shard the leading axis over the slice when it divides, else replicate.
    ``out_specs=pw.INFERRED`` (for all outputs or some): the layout JAX gives them, as in a
    plain ``jax.jit`` over the slice's mesh.

    ``sim_cost``: on a simulated controller (``backend="sim"``), the seconds one call takes
    (or a ``pw.sim.Cost``), for what XLA's cost analysis cannot estimate; elsewhere unused.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, slice, in_specs, out_specs, name, sim_cost)
    return CompiledFunction(fn, slice, in_specs, out_specs, name, sim_cost)

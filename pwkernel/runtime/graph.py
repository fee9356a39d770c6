"""The dataflow IR: one node per sharded computation, and the transfers between them.

A ``Graph`` is built by the tracer in topological order. Each node consumes and produces
values (``ValueSpec``: shape, dtype, sharding, island). Wherever a computation needs an input
laid out differently from where it was produced (another slice, another island, or the host),
the graph gets a ``TransferNode``; one transfer is shared by every consumer that needs the same
layout. Nodes refer to values by integer ids, so the graph never grows edges per shard.
While a program is traced, its values are ``Value`` placeholders (shape, dtype, sharding).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

from .arraylike import ArrayOnDemand
from .dtypes import as_dtype, itemsize
from .errors import NeedsValueError, ProgramError
from .trace import LinkKind


@dataclass(frozen=True, slots=True)
class ValueSpec:
    """A logical (possibly sharded) buffer in a program: known before anything runs."""

    id: int
    shape: tuple[int, ...]
    dtype: Any  # an np.dtype, or a JAX extended dtype (dtypes.py)
    sharding: Any = None          # None: the value lives on the host
    island: int | None = None     # None: host, or devices outside every island
    weak: bool = False            # weakly typed (a Python scalar, as JAX types it)
    # a program's argument on devices (a jax.Array, a future): whether it is committed to
    # its layout (``jax.Array.committed``; a future is, as a jax.jit output is). None: a host
    # value or a value the program makes (what an outer jax.jit's tracer is)
    committed: bool | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass(frozen=True, slots=True)
class ComputeNode:
    id: int
    name: str
    fn: Any                       # the CompiledFunction
    signature: Any                # key into fn's executable cache
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    island: int
    devices: tuple[int, ...]
    # the executable compiled for those devices when the call was traced: the plan runs this
    # one, even if the slice moved since (``ctl.remap`` from another thread)
    exe: Any


@dataclass(frozen=True, slots=True)
class TransferNode:
    id: int
    name: str
    input: int
    output: int
    src: int | None               # island id, None for the host
    dst: int
    src_devices: tuple[int, ...]
    devices: tuple[int, ...]
    link: LinkKind | str
    nbytes: int
    # jax.device_put may hand back the source's own buffer where a device holds the same block
    # in both layouts (even with may_alias=False): the executor must copy, since the runtime
    # frees this node's output and the source may be the user's
    shares_buffers: bool = False
    # a ``host`` upload of several values at once (``Graph.upload``): the (input, output)
    # pairs after the first; ``nbytes`` is then all of theirs
    more: tuple[tuple[int, int], ...] = ()

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.input, *(i for i, _ in self.more))

    @property
    def outputs(self) -> tuple[int, ...]:
        return (self.output, *(o for _, o in self.more))


Node = ComputeNode | TransferNode


# what a jax.stages.Traced has and a program's Graph does not (``Graph.__getattr__``)
_TRACED_ONLY = frozenset({"jaxpr", "out_info", "args_info", "lower", "in_tree", "fun_name",
                          "out_avals"})


@dataclass
class Graph:
    """A traced program. ``inputs``: value ids of the flattened arguments; ``consts``: values
    captured while tracing; ``outputs``: the result pytree's leaves (value ids)."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    values: dict[int, ValueSpec] = field(default_factory=dict)
    inputs: list[int] = field(default_factory=list)
    consts: dict[int, Any] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    out_tree: Any = None
    copies_arguments: bool = True  # an argument returned as it is comes back as a new array
    controller: Any = None        # set by the first compiled-function call
    epoch: int = -1               # the resource manager's mapping epoch when traced
    _transfers: dict[tuple[int, Any], int] = field(default_factory=dict)
    # its compiled plan (runtime/plan.py), made on first submission; not copied by replace()
    plan: Any = field(default=None, init=False, repr=False, compare=False)

    def bind(self, controller, epoch: int, island_of) -> None:
        """Attach the graph to its controller; find the island of each device input."""
        self.controller, self.epoch = controller, epoch
        for vid in self.inputs:
            spec = self.values[vid]
            if spec.sharding is not None:
                isl = island_of(spec.sharding.device_set)
                self.values[vid] = ValueSpec(vid, spec.shape, spec.dtype, spec.sharding,
                                             None if isl is None else isl.id, spec.weak,
                                             spec.committed)

    def __getattr__(self, name: str):
        # (only for names a Graph lacks: what jax.jit(...).trace(...) gives has them)
        if name in _TRACED_ONLY:
            raise AttributeError(
                f"a program's trace is its dataflow graph (one node per compiled-function call "
                f"and transfer), not one computation, so it has no .{name} as jax.jit's "
                f"Traced has. Maybe you want fn.trace(*args).{name} for one pw.function it "
                "calls, its nodes (graph.nodes, each ComputeNode's .exe), or "
                "prog.eval_shape(*args) for the result's types.")
        raise AttributeError(f"'Graph' object has no attribute {name!r}")

    def stale(self) -> bool:
        """True when the graph must be traced again (controller closed, or slices moved)."""
        ctl = self.controller
        return ctl is None or ctl.closed or ctl.resources.epoch != self.epoch

    def new_value(self, shape, dtype, sharding=None, island=None, weak=False,
                  committed: bool | None = None) -> ValueSpec:
        spec = ValueSpec(len(self.values), tuple(shape), as_dtype(dtype), sharding, island,
                         weak, committed)
        self.values[spec.id] = spec
        return spec

    def placed(self, value: int, sharding, island: int, devices: tuple[int, ...],
               uploads: list | None = None) -> int:
        """The id of ``value`` laid out as ``sharding``: itself, or a (shared) transfer's output.
        ``uploads``: a host value's copy joins it as (input, output), for ``upload`` to make
        one node of, instead of a node of its own."""
        spec = self.values[value]
        if spec.sharding is not None and _same_layout(spec.sharding, sharding, spec.shape):
            return value
        key = (value, sharding)
        if key in self._transfers:
            return self._transfers[key]
        out = self.new_value(spec.shape, spec.dtype, sharding, island, spec.weak)
        if spec.sharding is None or spec.island is None:
            link, src, src_devices = "host", None, ()
            if uploads is not None:
                uploads.append((value, out.id))
                self._transfers[key] = out.id
                return out.id
        else:
            link = LinkKind.ICI.value if spec.island == island else LinkKind.DCN.value
            src, src_devices = spec.island, tuple(sorted(d.id for d in spec.sharding.device_set))
        name = f"{link}:{'host' if src is None else src}->{island}"
        shares = src is not None and _shares_blocks(spec.sharding, sharding, spec.shape)
        self.nodes.append(TransferNode(len(self.nodes), name, value, out.id, src, island,
                                       src_devices, devices, link, spec.nbytes, shares))
        self._transfers[key] = out.id
        return out.id

    def upload(self, uploads: list[tuple[int, int]], island: int,
               devices: tuple[int, ...]) -> None:
        """One ``host`` transfer for every host value of one call (``placed``'s ``uploads``):
        one task, one span in the trace, and one ``jax.device_put`` of them all."""
        if not uploads:
            return
        (first, out), *more = uploads
        nbytes = sum(self.values[v].nbytes for v, _ in uploads)
        self.nodes.append(TransferNode(len(self.nodes), f"host:host->{island}", first, out,
                                       None, island, (), devices, "host", nbytes,
                                       more=tuple(more)))

    def copied(self, value: int) -> int:
        """A copy of ``value`` on its own devices: what a program returns where it returns one
        value twice (``jax.jit`` returns two arrays: donating one leaves the other)."""
        spec = self.values[value]
        out = self.new_value(spec.shape, spec.dtype, spec.sharding, spec.island, spec.weak)
        devices = tuple(sorted(d.id for d in spec.sharding.device_set))
        self.nodes.append(TransferNode(len(self.nodes), f"copy:{spec.island}", value, out.id,
                                       spec.island, spec.island, devices, devices,
                                       LinkKind.ICI.value, spec.nbytes, True))
        return out.id

    def take_result(self, result, program: str, copy_arguments: bool = True) -> None:
        """``result``, what program ``program`` returned, as the graph's ``outputs`` and
        ``out_tree``: every leaf a ``Value`` of this graph. A value returned again, and (with
        ``copy_arguments``) an argument returned as it is, comes back as its own copy, as
        ``jax.jit`` returns a new array (a host value is put on a device anew)."""
        leaves, self.out_tree = jax.tree_util.tree_flatten_with_path(result)
        self.copies_arguments = copy_arguments
        returned = {*self.inputs, *self.consts} if copy_arguments else set()
        for path, leaf in leaves:
            if not isinstance(leaf, Value) or leaf.graph is not self:
                raise ProgramError(
                    f"program {program} returned {type(leaf).__name__} {leaf!r:.40} at "
                    f"{jax.tree_util.keystr(path) or 'its result'}; a program returns the "
                    "values of its compiled-function calls. Maybe you want to compute it in a "
                    "pw.function, or keep it out of the program's result.")
            spec = self.values[leaf.id]
            again = leaf.id in returned and spec.island is not None and spec.sharding
            self.outputs.append(self.copied(leaf.id) if again else leaf.id)
            returned.add(leaf.id)

    def add_compute(self, name: str, fn, signature, inputs, outputs, island, devices,
                    exe) -> None:
        self.nodes.append(ComputeNode(len(self.nodes), name, fn, signature, tuple(inputs),
                                      tuple(outputs), island, tuple(devices), exe))


def _shares_blocks(a, b, shape) -> bool:
    """Some device holds the same block of the array in layout ``a`` and in layout ``b``."""
    if a.device_set.isdisjoint(b.device_set):
        return False
    try:
        ia, ib = a.devices_indices_map(shape), b.devices_indices_map(shape)
    except Exception:  # a layout JAX cannot index: assume the worst
        return True
    return any(ia[d] == ib[d] for d in ia.keys() & ib.keys())


def _same_layout(a, b, shape) -> bool:
    if a == b:
        return True
    try:
        return a.is_equivalent_to(b, len(shape))
    except Exception:  # shardings of different kinds: not equivalent
        return False


class Value(ArrayOnDemand):
    """A placeholder for a value while a program is traced: shape, dtype and sharding only.
    Whatever needs the value itself (operators, ``jax.Array``'s methods, ``jnp`` functions,
    comparisons, ``range(v)``) raises ``NeedsValueError``, which says where the work goes."""

    __slots__ = ("graph", "id", "shape", "dtype", "sharding", "weak_type")

    def __init__(self, graph: Graph, vid: int):
        spec = graph.values[vid]
        self.graph, self.id = graph, vid
        self.shape, self.dtype, self.sharding = spec.shape, spec.dtype, spec.sharding
        self.weak_type = spec.weak

    def result(self, *_, **__):
        raise NeedsValueError(
            f"inside @pw.program, values (here one of shape {self.shape}) are futures of "
            "computations that have not run yet; only compiled functions can operate on them. "
            "Maybe you want to put this operation inside a pw.function."
        )

    def __repr__(self) -> str:
        return f"Value(shape={self.shape}, dtype={self.dtype})"

    __str__ = __repr__  # (printed while tracing, as a tracer prints)


def call_traced(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``, a program's Python while it is traced. A ``jnp`` function or
    ``jax.jit`` given a ``Value`` catches its ``NeedsValueError`` (a ``TypeError``) and raises
    its own, which says to mark the argument static: that one becomes the ``NeedsValueError``
    again, which says where the work goes, with JAX's error as its cause."""
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        inner = e.__context__
        if isinstance(e, NeedsValueError) or not isinstance(inner, NeedsValueError):
            raise
        raise NeedsValueError(str(inner)) from e

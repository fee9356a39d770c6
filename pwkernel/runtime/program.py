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

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
from jax._src import config as jax_config
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import executor as executors
from .arguments import (
    Arguments,
    NotAnArray,
    Traced,
    Tracer,
    constants_as_values,
    not_an_array,
    placement_key,
    under_a_trace,
    value_id,
)
from .errors import ProgramError, SliceError, retyped
from .executable import Executable
from .graph import Graph, Value, call_traced
from .keywords import suggests_keywords
from .objects import Future
from .placements import placements
from .resources import Island, VirtualSlice
from .specialization import Specialization, compile_here
from .specs import (
    BATCH,
    INFERRED,
    Batch,
    Inferred,
    batch_spec,
    check_committed,
    check_spec,
    check_specs_arg,
    explicit_axes,
    from_shardings,
    is_spec,
    on_mesh,
    out_spec_leaves,
    spec_leaves,
    tracing_error,
)
from .stages import JitStages, ProgramStages, check_jit_options, check_program_options, keep_latest

__all__ = ["BATCH", "INFERRED", "Batch", "CompiledFunction", "Executable", "Inferred",
           "Program", "Specialization", "Value", "function", "program", "spec_leaves"]

_tracing = threading.local()
_config = jax.config
_flatten, _unflatten = jax.tree_util.tree_flatten, jax.tree_util.tree_unflatten


def _current_graph() -> Graph | None:
    return getattr(_tracing, "graph", None)


def _values(tree):
    """``tree`` with its futures' values in their place (what eager code is given)."""
    return jax.tree_util.tree_map(lambda v: v.result() if isinstance(v, Future) else v, tree)


def _traced_under() -> tuple:
    """JAX's options that change what a trace makes (its trace context), as ``jax.jit``'s
    cache key holds them: a function traced before ``jax_enable_x64``, a matmul precision,
    the threefry mode or the dtype promotion rule changed is traced again under the new."""
    return jax_config.trace_context()  # (JAX's own key; it has no public name)


class CompiledFunction(JitStages):
    """``jax.jit`` placed on a virtual slice: its call conventions, values and shardings under
    ``jax.set_mesh(slice.mesh)`` (see ``function``).

    >>> double = pw.function(lambda x: x * 2, slice=s0)                    # doctest: +SKIP
    >>> double(np.arange(4.0)).result()                                    # doctest: +SKIP
    Array([0., 2., 4., 6.], dtype=float32)
    """

    def __init__(self, fn: Callable, slice: VirtualSlice, in_specs=None, out_specs=None,
                 name: str | None = None, sim_cost=None, static_argnums=None,
                 static_argnames=None, donate_argnums=None, donate_argnames=None,
                 in_shardings=None, out_shardings=None, keep_unused: bool = False,
                 inline: bool = False, device=None, backend=None, compiler_options=None):
        if not callable(fn):
            raise ProgramError(f"pw.function needs a callable, got {type(fn).__name__}.")
        if slice is None:  # (``@pw.function`` bare, as ``@jax.jit`` is written)
            raise ProgramError("pw.function needs slice=, the devices it runs on: "
                               "@pw.function(slice=ctl.slice(2)) with ctl = pw.controller() "
                               "(a %%pathways cell runs plain JAX code with no pw.function).")
        if not isinstance(slice, VirtualSlice):
            hint = ("ctl.slice(2)" if not isinstance(slice, Island) else
                    f"ctl.slice({len(slice.devices)}, island={slice.id})")  # all its devices
            raise SliceError(
                f"pw.function needs slice= a VirtualSlice (from ctl.slice(...)), got "
                f"{type(slice).__name__}. Maybe you want slice={hint}."
            )
        if name is not None and not isinstance(name, str):
            raise ProgramError(f"pw.function's name must be a str, got {type(name).__name__}.")
        check_jit_options(name or getattr(fn, "__name__", "fn"), keep_unused, inline, device,
                          backend, compiler_options)
        self.keep_unused, self.inline = keep_unused, inline
        # jax.jit's in_shardings (not pwkernel's in_specs): a host value (or an uncommitted
        # array) is typed as jax.jit types it, and a committed one must agree with them
        self.jit_in_shardings = in_shardings is not None
        in_specs = from_shardings("in_shardings", in_shardings, in_specs, slice.mesh)
        out_specs = from_shardings("out_shardings", out_shardings, out_specs, slice.mesh)
        check_specs_arg("in_specs", in_specs)
        check_specs_arg("out_specs", out_specs)
        self.fn, self.slice = fn, slice
        self.in_specs, self.out_specs = in_specs, out_specs
        self.name = name or getattr(fn, "__name__", "fn")
        if self.name == "<lambda>":
            self.name = "lambda"
        # a backend's hint (sim_cost): only the backend that owns it reads it, or refuses it
        self.hint = sim_cost
        if sim_cost is not None:
            executors.check_hint(slice.controller.executor, self.name, sim_cost)
        self.arguments = Arguments(fn, self.name, static_argnums, static_argnames,
                                   donate_argnums, donate_argnames)
        self._new_caches()  # (its traces: cleared by clear_cache() and jax.clear_caches())
        functools.update_wrapper(self, fn, updated=())

    @property
    def sim_cost(self) -> Any:
        """What ``pw.function(..., sim_cost=)`` was given (the backend hint)."""
        return self.hint

    @property
    def controller(self):
        return self.slice.controller

    def _in_shardings(self, args, kwargs, in_avals) -> tuple[list, list, list[str]]:
        """Each input leaf's sharding, its type's (None: its own), and who chose it."""
        vs = self.slice
        mesh = vs.mesh
        n, specs = len(in_avals), self.in_specs
        if self.jit_in_shardings and kwargs:
            raise retyped(ProgramError(
                f"{self.name}: keyword arguments ({', '.join(sorted(kwargs))}) with "
                "in_shardings: jax.jit takes positional arguments only when in_shardings is "
                "given. Pass them positionally, or give in_specs instead."), ValueError)
        if specs is None or is_spec(specs):  # one spec (or the default) for every input
            given = [specs] * n
        else:  # one per positional argument; keyword arguments take the default
            given = spec_leaves(specs, args, "in_shardings" if self.jit_in_shardings
                                else "in_specs", self.arguments.static_nums)
            given += [None] * (n - len(given))
        shardings, typed, why = [], [], []
        for i, ((shape, _, placed, _, committed), spec) in enumerate(
                zip(in_avals, given, strict=True)):
            what, own = f"{self.name}: input {i} in_specs", False  # own: typed by itself
            loose = placed is None or committed is False  # (jax.jit types it by its value)
            if spec is None or spec is INFERRED:
                kept = on_mesh(placed, mesh)
                spec = placed.spec if kept else P()
                why.append("kept from the argument" if kept else "pwkernel's default: replicated")
            elif spec is BATCH:
                spec = batch_spec(shape, vs, what)
                why.append("in_specs=pw.BATCH")
            elif self.jit_in_shardings and loose and explicit_axes(spec, mesh):
                # as jax.jit on explicit axes: placed as asked, typed replicated (by itself)
                what, own = f"{self.name}: input {i} in_shardings", True
                why.append("a host value under in_shardings: typed replicated, as jax.jit does")
            else:
                if self.jit_in_shardings and committed and not loose:
                    check_committed(self.name, i, shape, placed, spec, mesh)
                why.append("your in_specs")
            check_spec(spec, shape, mesh, what)
            shardings.append(NamedSharding(mesh, spec))
            typed.append(None if own else shardings[-1])
        return shardings, typed, why

    def _compile(self, in_tree, in_avals, statics, _options) -> Executable:
        vs = self.slice
        mesh = vs.mesh
        dyn, kwargs = _unflatten(in_tree, [jax.ShapeDtypeStruct(s, d, weak_type=w)
                                           for s, d, _, w, _ in in_avals])
        in_shardings, typed, why = self._in_shardings(dyn, kwargs, in_avals)
        rebuild, fn = self.arguments.rebuild, self.fn

        def body(*leaves):  # the user's function over the flat dynamic leaves
            a, k = _unflatten(in_tree, leaves)
            full, kw = rebuild(a, k, statics)
            return fn(*full, **kw)

        structs = tuple(jax.ShapeDtypeStruct(s, d, sharding=sh, weak_type=w)
                        for (s, d, _, w, _), sh in zip(in_avals, typed, strict=True))
        # the one trace of the user's Python for this signature, by jax.jit of the function
        # itself (so JAX's errors name it and its arguments); its inputs are the flat leaves
        full, kw = rebuild(*_unflatten(in_tree, structs), statics)
        try:
            with vs.ambient():
                traced = self.inlined.trace(*full, **kw)
        except Exception as e:
            raise tracing_error(self.name, e, in_avals, in_shardings, why, vs) from e
        out_struct = traced.out_info

        def flat(*leaves):  # the body again (for lowering on another mesh: sim.xla_cost)
            return tuple(jax.tree_util.tree_leaves(body(*leaves)))

        out_leaves, out_tree = jax.tree_util.tree_flatten(out_struct)
        out_specs = out_spec_leaves(self.name, self.out_specs, out_struct)
        out_shardings = []
        for i, (o, spec) in enumerate(zip(out_leaves, out_specs, strict=True)):
            if spec is None or spec is INFERRED:
                out_shardings.append(None)  # jit: left to JAX, read back once compiled
                continue
            spec = batch_spec(o.shape, vs, f"{self.name}: output {i}") if spec is BATCH else spec
            check_spec(spec, o.shape, mesh, f"{self.name}: output {i} out_specs")
            out_shardings.append(NamedSharding(mesh, spec))
        spec = Specialization(self.name, vs, traced.jaxpr, flat, structs, tuple(in_shardings),
                              tuple(out_leaves), tuple(out_shardings), out_tree,
                              self.arguments.donated_leaves(dyn, kwargs, statics), self.hint,
                              self.keep_unused)
        lower = getattr(self.controller.executor, "compile", None)
        if lower is not None:  # the backend lowers it itself (the simulator: for its chips)
            return lower(spec)
        try:
            return compile_here(spec)
        except Exception as e:
            raise tracing_error(self.name, e, in_avals, in_shardings, why, vs) from e

    def __call__(self, *args, **kwargs):
        dispatch = self.arguments.pop_dispatch(kwargs)
        if _config.jax_disable_jit:  # under jax.disable_jit(): eager, as jax.jit is then
            with self.slice.ambient():
                return self.inlined(*_values(args), **_values(kwargs))
        dyn, dkw, statics = self.arguments.split(args, kwargs)
        graph = _current_graph()
        try:
            if under_a_trace():  # (also while a program's graph is built: its compile)
                raise Traced
            if graph is not None:
                return _record_call(graph, self, dyn, dkw, statics)
            if dispatch is None:
                return self._program(statics)(dyn, dkw)
            return self._program(statics)(dyn, dkw, dispatch=dispatch)
        except Traced:  # on JAX tracers: what a nested jax.jit is
            return self.on_tracers(args, kwargs)
        except NotAnArray:
            raise not_an_array(self.name, "a compiled function", args, kwargs,
                               self.arguments) from None

    def _program(self, statics) -> Program:
        """The one-node program of a call with these static values (its own graph cache)."""
        program = self._programs.get(statics)
        if program is None:
            self.arguments.check_new(statics)
            keep_latest(self._programs, statics, program := Program(
                lambda a, k: _record_call(_current_graph(), self, a, k, statics),
                name=self.name, inline=None))
        return program

    def __get__(self, obj, objtype=None):  # a method, as a jax.jit-decorated one binds self
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"pw.function({self.name}, slice={self.slice!r})"


def _record_call(graph: Graph, fn: CompiledFunction, args: tuple, kwargs: dict, statics):
    """Add one compute node (and the transfers its inputs need) to the graph being traced."""
    leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    if any(isinstance(leaf, Tracer) for leaf in leaves):
        raise Traced  # (before the graph gains anything of this call)
    vs = fn.slice
    island, devices = vs.island.id, vs.device_ids
    ctl = fn.controller
    if graph.controller is None:
        graph.bind(ctl, ctl.resources.epoch, ctl.resources.island_of)
    elif graph.controller is not ctl:
        raise ProgramError(f"{fn.name} is on a slice of {ctl!r}, but the functions this "
                           f"program called before it are on another controller, "
                           f"{graph.controller!r}; a program "
                           "runs on one controller. Place its functions on slices of one "
                           "controller (ctl.slice(...)), or call them as separate programs "
                           "and pass fut.result() from one to the next.")
    vids = [value_id(graph, leaf, fn.name) for leaf in leaves]
    values = graph.values
    # (committed only where jax.jit's in_shardings read it: else one trace serves both)
    avals = tuple((values[v].shape, values[v].dtype, values[v].sharding, values[v].weak,
                   values[v].committed if fn.jit_in_shardings else None) for v in vids)
    signature = (in_tree, avals, statics, _traced_under())
    exe = fn.executable(signature)
    # the call's host values go up together where the backend can (one task, one device_put)
    uploads = [] if getattr(ctl.executor, "batches_uploads", False) else None
    inputs = [graph.placed(v, sh, island, devices, uploads)
              for v, sh in zip(vids, exe.in_shardings, strict=True)]
    graph.upload(uploads or [], island, devices)
    outs = [graph.new_value(o.shape, o.dtype, sh, island, o.weak_type)
            for o, sh in zip(exe.out_shapes, exe.out_shardings, strict=True)]
    graph.add_compute(fn.name, fn, signature, inputs, [o.id for o in outs], island, devices,
                      exe)
    return jax.tree_util.tree_unflatten(exe.out_tree, [Value(graph, o.id) for o in outs])


class Program(ProgramStages):
    """A Python function over compiled functions, traced into one dataflow graph.

    >>> @pw.program
    ... def f(v):
    ...     x = a(v)
    ...     return b(x), a(c(x))
    >>> y, z = f(np.array([1.0, 2.0]))        # doctest: +SKIP
    """

    def __init__(self, fn: Callable, name: str | None = None, inline: Any = ...,
                 static_argnums=None, static_argnames=None, returns_copies: bool = True):
        if not callable(fn):
            raise ProgramError(f"pw.program needs a callable (the function to trace), got "
                               f"{type(fn).__name__}. Maybe you want @pw.program above a def.")
        self.fn = fn
        # an argument returned as it is comes back as a new array, as from ``jax.jit``
        # (False: the same object, as a notebook cell's ``a = x`` binds it)
        self.returns_copies = returns_copies
        self.name = name or getattr(fn, "__name__", "program")
        # what a call on JAX tracers runs (``Traced``): the function itself, its compiled
        # functions inlined; None: the caller handles it (a ``pw.function``'s own program)
        self.inline = fn if inline is ... else inline
        self.arguments = Arguments(fn, self.name, static_argnums, static_argnames, None, None)
        self._statics = bool(self.arguments.static_nums or self.arguments.static_names)
        self._new_caches()  # (its graphs: cleared by clear_cache() and jax.clear_caches())
        functools.update_wrapper(self, fn, updated=())

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """The dynamic arguments and the static ones' key (as ``jax.jit`` splits them)."""
        if not self._statics:
            return args, kwargs, ()
        return self.arguments.split(args, kwargs)

    def trace(self, *args, **kwargs) -> Graph:
        """The dataflow graph for these arguments (traced now, or from the cache): its nodes
        are the compiled-function calls and the transfers between slices (unlike
        ``jax.jit(...).trace``, whose result is one jaxpr; see ``lower``)."""
        args, kwargs, statics = self._split(args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        self.refuse_tracers(leaves)
        return self._graph(tree, leaves, statics)

    def _graph(self, tree, leaves, statics: tuple = ()) -> Graph:
        tracing = _current_graph()
        key = (tree, tuple([leaf.placement if type(leaf) is Future and leaf.placement
                            else placement_key(leaf, tracing) for leaf in leaves]), statics,
               _traced_under())  # (a future's inline: a training state has dozens)
        last = self._last  # the key of the last call, compared without hashing: a program's
        if last is not None and last[0] == key:  # futures share their placement tuples
            graph = last[1]
        else:
            graph = self._graphs.get(key)
        if graph is None or graph.stale():
            with self._lock:
                graph = self._graphs.get(key)
                if graph is None or graph.stale():
                    with placements.tracing():  # (no slice moves while it is traced)
                        keep_latest(self._graphs, key, graph := self._build(key))
        self._last = (key, graph)
        return graph

    def _build(self, key) -> Graph:
        tree, placement, statics, _ = key
        graph = Graph(self.name)
        values = []
        for kind, shape, dtype, sharding, weak in placement:
            spec = graph.new_value(shape, dtype, None if kind == "host" else sharding, weak=weak,
                                   committed=kind == "dev" if kind in ("dev", "loose") else None)
            graph.inputs.append(spec.id)
            values.append(Value(graph, spec.id))
        args, kwargs = jax.tree_util.tree_unflatten(tree, values)
        if statics:
            self.arguments.check_new(statics)
            args, kwargs = self.arguments.rebuild(args, kwargs, statics)
        outer, _tracing.graph = _current_graph(), graph  # (outer: a program traced around
        try:                                                # this one's eval_shape or trace)
            result = call_traced(self.fn, args, kwargs)
        finally:
            _tracing.graph = outer
        if graph.controller is None:  # (before its constants: they are placed by its slices)
            raise ProgramError(f"program {self.name} called no compiled function; wrap the "
                               "work in pw.function(fn, slice=...) and call that.")
        if self.returns_copies:  # (a cell's plain values stay plain: see notebook/cell.py)
            result = constants_as_values(graph, result, self.name)
        graph.take_result(result, self.name, copy_arguments=self.returns_copies)
        return graph

    def __call__(self, *args, **kwargs):
        """Submit the program on ``args`` and ``kwargs``; ``dispatch="sequential"`` (or
        ``"parallel"``) for this call only, else the controller's mode (unless the function
        has a parameter of that name: then it is the function's). Inside another program:
        inlined."""
        dispatch = self.arguments.pop_dispatch(kwargs)
        if getattr(_tracing, "graph", None) is not None:
            return self.fn(*args, **kwargs)  # inside another trace: inline this program's calls
        if self.inline is not None and _config.jax_disable_jit:  # eager (a pw.function's own
            return self.fn(*args, **kwargs)                        # program: its caller is)
        dyn, dkw, statics = self._split(args, kwargs)
        leaves, tree = _flatten((dyn, dkw))
        try:
            if self.inline is not None and under_a_trace():
                raise Traced
            graph = self._graph(tree, leaves, statics)
        except Traced:
            if self.inline is None:
                raise
            return self.inline(*args, **kwargs)
        except NotAnArray:
            if self.inline is None:  # (a pw.function's own program: it names the argument)
                raise
            raise not_an_array(self.name, "a program", args, kwargs, self.arguments) from None
        futures = graph.controller.submit(graph, leaves, dispatch)
        return _unflatten(graph.out_tree, futures)

    def __get__(self, obj, objtype=None):  # a method: binds self (see CompiledFunction)
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"pw.program({self.name})"


def program(fn: Callable | None = None, *, name: str | None = None, static_argnums=None,
            static_argnames=None, **jit_options):
    """Decorator: trace ``fn`` into one dataflow program (see ``Program``).
    ``static_argnums``/``static_argnames``: arguments that are Python values at trace time
    (a layer count, a mode string), part of the graph's cache key, as in ``jax.jit``.
    ``jax.jit``'s other options (donation, shardings, ...) belong to the ``pw.function``s a
    program calls: given here, they are refused with where to give them."""
    if name is not None and not isinstance(name, str):
        raise ProgramError(f"pw.program's name must be a str, got {type(name).__name__}.")
    check_program_options(name or getattr(fn, "__name__", "program"), jit_options)

    def make(f):
        return Program(f, name=name, static_argnums=static_argnums,
                       static_argnames=static_argnames)
    return make if fn is None else make(fn)


@suggests_keywords("pw.function")
def function(fn: Callable | None = None, *, slice: VirtualSlice | None = None, in_specs=None,
             out_specs=None, static_argnums=None, static_argnames=None, donate_argnums=None,
             donate_argnames=None, name: str | None = None, sim_cost=None, in_shardings=None,
             out_shardings=None, keep_unused: bool = False, inline: bool = False, device=None,
             backend=None, compiler_options=None):
    """``jax.jit`` placed on ``slice``; usable as ``pw.function(fn, slice=s)`` or a decorator.

    Calls as ``jax.jit`` does (positional and keyword arguments, pytrees, ``static_argnums``/
    ``static_argnames``, ``donate_argnums``/``donate_argnames``) with the values and shardings
    of ``jax.jit`` under ``jax.set_mesh(slice.mesh)``. Inputs: an array or future already on the
    slice's mesh keeps its sharding; anything else is replicated. Outputs: laid out as JAX lays
    them out (``pw.INFERRED``).

    ``in_specs``: one spec for every input, or one pytree prefix per positional argument
    (keyword arguments take the default), each a ``PartitionSpec``, ``pw.BATCH`` (the leading
    axis over the whole slice: data parallelism) or None (the default). ``out_specs``: a
    pytree prefix of the result (``PartitionSpec``, ``pw.BATCH``, ``pw.INFERRED``).
    ``in_shardings``/``out_shardings``: the same, as ``jax.jit`` takes them (pytrees of
    ``NamedSharding``, ``PartitionSpec`` or None): each NamedSharding's spec is used on the
    slice's mesh, so code written for ``jax.jit`` keeps its arguments. Give one of
    ``in_specs`` and ``in_shardings`` (and of ``out_specs`` and ``out_shardings``).
    Called inside ``jax.jit``, ``jax.grad``, ``jax.vmap`` or another ``pw.function``'s body
    it is what a nested ``jax.jit`` is: its body, traced inline (see ``on_tracers``).

    ``sim_cost``: on a simulated controller (``backend="sim"``), the seconds one call takes
    (or a ``pw.sim.Cost``), for what XLA's cost analysis cannot estimate (the function's
    backend ``hint``); elsewhere unused.

    ``keep_unused``, ``inline``: as ``jax.jit``'s (an unread input stays an input of the
    computation; on JAX tracers, its equations go into the caller's trace).
    ``device``, ``backend`` and ``compiler_options`` are refused, with what to use instead.
    Beside the call, as on a ``jax.jit`` function: ``trace``, ``lower``, ``eval_shape`` and
    ``clear_cache`` (``runtime/stages.py``).
    """
    def make(f):
        return CompiledFunction(f, slice, in_specs, out_specs, name, sim_cost, static_argnums,
                                static_argnames, donate_argnums, donate_argnames, in_shardings,
                                out_shardings, keep_unused, inline, device, backend,
                                compiler_options)
    return make if fn is None else make(fn)

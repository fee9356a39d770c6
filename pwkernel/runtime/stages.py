"""What a ``jax.jit`` function offers beside its call, for a ``pw.function``: ``trace`` (a
``jax.stages.Traced``), ``lower``, ``eval_shape``, ``clear_cache``, ``_cache_size`` and the
function it wraps; and the ``jax.jit`` options it takes (``keep_unused``, ``inline``) or cannot
take (``device``, ``backend``: the slice places it; ``compiler_options``: see
``check_jit_options``).

Each stage is the specialization a call with the same arguments runs (compiled once, kept in
the function's cache), seen as ``jax.jit``'s stages see it: over the call's dynamic arguments
as the caller passes them, with the shardings pwkernel places them with.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import AxisType

from .arguments import Traced, Tracer
from .compiled import keep_latest
from .errors import ProgramError, retyped
from .executable import Executable
from .graph import ComputeNode, Graph
from .jax_caches import ClearedByJax
from .keywords import unexpected_keyword
from .specialization import lower_as_called, trace_as_called
from .specs import BATCH, INFERRED, batch_spec, is_spec, prefix_leaves, spec_leaves

__all__ = ["JitStages", "ProgramStages", "check_jit_options", "check_program_options",
           "keep_latest"]


def check_jit_options(name: str, keep_unused, inline, device, backend,
                      compiler_options) -> None:
    """``jax.jit``'s options as ``pw.function`` takes them: ``keep_unused`` and ``inline`` are
    bools; ``device`` and ``backend`` choose devices, which the slice chooses here;
    ``compiler_options`` are not carried to every backend's compiler (Ray's islands compile
    an exported computation), so they are given to one compile by hand."""
    for what, value in (("keep_unused", keep_unused), ("inline", inline)):
        if not isinstance(value, bool):
            raise retyped(ProgramError(
                f"{name}: {what} must be True or False (as jax.jit takes it), got "
                f"{value!r}."), ValueError)
    for what, value in (("device", device), ("backend", backend)):
        if value is not None:
            raise retyped(ProgramError(
                f"{name}: pw.function runs on the devices of its slice=, so jax.jit's "
                f"{what}={value!r} cannot apply (JAX deprecates it too). Leave it out and "
                "choose the devices with the slice: slice=ctl.slice(n, island=i)."),
                ValueError)
    if compiler_options:
        raise retyped(ProgramError(
            f"{name}: pw.function does not take jax.jit's compiler_options (its computations "
            "are compiled for each backend's islands, and not every backend carries them). "
            "Give them to one compile ahead of time: fn.lower(*args).compile("
            "compiler_options), or set XLA_FLAGS before JAX starts."), ValueError)


_JIT_OPTIONS = ("donate_argnums", "donate_argnames", "in_shardings", "out_shardings",
                "keep_unused", "inline", "device", "backend", "compiler_options")


def check_program_options(name: str, given: dict) -> None:
    """``@pw.program``'s keyword arguments beside its own: ``jax.jit``'s options, which belong
    to the compiled functions a program calls, refused with where to give them; anything
    else refused as Python refuses an unknown keyword."""
    for key in given:
        if key not in _JIT_OPTIONS:
            raise unexpected_keyword("pw.program", key,
                                     ("name", "static_argnums", "static_argnames"))
    if given:
        key = next(iter(given))
        raise retyped(ProgramError(
            f"program {name}: jax.jit's {key}= does not apply to a program, which is one "
            "computation per pw.function it calls (on their own slices), not one: give it "
            f"to those functions, pw.function(fn, slice=..., {key}=...). A program takes "
            "name=, static_argnums= and static_argnames=."), ValueError)


class OnTracers(Traced, ProgramError, ValueError):
    """A stage (``trace``, ``lower``) given JAX tracers: see ``on_tracers_error``."""


def on_tracers_error(name: str, what: str) -> OnTracers:
    """``trace``/``lower`` on JAX tracers (inside ``jax.jit``, ``jax.grad``, ``jax.vmap``),
    where a call is its body inlined into the computation around it (a nested ``jax.jit``):
    there is no placed computation to give (the slice's mesh cannot be set inside a trace),
    and ``eval_shape`` (which catches it, as ``Traced``) gives what the call gives there."""
    return OnTracers(
        f"{name} was given JAX tracers (inside jax.jit, jax.grad or jax.vmap), where a call "
        "is its body inlined into the computation around it, not a computation placed on its "
        f"slice, so {what}.trace and {what}.lower have none to give. Call them outside the "
        f"transformation (on arrays or jax.ShapeDtypeStructs), or {what}.eval_shape(*args) "
        "for the types the call gives there.")


def without_its_mesh(name: str) -> str:
    """The note on JAX's error from a ``pw.function`` called inside a transformation with no
    mesh ambient (``on_tracers``): its body, traced there as a nested ``jax.jit``, had no mesh,
    and the slice's cannot be set inside a trace."""
    return (f"(pwkernel: {name} was called inside jax.grad, jax.jit or jax.vmap with no mesh "
            "ambient, where it is a nested jax.jit: its body is traced without its slice's mesh, "
            "which it needs. Put the transformation inside the function, "
            f"pw.function(jax.grad({name}), slice=...), to run it on the slice, or make the mesh "
            "ambient around the transformation: with jax.set_mesh(f.slice.mesh): ..., f the "
            "pw.function.)")


class MeshTraced(jax.stages.Traced):
    """``jax.jit``'s ``Traced`` whose call evaluates its jaxpr under the mesh it was traced
    on: a ``jax.jit`` trace made under a mesh needs that mesh when it is called, and the
    caller of ``f.trace`` never set it (the slice's mesh was ambient only while tracing)."""

    __slots__ = ()  # (the same layout as Traced's: an instance changes class in place)

    @classmethod
    def under(cls, traced: jax.stages.Traced, mesh) -> MeshTraced:
        traced.__class__ = cls
        traced.mesh = mesh
        return traced

    def __call__(self, *args, **kwargs):
        with jax.set_mesh(self.mesh):
            return super().__call__(*args, **kwargs)


class JitStages:
    """``jax.jit``'s staged API on a ``CompiledFunction`` (which sets ``fn``, ``slice``,
    ``name``, ``arguments``, ``keep_unused``, ``inline`` and its caches)."""

    fn: Callable
    name: str
    keep_unused: bool
    inline: bool
    in_specs: Any
    out_specs: Any

    def _new_caches(self) -> None:
        """Its caches, empty: specializations by signature and one-node programs by static
        key, cleared by ``clear_cache()`` and by ``jax.clear_caches()`` (as a ``jax.jit``'s)."""
        self._cache: dict[Any, Executable] = {}
        self._programs: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._cleared_by_jax = ClearedByJax(self._forget_traces, f"pw.function {self.name}")

    def specialization(self, *args, **kwargs) -> Executable:
        """The compiled specialization a call with these arguments runs (compiled now if it
        is new; nothing runs)."""
        dyn, dkw, statics = self.arguments.split(args, kwargs)
        if any(isinstance(leaf, Tracer) for leaf in jax.tree_util.tree_leaves((dyn, dkw))):
            raise on_tracers_error(self.name, "fn")  # (eval_shape: what the call gives there)
        graph = self._program(statics).trace(dyn, dkw)
        return next(n for n in graph.nodes if isinstance(n, ComputeNode)).exe

    def eval_shape(self, *args, **kwargs):
        """The result's shapes, dtypes and shardings (``jax.ShapeDtypeStruct``s), as
        ``jax.jit(...).eval_shape`` gives them: what a call's futures say at once."""
        try:
            exe = self.specialization(*args, **kwargs)
        except Traced:  # on JAX tracers: what the call gives there (a nested jax.jit)
            return jax.eval_shape(lambda: self.on_tracers(args, kwargs))
        return jax.tree_util.tree_unflatten(exe.out_tree, [
            jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=sh, weak_type=o.weak_type)
            for o, sh in zip(exe.out_shapes, exe.out_shardings, strict=True)])

    def trace(self, *args, **kwargs) -> jax.stages.Traced:
        """The computation a call with these arguments runs, traced as ``jax.jit(...).trace``
        traces it: ``.jaxpr`` (the equations, over the dynamic arguments' leaves),
        ``.out_info`` (the result's types), ``.args_info`` and ``.lower()``. Over the call's
        arguments (static ones bound), laid out as pwkernel places them; the function's
        Python ran once for this signature (when it was first traced), not again here."""
        exe = self.specialization(*args, **kwargs)
        dyn, dkw, _ = self.arguments.split(args, kwargs)
        with self.slice.ambient():
            traced = trace_as_called(exe, jax.tree_util.tree_structure((dyn, dkw)), self.name)
        return MeshTraced.under(traced, self.slice.mesh)

    def lower(self, *args, **kwargs) -> jax.stages.Lowered:
        """The computation a call with these arguments runs, lowered as ``jax.jit(...).lower``
        lowers it (``.as_text()``, ``.compile().memory_analysis()``, ...): over the call's
        arguments (static ones bound), with the shardings pwkernel placed them with; its
        ``.compile()`` is called as ``jax.jit``'s is. On simulated chips: lowered for them."""
        exe = self.specialization(*args, **kwargs)
        if exe.lowered is not None:
            return exe.lowered
        dyn, dkw, _ = self.arguments.split(args, kwargs)
        with self.slice.ambient():
            return lower_as_called(exe, jax.tree_util.tree_structure((dyn, dkw)), self.name)

    def executable(self, signature) -> Executable:
        """The compiled specialization for ``signature`` ((tree, ((shape, dtype, sharding),
        ...), static key, JAX's options it is traced under: ``program._traced_under``)), by
        the slice's ``version``. What was compiled for where the slice was before a remap
        is never run again: the first compile after one drops it (else every remap would
        keep one more executable per specialization, for as long as the function lives).
        The latest ``compiled.TRACES`` are kept, as ``jax.jit`` bounds its caches."""
        version = self.slice.version
        key = (version, signature)
        exe = self._cache.get(key)
        if exe is None:
            with self._lock:
                exe = self._cache.get(key) or self._compile(*signature)
                if any(v != version for v, _ in self._cache):  # (a moved slice: rare)
                    self._cache = {k: e for k, e in self._cache.items() if k[0] == version}
                keep_latest(self._cache, key, exe)
        return exe

    def clear_cache(self) -> None:
        """Forget every specialization traced and compiled so far, as ``jax.jit``'s
        ``clear_cache()``: the next call runs the function's Python again (to see a global it
        reads that has changed). A ``@pw.program`` that called it keeps its own traced graph,
        as an outer ``jax.jit`` keeps its trace: clear the program's cache too. A call
        already submitted runs what it was compiled with. (XLA's executables stay shared by
        identical computations: ``pwkernel.runtime.compiled``.) ``jax.clear_caches()`` clears
        every function's and program's, as it clears every ``jax.jit``'s."""
        with self._lock:
            self._cache.clear()
            self._programs.clear()
        for jitted in ("inlined", "constrained"):
            if jitted in self.__dict__:
                self.__dict__[jitted].clear_cache()  # (JAX keeps traces of the function too)

    def _cache_size(self) -> int:
        """How many specializations it holds for where its slice is now: ``jax.jit``'s
        ``_cache_size()``, which tests read to see that a call compiled nothing new (one per
        input signature, static value and trace context; ``clear_cache()`` empties it)."""
        version = self.slice.version
        return sum(1 for v, _ in list(self._cache) if v == version)

    def _forget_traces(self) -> None:
        """What ``jax.clear_caches()`` clears here (``jax_caches``): what ``clear_cache``
        forgets, without its lock (JAX clears at exit too, where a runtime thread may hold it
        while it traces). A trace that ends meanwhile keeps its entry in the dict it read."""
        self._cache, self._programs = {}, {}

    def on_tracers(self, args: tuple, kwargs: dict):
        """A call on JAX tracers (``Traced``): what a nested ``jax.jit`` is. Where the
        ambient mesh has the slice's axes, all auto (inside a ``pw.function`` on such a slice,
        or ``jax.jit`` under ``jax.set_mesh``), its specs and shardings lay out its inputs and
        outputs, as a nested ``jax.jit``'s ``in_shardings``/``out_shardings`` do there (the
        compiler propagates from them); on explicit axes a nested ``jax.jit`` keeps the
        types its operations give, and elsewhere the computation around it places it."""
        if self.in_specs is not None or self.out_specs is not None:
            mesh = self.slice.mesh.abstract_mesh
            if (all(t == AxisType.Auto for t in mesh.axis_types)
                    and jax.sharding.get_abstract_mesh() == mesh):
                return self.constrained(*args, **kwargs)
        if not jax.sharding.get_abstract_mesh().empty:
            return self.inlined(*args, **kwargs)
        try:
            return self.inlined(*args, **kwargs)
        except Exception as e:  # (JAX's error, as a nested jax.jit's: add what to do here)
            if self.needs_its_mesh(args, kwargs):
                e.add_note(without_its_mesh(self.name))
            raise

    def needs_its_mesh(self, args: tuple, kwargs: dict) -> bool:
        """Whether a call that failed on tracers with no mesh ambient traces with the slice's
        mesh ambient (its body's ``jax.shard_map`` or ``reshard`` need one): the cause to
        name. Only types are traced, and only after the failure."""
        try:
            with jax.sharding.use_abstract_mesh(self.slice.mesh.abstract_mesh):
                jax.eval_shape(lambda: self.inlined(*args, **kwargs))
        except Exception:
            return False
        return True

    @functools.cached_property
    def constrained(self) -> Callable:
        """``inlined`` with the function's specs as sharding constraints on its dynamic
        inputs and its outputs (``on_tracers``)."""
        nums, names, vs = self.arguments.static_nums, self.arguments.static_names, self.slice

        def constrain(leaves: list, specs: list, what: str) -> list:
            out = []
            for i, (leaf, spec) in enumerate(zip(leaves, specs, strict=True)):
                if spec is BATCH:
                    spec = batch_spec(jax.numpy.shape(leaf), vs, f"{self.name}: {what} {i}")
                out.append(leaf if spec is None or spec is INFERRED
                           else jax.lax.with_sharding_constraint(leaf, spec))
            return out

        def body(*args, **kwargs):
            at = self.arguments.static_at(len(args))
            dyn = tuple(a for i, a in enumerate(args) if i not in at)
            dkw = {k: v for k, v in kwargs.items() if k not in names}
            leaves, tree = jax.tree_util.tree_flatten((dyn, dkw))
            specs = [self.in_specs] * len(leaves) if (
                self.in_specs is None or is_spec(self.in_specs)) else spec_leaves(
                self.in_specs, dyn, "in_specs", nums)  # (keyword arguments: the default)
            dyn, dkw = tree.unflatten(constrain(leaves, specs + [None] * (
                len(leaves) - len(specs)), "input"))
            given = iter(dyn)
            full = [args[i] if i in nums else next(given) for i in range(len(args))]
            out = self.fn(*full, **{**kwargs, **dkw})
            leaves, tree = jax.tree_util.tree_flatten(out)
            return tree.unflatten(constrain(leaves, prefix_leaves(
                self.out_specs, out, f"{self.name}: out_specs"), "output"))

        functools.update_wrapper(body, self.fn)
        return jax.jit(body, static_argnums=nums, static_argnames=names,
                       keep_unused=self.keep_unused, inline=self.inline)

    @functools.cached_property
    def inlined(self) -> Callable:
        """``jax.jit`` of the function with its static arguments: what a call on JAX tracers
        runs (see ``Traced``); donation does not apply there, as in a nested ``jax.jit``.
        ``inline=True`` puts its equations in the caller's trace, as ``jax.jit``'s does."""
        return jax.jit(self.fn, static_argnums=self.arguments.static_nums,
                       static_argnames=self.arguments.static_names,
                       keep_unused=self.keep_unused, inline=self.inline)


class ProgramStages:
    """``jax.jit``'s staged API on a ``Program`` (which sets ``name``, ``arguments``, its graph
    cache and ``trace``: the dataflow graph of a call, not one jaxpr)."""

    name: str

    def _new_caches(self) -> None:
        """Its graphs by signature, empty, cleared by ``clear_cache()`` and by
        ``jax.clear_caches()`` (as a ``jax.jit``'s traces are)."""
        self._graphs: dict[Any, Graph] = {}
        self._last: tuple | None = None  # (key, graph) of the last call
        self._lock = threading.RLock()  # (its own eval_shape while it is traced)
        self._cleared_by_jax = ClearedByJax(self._forget_traces, f"pw.program {self.name}")

    def eval_shape(self, *args, **kwargs):
        """The result's shapes, dtypes and shardings (``jax.ShapeDtypeStruct``s), as
        ``jax.jit(...).eval_shape`` gives them: what a call's futures say at once (traced
        now if new; nothing runs)."""
        self.arguments.pop_dispatch(kwargs)
        try:
            graph = self.trace(*args, **kwargs)
        except Traced:  # on JAX tracers: what the call gives there (its body, inlined)
            return jax.eval_shape(lambda: self(*args, **kwargs))
        specs = [graph.values[v] for v in graph.outputs]
        return jax.tree_util.tree_unflatten(graph.out_tree, [jax.ShapeDtypeStruct(
            v.shape, v.dtype, sharding=v.sharding, weak_type=v.weak) for v in specs])

    def refuse_tracers(self, leaves: list) -> None:
        """``trace`` on JAX tracers: see ``on_tracers_error`` (a ``pw.function``'s own
        program, ``inline=None``, is never given them: ``JitStages`` says it first)."""
        if any(isinstance(leaf, Tracer) for leaf in leaves):
            raise on_tracers_error(f"program {self.name}", "prog")

    def lower(self, *args, **kwargs):
        """Not one computation: see the error (``jax.jit(...).lower`` has one to lower)."""
        raise ProgramError(
            f"program {self.name} is not one computation to lower: each pw.function it calls "
            "is compiled for its own slice, with transfers between them. Lower one function "
            "(fn.lower(*args)), or read the program's dataflow graph (prog.trace(*args): its "
            "nodes, each with .exe.compiled); prog.eval_shape(*args) gives the result's types.")

    def _forget_traces(self) -> None:
        """What ``jax.clear_caches()`` clears here: see ``JitStages._forget_traces``."""
        self._graphs, self._last = {}, None

    def clear_cache(self) -> None:
        """Forget every graph traced so far, as ``jax.jit``'s ``clear_cache()``: the next call
        runs the function's Python again. The compiled functions it calls keep theirs (clear
        those with ``fn.clear_cache()``)."""
        with self._lock:
            self._graphs.clear()
            self._last = None

"""One input signature of a ``pw.function``, traced once: what the runtime compiles in this
process (``compile_here``), or hands to its executor's ``compile(spec)`` hook (the simulator
lowers it for its chips instead; see ``runtime/executor.py``), and ``replay``: the recorded
trace as a function, so that compiling, lowering for simulated chips and exporting never run
the user's Python a second time (``jax.jit`` runs it once per signature too).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend.core as jax_core
from jax.sharding import NamedSharding

from . import callbacks
from .executable import Executable
from .objects import shard_bytes
from .resources import VirtualSlice

_HOST_CALLBACK = re.compile(r'custom_call_target="[^"]*python[^"]*callback')


@dataclass(frozen=True)
class Specialization:
    """One input signature of a ``pw.function``, traced and ready to lower: what the runtime
    compiles in this process, or hands to its executor's ``compile(spec)`` hook (the
    simulator lowers it for its chips instead; see ``runtime/executor.py``)."""

    name: str
    slice: VirtualSlice
    jaxpr: Any                                  # the body traced once (a ClosedJaxpr)
    flat: Callable  # the user's body over flat input leaves -> a tuple (traces it again)
    structs: tuple[jax.ShapeDtypeStruct, ...]   # its inputs, with their shardings
    in_shardings: tuple[NamedSharding, ...]
    out_types: tuple[jax.ShapeDtypeStruct, ...]  # its outputs as JAX's types say
    out_shardings: tuple[NamedSharding | None, ...]  # None: inferred (``pw.INFERRED``)
    out_tree: Any
    donated: tuple[int, ...] = ()               # input leaves it consumes (donate_argnums)
    hint: Any = None  # the function's backend hint (``sim_cost=``), carried unread here
    keep_unused: bool = False  # inputs the body does not read stay the executable's inputs

    @property
    def replay(self) -> Callable:
        """The traced body as a function over the flat input leaves (see ``replay``)."""
        return replay(self.jaxpr)

    def executable(self, out_shardings, compiled=None, call=None, lowered=None,
                   asynchronous: bool = True, aliased: int | None = None) -> Executable:
        """The ``Executable`` with these (decided) output shardings."""
        out_nbytes = tuple(shard_bytes(o.shape, o.dtype, sh)
                           for o, sh in zip(self.out_types, out_shardings, strict=True))
        return Executable(compiled, self.in_shardings,
                          tuple(jax.ShapeDtypeStruct(o.shape, o.dtype, weak_type=o.weak_type)
                                for o in self.out_types),
                          tuple(out_shardings), self.out_tree,
                          sum(max(n.values()) for n in out_nbytes), out_nbytes, asynchronous,
                          call, lowered, self.flat, self.structs, self.donated, self.jaxpr,
                          aliased, self.keep_unused)


def compile_here(spec: Specialization) -> Executable:
    """``spec`` compiled for its slice's devices in this process (what a backend without a
    ``compile`` hook gets): ``jax.jit`` with a fence and guarded host callbacks
    (``callbacks.compile_guarded``); inferred output layouts are what XLA chose."""
    vs = spec.slice
    with vs.ambient():
        compiled, call = callbacks.compile_guarded(
            spec.replay, spec.structs, spec.in_shardings, spec.out_shardings, vs.mesh, spec.name,
            spec.donated, spec.keep_unused)
    out_shardings = [given if given is not None else made for given, made in
                     zip(spec.out_shardings, compiled.output_shardings[:-1],  # (last: the fence)
                         strict=True)]
    # A computation that calls back into Python may run in the launching thread: those are
    # launched by the island's workers, never by the thread that submits. (read from the
    # HLO's custom calls: a plain substring would also match metadata, such as a source file
    # named callbacks.py)
    asynchronous = not _HOST_CALLBACK.search(compiled.as_text())
    return spec.executable(out_shardings, compiled, call, asynchronous=asynchronous,
                           aliased=_aliased(compiled) if spec.donated else 0)


def _aliased(compiled) -> int | None:
    """Bytes per device of the inputs XLA reuses for outputs (None: it does not say)."""
    try:
        return int(compiled.memory_analysis().alias_size_in_bytes)
    except Exception:  # noqa: BLE001 - a backend without memory analysis
        return None


def jitted(exe: Executable, donate: bool = False):
    """``jax.jit`` of an executable's recorded body with its shardings (and its donations, if
    ``donate``): what is exported to another process, never the user's Python. Its result is
    the flat tuple of output leaves. Lower it under the slice's mesh (its types name the mesh's
    axes)."""
    return jax.jit(replay(exe.jaxpr), in_shardings=exe.in_shardings,
                   out_shardings=exe.out_shardings,
                   donate_argnums=exe.donated if donate else (), keep_unused=exe.keep_unused)


def lower_as_called(exe: Executable, in_tree, name: str = "body") -> jax.stages.Lowered:
    """``exe``'s recorded body lowered as ``jax.jit(fn).lower(*args, **kwargs)`` lowers it:
    over the call's dynamic arguments as the caller passes them (``in_tree``: their
    ``(args, kwargs)`` structure, static ones left out), laid out and donated as the call
    would, returning the function's result pytree; so its ``.compile()`` is called as
    ``jax.jit``'s is. Lower it under the slice's mesh."""
    return trace_as_called(exe, in_tree, name).lower()


def trace_as_called(exe: Executable, in_tree, name: str = "body") -> jax.stages.Traced:
    """``exe``'s recorded body traced as ``jax.jit(fn).trace(*args, **kwargs)`` traces it
    (see ``lower_as_called``): its ``.jaxpr`` is the recorded one's equations, its
    ``.out_info`` the result pytree's types, its ``.lower()`` what ``lower_as_called`` gives;
    ``name`` (the function's) names the module as ``jax.jit`` names it (``jit_<name>``).
    Trace it under the slice's mesh."""
    flat, out_tree = replay(exe.jaxpr), exe.out_tree
    args, kwargs = jax.tree_util.tree_unflatten(in_tree, exe.structs)  # (with shardings)

    def body(*a, **k):
        return jax.tree_util.tree_unflatten(out_tree, flat(*jax.tree_util.tree_leaves((a, k))))

    body.__name__ = body.__qualname__ = name

    donated, at, nums, names = set(exe.donated), 0, [], []
    for where, arg in [*enumerate(args), *sorted(kwargs.items())]:  # (leaf order)
        n = len(jax.tree_util.tree_leaves(arg))
        if n and at in donated:  # (a whole argument is donated, or none of it)
            (nums if isinstance(where, int) else names).append(where)
        at += n
    out_shardings = jax.tree_util.tree_unflatten(out_tree, list(exe.out_shardings))
    placed = {}  # a leaf typed by itself is placed by in_shardings (a host value under them,
    if any(s.sharding is None for s in exe.structs):  # which take no keyword arguments)
        placed = {"in_shardings": jax.tree_util.tree_unflatten(in_tree, exe.in_shardings)[0]}
    return jax.jit(body, out_shardings=out_shardings, donate_argnums=tuple(nums),
                   donate_argnames=tuple(names), keep_unused=exe.keep_unused, **placed,
                   ).trace(*args, **kwargs)


def replay(jaxpr) -> Callable:
    """A traced body (``Executable.jaxpr``) as a function over its flat input leaves that
    returns a tuple: tracing it (to compile, to lower for simulated chips, to export) runs the
    recorded equations again, cheaply, never the user's Python a second time. Under the mesh
    it was traced with: its types name that mesh's axes."""
    def flat(*leaves):
        return tuple(jax_core.jaxpr_as_fun(jaxpr)(*leaves))

    return flat

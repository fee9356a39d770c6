"""Host callbacks that fail their computation, not the process.

A ``jax.pure_callback``, ``jax.experimental.io_callback`` or ``jax.debug.callback`` runs Python
while XLA executes. If that Python raises, XLA fails the execution on the device that ran it,
the slice's other devices wait for it at their next collective, and XLA's rendezvous aborts
the whole process about a minute later (exit 134): in a notebook, the user's kernel dies.
pwkernel promises that a failing computation fails its futures and the controller carries on,
so ``compile_guarded`` (what ``pw.function`` compiles with) makes every host callback safe:

- The body is traced once (``jax.jit(...).trace``, the trace a plain compile makes anyway),
  with one more output, a one-byte ``fence`` (see ``LaunchOutputs``): what the executor
  waits on to see the launch end. Without host callbacks it is compiled as it is.
- With them, the traced jaxpr is rewritten: the ``callback`` parameter of each callback
  equation, in sub-jaxprs too (``jit``, ``scan``, ``while``, ``cond``, ``shard_map``,
  ``checkpoint``, ``custom_jvp``/``custom_vjp``, whose rules are dropped: nothing
  differentiates a compiled body), becomes a ``_Guard`` that calls the user's function, checks
  its results against the declared shapes and dtypes (a mismatch would abort too) and, on an
  exception, records it and returns zeros of the declared shapes, so XLA finishes normally on
  every device. JAX has no hook for this: its callback primitives call the function they were
  given, and only the traced equations name it.

Matching an error to its launch: a token per launch. The rewritten computation takes one more
argument, a replicated ``uint32`` number, and every callback equation gets it as one more
operand (threaded through the sub-jaxprs as an extra input). Each call of ``GuardedCall`` takes
a fresh number, registers a ``Launch`` record under it and puts it on the slice's devices; a
failing callback finds the record by the number it was given. A FIFO per executable is not
enough: launches of one executable can be in flight together (the island's worker threads
launch them), a callback inside ``shard_map`` runs once per device, each on its own thread, so
device 0 may run launch k+1's callback while device 3 still runs launch k's, and a callback
cannot tell which launch it is in. With the token it need not: it is told. The price is one
scalar put per launch, paid only by computations with host callbacks, which already make a
host round trip. ``GuardedCall`` returns the outputs as a ``LaunchOutputs`` tuple holding the
record, and ``failure(outs)`` reads it once the outputs are ready: every output of a
``pw.function`` has a shard on every device of its slice, and a device's outputs are ready only
when its part of the computation, callbacks included, has finished.

>>> with jax.set_mesh(mesh):                                              # doctest: +SKIP
...     compiled, call = compile_guarded(flat, structs, in_shardings, out_shardings, mesh, "f")
>>> outs = call(*arrays)                                                 # doctest: +SKIP
>>> jax.block_until_ready(outs); failure(outs)                           # doctest: +SKIP
ValueError('negative input')

This is the one module that reads JAX's jaxpr internals (equation parameters of JAX 0.10);
``tests/runtime/test_callbacks.py`` covers each primitive it rewrites.
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jcore
from jax._src.sharding_impls import UNSPECIFIED
from jax.extend import core
from jax.extend.core.primitives import closed_call_p
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .compiled import compile_once
from .errors import ProgramError

# The primitives that run Python on the host, and what users call to make them.
CALLBACKS = {"pure_callback": "jax.pure_callback", "io_callback": "jax.experimental.io_callback",
             "debug_callback": "jax.debug.callback"}
_UNEXPORTABLE = (*CALLBACKS, "debug_print")  # what jax.export cannot serialize
_NOTE = "raised by the function"
_ids = itertools.count(1)
_live: weakref.WeakValueDictionary[int, Launch] = weakref.WeakValueDictionary()


class Launch:
    """One launch of a guarded executable: the first exception its host callbacks raised."""

    __slots__ = ("error", "failures", "__weakref__")

    def __init__(self):
        self.error: BaseException | None = None
        self.failures = 0  # how many callback calls failed (per device, per loop step)


class LaunchOutputs(tuple):
    """A launch's outputs (a tuple, as the compiled call returns them), with its ``fence``
    (a one-byte output made with them, which nobody else sees: it is ready once the whole
    computation has run, and waiting on it never touches a buffer a later launch may donate)
    and, for a guarded launch, its ``Launch`` record for ``failure``."""

    def __new__(cls, outs, launch: Launch | None, fence):
        self = super().__new__(cls, outs)
        self.launch, self.fence = launch, fence
        return self


# A pytree like the tuple it is (jax.block_until_ready(outs) waits for its arrays).
jax.tree_util.register_pytree_node(
    LaunchOutputs, lambda t: (tuple(t), (t.launch, t.fence)),
    lambda aux, outs: LaunchOutputs(outs, *aux))


def failure(outs) -> BaseException | None:
    """The exception a launch's host callbacks raised, if any: ask once ``outs`` (what the
    launch returned) are ready. None for launches of executables without host callbacks."""
    if type(outs) is LaunchOutputs and outs.launch is not None:
        return outs.launch.error
    return None


def checks_values() -> bool:
    """Whether ``jax_debug_nans`` or ``jax_debug_infs`` is on here (a context manager's
    setting included): then a launch calls ``invalid_values``. Two reads of JAX's config
    state (~35 ns each), where ``jax.config``'s attributes cost three times as much."""
    return jax_config.debug_nans.value or jax_config.debug_infs.value


def invalid_values(outs, name: str) -> FloatingPointError | None:
    """Under ``jax_debug_nans`` / ``jax_debug_infs``: the error for a NaN or infinite value
    among a launch's outputs, as ``jax.jit`` raises it (the launch waits for its outputs to
    check them, as ``jax.jit``'s call does then). JAX's own check of a compiled call is its
    post-call hook, which a thread loses for good once it leaves a ``jax.debug_nans(False)``
    block (JAX's traces of ``jnp.var``, ``jnp.sort`` and ``jaxpr_as_fun`` enter one), so the
    runtime checks itself (a launch asks ``checks_values()`` first). None when nothing is
    wrong, or the launch failed (reading its outputs raises its own error, which its futures
    carry)."""
    nans, infs = jax_config.debug_nans.value, jax_config.debug_infs.value
    for leaf in jax.tree_util.tree_leaves(outs):
        if not jnp.issubdtype(getattr(leaf, "dtype", np.int8), np.inexact):
            continue
        try:
            shards = [np.asarray(s.data) for s in leaf.addressable_shards]
        except Exception:  # noqa: BLE001 - a failed launch: its own error is what counts
            return None
        for what, bad in (("nan", nans and any(np.isnan(v).any() for v in shards)),
                          ("inf", infs and any(np.isinf(v).any() for v in shards))):
            if bad:
                return FloatingPointError(
                    f"invalid value ({what}) encountered in {name} (jax_debug_nans / "
                    "jax_debug_infs is on). To find the operation, call the function with "
                    "jax.disable_jit() on the same inputs.")
    return None


class FencedCall:
    """Calls an executable compiled by ``compile_guarded`` without host callbacks: its last
    output is the fence."""

    __slots__ = ("compiled",)

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *values) -> LaunchOutputs:
        *outs, last = self.compiled(*values)
        return LaunchOutputs(outs, None, last)


class GuardedCall:
    """Calls an executable compiled by ``compile_guarded`` with a fresh launch token."""

    __slots__ = ("compiled", "sharding")

    def __init__(self, compiled, sharding: NamedSharding):
        self.compiled, self.sharding = compiled, sharding

    def __call__(self, *values) -> LaunchOutputs:
        launch = Launch()
        key = next(_ids) & 0xFFFFFFFF
        _live[key] = launch  # (kept alive by the outputs, dropped with them)
        token = jax.device_put(np.uint32(key), self.sharding)
        *outs, last = self.compiled(*values, token)
        return LaunchOutputs(outs, launch, last)


def compile_guarded(flat: Callable, structs: Sequence[jax.ShapeDtypeStruct],
                    in_shardings: Sequence[Any], out_shardings: Sequence[Any], mesh,
                    name: str, donate_argnums: Sequence[int] = (),
                    keep_unused: bool = False) -> tuple[Any, Callable]:
    """``jax.jit(flat, ...).lower(*structs).compile()``, and how to call it: the compiled
    executable itself when the body has no host callbacks, else a ``GuardedCall`` of the
    rewritten body (see the module docstring). Call it under the mesh ``flat`` is traced
    under; ``name`` (the function's) is what a callback's error names."""
    donate = tuple(donate_argnums)
    token = NamedSharding(mesh, P())
    outs = (*out_shardings, token)  # the fence last (see LaunchOutputs)

    def fenced(*leaves):
        return (*flat(*leaves), jnp.zeros((), jnp.uint8))

    fenced.__name__ = name  # (XLA's module name, as jax.jit's: jit_<name> in profiles and logs)

    plain = jax.jit(fenced, in_shardings=tuple(in_shardings), out_shardings=outs,
                    donate_argnums=donate, keep_unused=keep_unused)
    traced = plain.trace(*structs)
    closed = traced.jaxpr
    if not _Rewriter().has_callbacks(closed.jaxpr):
        compiled = compile_once(traced, mesh.devices.flat)
        # int4/uint4 inputs: the compiled call wants them packed and JAX places them
        # unpacked; jax.jit's own call takes them (the same computation, its own cache)
        return compiled, FencedCall(plain if sub_byte(structs) else compiled)

    def guarded(*args):
        *leaves, tok = args
        var = core.Var(jax.typeof(tok))  # the token as traced here (its sharding included)
        jaxpr = _Rewriter(name).jaxpr(closed.jaxpr, var, len(closed.jaxpr.invars))
        return tuple(core.jaxpr_as_fun(core.ClosedJaxpr(jaxpr, closed.consts))(*leaves, tok))

    guarded.__name__ = name

    jitted = jax.jit(guarded, in_shardings=(*in_shardings, token), out_shardings=outs,
                     donate_argnums=donate, keep_unused=keep_unused)
    compiled = jitted.lower(*structs, jax.ShapeDtypeStruct((), np.uint32, sharding=token)
                            ).compile()
    return compiled, GuardedCall(jitted if sub_byte(structs) else compiled, token)


def sub_byte(structs: Sequence[jax.ShapeDtypeStruct]) -> bool:
    """Whether an input has elements narrower than a byte (``int4``, ``uint4``, ...): XLA's
    compiled call wants those packed, and JAX places them unpacked; ``jax.jit``'s own call
    takes them (here, and on Ray islands)."""
    return any(s.dtype == jax.dtypes.float0 or jax.dtypes.itemsize_bits(s.dtype) < 8
               for s in structs if not jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key))


def found(jaxpr) -> list[str]:
    """The host-callback primitives in ``jaxpr`` (a Jaxpr or ClosedJaxpr, searched through
    its sub-jaxprs) that ``jax.export`` cannot serialize, each once."""
    names: dict[str, None] = {}

    def walk(j) -> None:
        for eqn in j.eqns:
            if eqn.primitive.name in _UNEXPORTABLE:
                names[eqn.primitive.name] = None
            for sub in core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(getattr(jaxpr, "jaxpr", jaxpr))
    return list(names)


def not_exportable(name: str, primitives: Sequence[str]) -> ProgramError:
    """The error for a body with host callbacks that a backend must export (Ray islands)."""
    calls = ", ".join(CALLBACKS.get(p, "jax.debug.print") for p in primitives)
    return ProgramError(
        f"{name} calls host callbacks ({calls}), which cannot be exported to Ray islands: "
        "jax.export cannot serialize the Python functions they call. Everything else in a "
        "pw.function is supported there. Maybe you want "
        "to do the host work on the controller between two pw.functions (fetch the value with "
        ".result(), compute, and pass it on), or run this function on backend='local'.")


_inside = threading.local()  # ``depth``: the guarded host functions this thread is in


def in_host_callback() -> bool:
    """The calling thread runs a host callback's function inside a computation (on XLA's
    thread or the runtime's): it must not wait for that computation to end."""
    return getattr(_inside, "depth", 0) > 0


class _Guard:
    """A callback equation's function, made safe: it takes the launch token as its last
    operand, and an exception (or a result of the wrong type) is recorded on that launch while
    XLA gets zeros of the declared shapes."""

    __slots__ = ("callback", "avals", "what", "name", "__weakref__")  # (JAX weakrefs params)

    def __init__(self, callback, avals, what: str, name: str):
        self.callback, self.avals, self.what, self.name = callback, avals, what, name

    def __call__(self, *args):
        *args, token = args
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            out = self.callback(*args)
            if self.avals is not None:
                self._check(out)
            return out
        except BaseException as e:  # noqa: BLE001 - raising here would abort the process
            self._record(token, e)
            return [np.zeros(a.shape, a.dtype) for a in self.avals or ()]
        finally:
            _inside.depth -= 1

    def _check(self, out) -> None:
        if len(out) != len(self.avals):
            raise ProgramError(f"{self.what}'s function returned {len(out)} arrays where its "
                               f"result_shape_dtypes declare {len(self.avals)}.")
        for i, (value, aval) in enumerate(zip(out, self.avals, strict=True)):
            value = np.asarray(value)
            dtype = jax.dtypes.canonicalize_dtype(value.dtype)
            if value.shape != aval.shape or dtype != aval.dtype:
                raise ProgramError(
                    f"{self.what}'s function returned {dtype}{list(value.shape)} as result "
                    f"{i} where its result_shape_dtypes declare {aval.str_short()}. Maybe you "
                    f"want to return np.asarray(..., dtype) of shape {aval.shape}.")

    def _record(self, token, error: BaseException) -> None:
        launch = _live.get(int(np.asarray(token).reshape(-1)[0]))
        if launch is None:  # its outputs were dropped: nobody is left to tell
            return
        launch.failures += 1
        if launch.error is None:
            launch.error = error
            if _NOTE in "".join(getattr(error, "__notes__", ())):
                return  # (the same exception object raised again)
            error.add_note(f"({_NOTE} of a {self.what} in {self.name}; pwkernel "
                           "gave XLA zeros in its place so the computation could finish on "
                           "every device, and failed the computation's outputs)")


class _Rewriter:
    """Rewrites jaxprs so that every host callback in them is a ``_Guard`` reading a token.

    ``jaxpr(j, tok, at)`` is ``j`` with ``tok`` inserted among its inputs at ``at``; the
    equations that hold callbacks get it as an operand, and sub-jaxprs as an input of their
    own. Equations without callbacks are kept as they are."""

    def __init__(self, name: str = ""):
        self.name = name
        self._has: dict[int, bool] = {}  # id(Jaxpr) -> holds a callback

    def has_callbacks(self, jaxpr) -> bool:
        key = id(jaxpr)
        if key not in self._has:
            self._has[key] = any(
                e.primitive.name in CALLBACKS
                or any(self.has_callbacks(s) for s in core.jaxprs_in_params(e.params))
                for e in jaxpr.eqns)
        return self._has[key]

    def jaxpr(self, jaxpr, tok, at: int):
        invars = list(jaxpr.invars)
        invars.insert(at, tok)
        eqns = [self._eqn(e, tok) for e in jaxpr.eqns]
        return jaxpr.replace(invars=invars, eqns=eqns)

    def closed(self, closed, tok, at: int):
        return core.ClosedJaxpr(self.jaxpr(closed.jaxpr, tok, at), closed.consts)

    def _eqn(self, eqn, tok):
        name, params = eqn.primitive.name, eqn.params
        if name in CALLBACKS:
            guard = _Guard(params["callback"], params.get("result_avals"), CALLBACKS[name],
                           self.name)
            return eqn.replace(invars=[*eqn.invars, tok], params={**params, "callback": guard})
        if not any(self.has_callbacks(s) for s in core.jaxprs_in_params(params)):
            return eqn
        rule = _RULES.get(name)
        if rule is None:
            warnings.warn(f"{self.name}: a host callback inside {name!r} cannot be guarded by "
                          "pwkernel; if it raises, XLA aborts the process.", RuntimeWarning,
                          stacklevel=2)
            return eqn
        return rule(self, eqn, tok)


def _inner(tok):
    return core.Var(tok.aval)


def _call_rule(param: str):
    """Call-like primitives: the token is one more (last) operand of the call."""
    def rule(rw: _Rewriter, eqn, tok):
        sub = eqn.params[param]
        n = len(sub.invars)
        new = (rw.closed(sub, _inner(tok), n) if isinstance(sub, core.ClosedJaxpr)
               else rw.jaxpr(sub, _inner(tok), n))
        return eqn.replace(invars=[*eqn.invars, tok], params={**eqn.params, param: new})
    return rule


def _jit_rule(rw: _Rewriter, eqn, tok):
    p = eqn.params
    new = rw.closed(p["jaxpr"], _inner(tok), len(p["jaxpr"].invars))
    return eqn.replace(invars=[*eqn.invars, tok], params={
        **p, "jaxpr": new, "in_shardings": (*p["in_shardings"], UNSPECIFIED),
        "in_layouts": (*p["in_layouts"], None), "donated_invars": (*p["donated_invars"], False)})


def _custom_rule(rw: _Rewriter, eqn, tok):
    # A custom_jvp / custom_vjp call evaluates its primal jaxpr; its rules are for AD, and
    # nothing differentiates a compiled body after this, so it becomes a plain call.
    sub = eqn.params["call_jaxpr"]
    new = rw.closed(sub, _inner(tok), len(sub.invars))
    return core.new_jaxpr_eqn([*eqn.invars, tok], eqn.outvars, closed_call_p,
                              {"call_jaxpr": new}, eqn.effects, eqn.source_info, eqn.ctx)


def _scan_rule(rw: _Rewriter, eqn, tok):
    # Operands: consts, carry, xs: the token is the first const.
    p = eqn.params
    params = {**p, "jaxpr": rw.closed(p["jaxpr"], _inner(tok), 0)}
    if "ft_in" in p:  # newer JAX: the operands' groups as a flat tree, not num_consts
        from jax._src import flattree as ft

        consts, carry, xs = p["ft_in"].unpack()
        params["ft_in"] = ft.pack(((ft.nones(1), consts), carry, xs))
    else:
        params["num_consts"] = p["num_consts"] + 1
    if "linear" in p:
        params["linear"] = (False, *p["linear"])
    return eqn.replace(invars=[tok, *eqn.invars], params=params)


def _while_rule(rw: _Rewriter, eqn, tok):
    # Operands: cond consts, body consts, carry: the token is the first const of each that
    # holds a callback.
    p = dict(eqn.params)
    invars = list(eqn.invars)
    if rw.has_callbacks(p["body_jaxpr"].jaxpr):
        invars.insert(p["cond_nconsts"], tok)
        p["body_jaxpr"] = rw.closed(p["body_jaxpr"], _inner(tok), 0)
        p["body_nconsts"] += 1
    if rw.has_callbacks(p["cond_jaxpr"].jaxpr):
        invars.insert(0, tok)
        p["cond_jaxpr"] = rw.closed(p["cond_jaxpr"], _inner(tok), 0)
        p["cond_nconsts"] += 1
    return eqn.replace(invars=invars, params=p)


def _cond_rule(rw: _Rewriter, eqn, tok):
    # Operands: the branch index, then the branches' operands: the token is the last of them
    # (every branch takes it, used or not: branches share one signature).
    branches = tuple(rw.closed(b, _inner(tok), len(b.invars)) for b in eqn.params["branches"])
    return eqn.replace(invars=[*eqn.invars, tok], params={**eqn.params, "branches": branches})


def _shard_map_rule(rw: _Rewriter, eqn, tok):
    # The token enters replicated (P()); inside, it has the body's manual type.
    p = eqn.params
    manual = p.get("newly_manual_axes", frozenset(p["mesh"].axis_names))
    inner = core.Var(jcore.shard_aval(p["mesh"], manual, p.get("check_vma", False), P(),
                                      tok.aval))
    new = rw.jaxpr(p["jaxpr"], inner, len(p["jaxpr"].invars))
    return eqn.replace(invars=[*eqn.invars, tok],
                       params={**p, "jaxpr": new, "in_specs": (*p["in_specs"], P())})


_RULES: dict[str, Callable] = {
    "jit": _jit_rule,
    "closed_call": _call_rule("call_jaxpr"),
    "call": _call_rule("call_jaxpr"),
    "remat2": _call_rule("jaxpr"),  # jax.checkpoint
    "custom_jvp_call": _custom_rule,
    "custom_vjp_call": _custom_rule,
    "scan": _scan_rule,
    "while": _while_rule,
    "cond": _cond_rule,
    "shard_map": _shard_map_rule,
}

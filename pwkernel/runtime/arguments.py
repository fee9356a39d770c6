"""How a compiled function's arguments are read: static, dynamic and donated ones.

``pw.function`` takes the call conventions of ``jax.jit``: positional and keyword arguments,
pytrees, ``static_argnums``/``static_argnames`` (hashable values that are part of the
compilation key, not arrays) and ``donate_argnums``/``donate_argnames`` (inputs whose buffers the
computation may reuse for its outputs: the user asked to give them away).

Also how a program's argument leaves enter its cache key (``leaf_placement``), and what a call
on JAX tracers is (``Traced``: a nested ``jax.jit``).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core

from .dtypes import jax_takes, untyped_fix, weak_type
from .errors import ProgramError, retyped
from .graph import Graph, Value
from .objects import Future

NUMERIC = "biufcV"  # bool, ints, floats, complex (and bfloat16-like void types)


class Arguments:
    """How a function's arguments split into static and dynamic ones, and which are donated,
    as ``jax.jit`` reads ``static_argnums``/``static_argnames`` and ``donate_argnums``/
    ``donate_argnames`` (a name also covers its position in the signature, and back)."""

    def __init__(self, fn: Callable, name: str, static_argnums, static_argnames,
                 donate_argnums, donate_argnames):
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = None  # no signature (some built-ins): nothing to check against
        self.name = name
        # a parameter named ``dispatch`` is the function's own; else a call's ``dispatch=``
        # is pwkernel's (this call's dispatch mode)
        self.takes_dispatch = any(p.name == "dispatch" for p in params or ())
        self.static_nums, self.static_names = _both(
            name, "static", static_argnums, static_argnames, params)
        # a negative static position of a function taking *args counts from the end of each
        # call's positional arguments, as jax.jit counts it (``static_at``)
        self.static_from_end = frozenset(i for i in self.static_nums if i < 0)
        self.donate_nums, self.donate_names = _both(
            name, "donate", donate_argnums, donate_argnames, params)
        both = self.static_nums & self.donate_nums
        if both:
            raise retyped(ProgramError(
                f"{name}: argument {min(both)} is both static and donated; a static argument "
                "is not an array, so it cannot be donated."), ValueError)  # (as jax.jit)

    def pop_dispatch(self, kwargs: dict) -> str | None:
        """A call's ``dispatch=`` (this call's dispatch mode), taken out of ``kwargs``; None
        when not given, or when it is the function's own parameter."""
        return kwargs.pop("dispatch", None) if kwargs and not self.takes_dispatch else None

    def static_at(self, nargs: int) -> frozenset[int]:
        """The static positions of a call with ``nargs`` positional arguments."""
        if not self.static_from_end:
            return self.static_nums
        if min(self.static_from_end) < -nargs:  # (jax.jit refuses it too: no wrapping round)
            raise retyped(ProgramError(
                f"{self.name}: static_argnums={min(self.static_from_end)} counts from the end "
                f"of the call's positional arguments, but this call passes {nargs} positional "
                f"arguments; jax.jit refuses it too. Pass at least "
                f"{-min(self.static_from_end)} positionally, or give the static one by "
                "position from the start."), ValueError)
        return frozenset(i % nargs if i < 0 else i for i in self.static_nums)

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """``(dynamic positional, dynamic keyword, static key)``; the key is hashable."""
        nums, names = self.static_at(len(args)), self.static_names
        if not nums and not names:
            return args, kwargs, (len(args), (), (), ())
        dyn = tuple(a for i, a in enumerate(args) if i not in nums)
        spos = tuple((i, args[i]) for i in sorted(nums) if i < len(args))
        skw = tuple(sorted((k, v) for k, v in kwargs.items() if k in names))
        dkw = {k: v for k, v in kwargs.items() if k not in names}
        for _, v in spos + skw:
            if isinstance(v, _ARRAYS):  # (a future hashes by identity: it would compile
                raise retyped(ProgramError(  # and be kept once per future)
                    f"{self.name}: a static argument must be a Python value known when the "
                    f"call is made, got a {type(v).__name__} (an array's value is not part "
                    "of the compilation key, as in jax.jit). Pass it as an array argument, "
                    "or its value (float(x), tuple(x.tolist())) as the static one."),
                    ValueError)
        # jax.jit keeps statics that compare equal but differ in type apart (2 and 2.0,
        # 1 and True): they can trace to different dtypes.
        key = (len(args), spos, skw, tuple(type(v) for _, v in spos + skw))
        try:
            hash(key)
        except TypeError:
            bad = next(v for _, v in spos + skw if not _hashable(v))
            where, inner = _unhashable_part(bad)
            held = f" holding a {type(inner).__name__} at {where}" if where else ""
            raise retyped(ProgramError(
                f"{self.name}: a static argument must be hashable (it is part of the "
                f"compilation key, as in jax.jit), got a {type(bad).__name__}{held}. Maybe you "
                f"want {_hashable_fix(inner)}."), ValueError) from None
        return dyn, dkw, key

    def check_new(self, key: tuple) -> None:
        """A static key met for the first time (it compiles): no future inside a static
        value. (A future hashes by identity: it would compile, and be kept, once per future;
        an array inside one is unhashable, as under jax.jit.)"""
        for _, v in key[1] + key[2]:
            if any(isinstance(leaf, Future) for leaf in jax.tree_util.tree_leaves(v)):
                raise retyped(ProgramError(
                    f"{self.name}: a static argument holds a pw.Future ({type(v).__name__}); "
                    "a static value is part of the compilation key and an array's value is "
                    "not, as in jax.jit. Pass the future as an array argument, or its value "
                    "(float(x), tuple(x.tolist())) in the static one."), ValueError)

    def rebuild(self, dyn: Sequence, kwargs: dict, key: tuple) -> tuple[list, dict]:
        """The full call from the dynamic arguments and the static key."""
        nargs, spos, skw, _ = key
        args, it, statics = [], iter(dyn), dict(spos)
        for i in range(nargs):
            args.append(statics[i] if i in statics else next(it))
        return args, {**kwargs, **dict(skw)}

    def donated_leaves(self, dyn: tuple, kwargs: dict, key: tuple) -> tuple[int, ...]:
        """Flat leaf indices of the donated arguments (in the (positional, keyword) tree).
        Nothing while ``jax_debug_nans`` is on: ``jax.jit`` compiles then without donating, and
        it decides when it compiles (the flag at a later call changes nothing either way)."""
        if not self.donate_nums and not self.donate_names or jax_config.debug_nans.value:
            return ()
        nargs, spos, _, _ = key
        positions = [i for i in range(nargs) if i not in dict(spos)]
        out, at = [], 0
        for pos, arg in zip(positions, dyn, strict=True):
            n = len(jax.tree_util.tree_leaves(arg))
            if pos in self.donate_nums:
                out.extend(range(at, at + n))
            at += n
        for k in sorted(kwargs):  # dicts flatten in key order
            n = len(jax.tree_util.tree_leaves(kwargs[k]))
            if k in self.donate_names:
                out.extend(range(at, at + n))
            at += n
        return tuple(out)


# Never static: checked before hashing, so an array gets this fix, not an unhashable's
# (only a future is hashable; by identity).
_ARRAYS = (Future, jax.Array, np.ndarray)


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _unhashable_part(value) -> tuple[str, object]:
    """Where in ``value`` (unhashable) the innermost unhashable part is (a key path, ``""``
    for ``value`` itself), and that part: a list or dict inside a tuple, an array in a
    dataclass's field (a list, dict or set is the part, whatever it holds)."""
    where = ""
    for _ in range(64):  # (deep enough for any static a person writes; cycles end here)
        if isinstance(value, list | dict | set):  # (unhashable whatever it holds)
            break
        inner = next(((k, c) for k, c in _parts(value) if not _hashable(c)), None)
        if inner is None:
            break
        where, value = where + inner[0], inner[1]
    return where, value


def _parts(value) -> list[tuple[str, object]]:
    """``value``'s parts, each with its key path: its children as a pytree node, or a
    dataclass's fields (one that is no pytree)."""
    try:
        kids, tree = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda c: c is not value)
    except (TypeError, ValueError):  # (a dict whose keys do not sort)
        kids, tree = [], None
    if tree is not None and tree.num_nodes > 1:
        return [(jax.tree_util.keystr(k), c) for k, c in kids]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    return []


def _hashable_fix(part) -> str:
    """How to make ``part`` (what makes a static argument unhashable) hashable."""
    if isinstance(part, list):
        return "a tuple instead of a list"
    if isinstance(part, dict):
        return "a tuple of (key, value) pairs, or a frozen dataclass, instead of a dict"
    if isinstance(part, set):
        return "a frozenset instead of a set"
    if isinstance(part, _ARRAYS):
        return ("to pass the array as an array argument, or its value (tuple(x.tolist())) "
                "in the static one")
    return ("a hashable value in its place (a tuple, or a frozen dataclass), or to pass it as "
            "an array argument")


def _positions(fn_name: str, what: str, nums) -> tuple[int, ...]:
    """``static_argnums``/``donate_argnums`` as ``jax.jit`` reads them: one position or an
    iterable of them, each anything ``operator.index`` takes (``True`` is 1, a NumPy integer
    is its value)."""
    if nums is None:
        return ()
    try:
        return (operator.index(nums),)
    except TypeError:
        pass
    try:
        return tuple(operator.index(i) for i in nums)
    except TypeError:
        raise ProgramError(f"{fn_name}: {what}_argnums must be ints (positions of arguments), "
                           f"got {nums!r}. Maybe you want {what}_argnums=(1,).") from None


def _both(fn_name: str, what: str, nums, names, params):
    """``(positions, names)`` of ``what`` arguments, each completed from the other and
    checked against the signature as ``jax.jit`` checks them (a negative position counts
    from the end of the positional parameters)."""
    nums = _positions(fn_name, what, nums)
    names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    if not all(isinstance(n, str) for n in names):
        raise ProgramError(f"{fn_name}: {what}_argnames must be argument names (str), got "
                           f"{names!r}. Maybe you want {what}_argnames=('n',).")
    params = params or []
    kinds = {p.kind for p in params}
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                        p.POSITIONAL_OR_KEYWORD)]
    if params and inspect.Parameter.VAR_POSITIONAL not in kinds:
        bad = [i for i in nums if not -len(positional) <= i < len(positional)]
        if bad:
            raise retyped(ProgramError(
                f"{fn_name}: {what}_argnums={nums} names position {bad[0]}, but the function "
                f"takes {len(positional)} positional arguments ({', '.join(positional)})"
                + _how_to_count(what, bad[0], positional)), ValueError)
        nums = tuple(i % len(positional) for i in nums)
    elif what == "static" and params:
        pass  # (with *args: a negative one counts from each call's end, as in jax.jit)
    elif any(i < 0 for i in nums):
        raise ProgramError(f"{fn_name}: {what}_argnums={nums}: a negative position needs a "
                           "function with a fixed number of positional arguments (this one "
                           "takes *args; jax.jit takes it there and donates nothing); give "
                           "positions from the start.")
    keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = inspect.Parameter.VAR_KEYWORD in kinds or not params
    unknown = sorted(set(names) - keyword) if not takes_any else sorted(
        set(names) & {p.name for p in params if p.kind == p.POSITIONAL_ONLY})
    if unknown:
        raise retyped(ProgramError(
            f"{fn_name}: {what}_argnames names {unknown}, which the function does not take by "
            f"keyword (it takes {', '.join(sorted(keyword)) or 'no keyword arguments'}). "
            f"Check the spelling, or use {what}_argnums for positional-only arguments."),
            ValueError)
    nums_set = set(nums) | {positional.index(n) for n in names if n in positional}
    # (a positional-only parameter has no name a call can give: jax.jit names it not either)
    by_name = {i for i, p in enumerate(params) if p.kind == p.POSITIONAL_OR_KEYWORD}
    names_set = set(names) | {positional[i] for i in nums if i in by_name}
    return frozenset(nums_set), frozenset(names_set)


def _how_to_count(what: str, bad: int, positional: list[str]) -> str:
    """How positions count, and the likely fix for ``bad``, which is out of range."""
    n = len(positional)
    if not n:
        return f": give no {what}_argnums."
    counts = ", ".join(f"{p} is {i}" for i, p in enumerate(positional))
    back = ", ".join(f"{p} is {i - n}" for i, p in reversed(list(enumerate(positional))))
    fix = (f" Maybe you want {what}_argnums={n - 1} (positions count from 0)." if bad == n
           else "")
    return (f": positions count from 0: {counts}, and from the end: {back}. Or by name: "
            f"{what}_argnames=({positional[-1]!r},).{fix}")


Tracer = jax.core.Tracer


def under_a_trace() -> bool:
    """JAX is tracing (``jax.jit``, ``jax.grad``, ``jax.vmap``, a ``pw.function``'s body):
    a call there is a nested ``jax.jit`` even when none of its arguments is a tracer (no
    arguments, host constants, arrays a closure holds), as ``jax.jit``'s is."""
    return not jax_core.trace_state_clean()  # (JAX has no public "am I traced?")


class Traced(Exception):
    """A compiled function or program was called on JAX tracers: inside ``jax.jit``,
    ``jax.grad``, ``jax.vmap`` or another ``pw.function``'s body. There it is what a nested
    ``jax.jit`` is: its body, traced inline, placed by the computation around it."""


def canonical(arr: np.ndarray) -> np.ndarray:
    # What jax would turn a host value into (float64 -> float32 unless x64 is on).
    dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
    return arr if arr.dtype == dtype else arr.astype(dtype)


def leaf_placement(leaf) -> tuple:
    """A program argument's part of the cache key: how it is laid out now, and whether it is
    weakly typed (a Python scalar, as ``jax.jit`` types it). Its kind: ``"host"``, ``"dev"``
    (a future, or a jax.Array committed to its devices) or ``"loose"`` (an uncommitted
    jax.Array), as ``jax.jit``'s cache key tells committed arrays apart."""
    if isinstance(leaf, Future):
        return leaf.placement or ("dev", leaf.shape, leaf.dtype, leaf.sharding, leaf.weak_type)
    if isinstance(leaf, jax.Array):
        if isinstance(leaf, Tracer):
            raise Traced
        # (an uncommitted array may be moved, and jax.jit types it as a host value)
        return ("dev" if leaf.committed else "loose", leaf.shape, leaf.dtype, leaf.sharding,
                weak_type(leaf))
    if type(leaf) is jax.ShapeDtypeStruct:  # (eval_shape, lower: traced, never called)
        sharding = leaf.sharding if isinstance(leaf.sharding, jax.sharding.NamedSharding) \
            else None
        return ("host" if sharding is None else "dev", leaf.shape, leaf.dtype, sharding,
                leaf.weak_type)
    if type(leaf) is int:  # weakly typed, of JAX's default int type (not NumPy's choice)
        return ("host", (), python_int(leaf), None, True)
    arr = host_array(leaf)
    if arr is None:
        raise NotAnArray(f"a program got an argument of type {type(leaf).__name__}; programs "
                         "take arrays, scalars, futures and pytrees of them. Maybe you want "
                         "static_argnums=... (or functools.partial) for static arguments.")
    return ("host", arr.shape, jax.dtypes.canonicalize_dtype(arr.dtype), None, is_weak(leaf))


def placement_key(leaf, tracing: Graph | None) -> tuple:
    """A program argument's part of its graph's cache key (``leaf_placement``, or the one a
    future carries); a value of the program being traced (``tracing``), given to
    ``fn.eval_shape``, ``fn.trace`` or ``prog.eval_shape`` inside it as ``jax.jit``'s stages
    take an outer trace's tracers, is what that graph knows of it: kind ``"made"`` where the
    program made it (neither a host value nor committed: what an outer trace's tracer is)."""
    if type(leaf) is Future and leaf.placement:
        return leaf.placement
    if type(leaf) is Value and tracing is not None and leaf.graph is tracing:
        spec = tracing.values[leaf.id]
        kind = ("host" if spec.sharding is None else "made" if spec.committed is None
                else "dev" if spec.committed else "loose")
        return kind, spec.shape, spec.dtype, spec.sharding, spec.weak
    return leaf_placement(leaf)


def host_array(leaf) -> np.ndarray | None:
    """``leaf`` as the NumPy array JAX reads a host value as (a Python int of JAX's default int
    type, or JAX's ``OverflowError``), or None where ``jax.jit`` takes no such argument: not
    numeric, of a dtype JAX has no type for (``>f4``, ``np.longdouble``), or a masked array
    (its mask would be lost)."""
    if isinstance(leaf, np.ma.MaskedArray):
        return None
    dtype = python_int(leaf) if type(leaf) is int else None
    try:
        arr = np.asarray(leaf, dtype)
    except Exception:  # (not an array at all)
        return None
    return arr if arr.dtype.kind in NUMERIC and jax_takes(arr.dtype) else None


def described(leaf) -> tuple[str, str | None]:
    """What a leaf ``host_array`` refused is, for an error: its type, or a NumPy array's
    dtype that JAX has no type for; and how to convert such a dtype (None: no such fix)."""
    if isinstance(leaf, np.ndarray | np.generic) and not isinstance(leaf, np.ma.MaskedArray):
        kind = "array" if isinstance(leaf, np.ndarray) else "scalar"
        return (f"a NumPy {kind} of dtype {leaf.dtype}, which JAX has no type for",
                untyped_fix(leaf.dtype))
    return f"of type {type(leaf).__name__}", None


def value_id(graph: Graph, leaf, name: str) -> int:
    """The graph value of one argument leaf of a compiled function's call in a program's
    trace: a traced value, or a constant (a placed array keeps its layout; a host value is
    copied, as ``jax.jit`` reads it at trace time)."""
    if isinstance(leaf, Value):
        if leaf.graph is not graph:
            raise ProgramError("a Value from another program's trace was used; pass futures "
                               "between programs, not traced values.")
        return leaf.id
    if isinstance(leaf, Future):
        raise ProgramError(
            f"{name} got a Future while a program was being traced; pass futures as "
            "arguments of the program instead of capturing them."
        )
    if isinstance(leaf, jax.Array):
        # a placed array captured while tracing: a constant that keeps its layout
        isl = graph.controller.resources.island_of(leaf.sharding.device_set)
        spec = graph.new_value(leaf.shape, leaf.dtype, leaf.sharding,
                               None if isl is None else isl.id, weak_type(leaf),
                               leaf.committed)
        graph.consts[spec.id] = leaf
        return spec.id
    arr = host_array(leaf)
    if arr is None:
        is_a, fix = described(leaf)
        raise ProgramError(f"{name} got an argument that is {is_a}; compiled functions take "
                           "arrays, scalars and pytrees of them. Maybe you want "
                           f"{fix or 'static_argnums=... (or static_argnames=...)'} for that "
                           "argument.")
    arr = canonical(arr)
    if isinstance(leaf, np.ndarray) and np.may_share_memory(arr, leaf):
        arr = arr.copy()  # the constant is what it was at trace time, as under ``jax.jit``
    spec = graph.new_value(arr.shape, arr.dtype, weak=is_weak(leaf))
    graph.consts[spec.id] = arr
    return spec.id


def constants_as_values(graph: Graph, result, name: str):
    """``result``, what a program returned, with each constant leaf (a Python or NumPy
    scalar, a NumPy array, a placed ``jax.Array``) made a value of ``graph``, as ``jax.jit``
    returns one: an array (a Python scalar's weakly typed). Other leaves stay as they are,
    for ``Graph.take_result`` to judge."""
    def value(leaf):
        if isinstance(leaf, Value | Future | Tracer):
            return leaf
        if isinstance(leaf, jax.Array) or host_array(leaf) is not None:
            return Value(graph, value_id(graph, leaf, name))
        return leaf
    return jax.tree_util.tree_map(value, result)


class NotAnArray(ProgramError):
    """An argument leaf that is no array, scalar or future (``not_an_array`` names it)."""


def not_an_array(name: str, what: str, args: tuple, kwargs: dict,
                 arguments: Arguments) -> ProgramError:
    """The error for a call given something that is no array, scalar or future: which
    argument (and where in its pytree), what it is, and the fix."""
    statics = arguments.static_at(len(args))
    given = [(f"argument {i}", a, f"static_argnums={i}") for i, a in enumerate(args)
             if i not in statics]
    given += [(f"argument {k!r}", v, f"static_argnames={k!r}") for k, v in kwargs.items()
              if k not in arguments.static_names]
    for where, value, static in given:
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            try:
                leaf_placement(leaf)
            except NotAnArray:
                fix = (f"{static} (a static argument: a hashable Python value that is part of "
                       "the compilation key), or functools.partial" if not path else
                       "to take it out of the pytree (a static argument, or a field that is "
                       "not a pytree node, e.g. flax.struct.field(pytree_node=False))")
                masked = isinstance(leaf, np.ma.MaskedArray)  # (its mask would be lost)
                is_a, dtype_fix = described(leaf)
                if masked:
                    fix = "x.filled(value) (a NumPy masked array's mask would be lost)"
                fix = dtype_fix or fix
                err = ProgramError(
                    f"{name}: {where}{jax.tree_util.keystr(path)} is {is_a}; "
                    f"{what} takes arrays, Python scalars, futures and pytrees of them, as "
                    f"jax.jit does. Maybe you want {fix}.")
                return retyped(err, ValueError) if masked else err  # (as jax.jit's)
    return ProgramError(f"{name}: an argument is no array, scalar or future.")


def python_int(value: int) -> np.dtype:
    """The dtype JAX gives a Python int (int32, or int64 with x64), or JAX's OverflowError
    for one that does not fit (NumPy would pick uint64, or no integer type)."""
    dtype, low, high = _PYTHON_INTS[jax.config.jax_enable_x64]
    if not low <= value <= high:
        raise retyped(ProgramError(
            f"Python int {value} does not fit in {dtype.name} (the type JAX gives a Python "
            "int, weakly typed); pass it as an array of a type that holds it (np.uint64, "
            "with jax_enable_x64), or as a float."), OverflowError)
    return dtype


_PYTHON_INTS = {x64: (np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max))
                for x64, t in ((False, np.int32), (True, np.int64))}


def is_weak(leaf) -> bool:
    return type(leaf) in (int, float, complex)

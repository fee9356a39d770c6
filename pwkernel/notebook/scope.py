"""The namespace a ``%%pathways`` cell's top level runs in (``CellScope``), and what the cell
may not keep once its trace ends.

A cell runs as a notebook's top level does, over the notebook's names; what it binds comes back
as its outputs. A value traced in the cell is good for nothing outside the trace, so one that
Python kept elsewhere (a list of the notebook's, a ``global``, a closure, a default, a class
attribute) makes the cell run as plain Python instead (``check_kept``); ``jax.jit`` functions
it defines forget their traces of it; and the functions it defines read the notebook's names
when called (``rehome``).
"""

from __future__ import annotations

import functools
import gc
import types
from typing import Any

import jax
import numpy as np

from ..runtime.errors import NeedsValueError
from ..runtime.graph import Value
from ..runtime.objects import Future

DELETED = object()  # the value of a name the cell deleted (``del x``): unbound after it


class CellScope(dict):
    """The cell's top-level names over the user's namespace, as a notebook's top level has
    them: a name the cell does not bind is read from the user's namespace, ``global`` and
    ``del`` work, and functions, lambdas and classes defined in the cell read their globals
    here when called. The names the cell reads are seeded (its array inputs with their traced
    values), because a class body looks its globals up without ``__missing__``. Once the
    trace ends (``close``) it keeps nothing of its own and every read falls through: a
    function the cell defined then sees the notebook's current names, never a traced value."""

    def __init__(self, user_ns: dict[str, Any], helpers: dict[str, Any],
                 seeded: dict[str, Any]):
        super().__init__(helpers)
        self.update(seeded)
        self.user_ns, self.helpers, self.seeded = user_ns, frozenset(helpers), seeded
        self.written: set[str] = set()
        self.deleted: set[str] = set()

    def __missing__(self, key: str) -> Any:
        if key in self.deleted:  # ``del x`` then ``x``: unbound, as in Python (NameError)
            raise KeyError(key)
        return self.user_ns[key]

    def get(self, key: str, default: Any = None) -> Any:  # (``globals().get(name)``)
        return self[key] if key in self else default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (key not in self.deleted
                                                and key in self.user_ns)

    def __setitem__(self, key: str, value: Any) -> None:
        self.written.add(key)
        self.deleted.discard(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        if dict.__contains__(self, key):
            dict.__delitem__(self, key)
        elif key in self.deleted or key not in self.user_ns:
            raise KeyError(key)
        self.deleted.add(key)

    def bound(self) -> dict[str, Any]:
        """The names the cell bound (``DELETED`` for those it deleted), in binding order.
        (Rebinding through ``global`` in a function writes past ``__setitem__``: a value
        that is not the seeded one tells it.)"""
        seeded, out = self.seeded, {}
        for key, value in self.items():
            if key in self.helpers or key == "__builtins__":
                continue
            if key in self.written or key not in seeded or value is not seeded[key]:
                out[key] = value
        gone = self.deleted | {k for k in seeded if not dict.__contains__(self, k)}
        out.update((k, DELETED) for k in gone if k in self.user_ns and k not in out)
        return out

    def close(self) -> None:
        self.deleted.clear()  # (what the cell deleted is the notebook's business now)
        for key in list(self):
            if key not in self.helpers and key != "__builtins__":
                dict.__delitem__(self, key)


def check_kept(user_ns: dict[str, Any], before: dict[str, Any], bound: dict[str, Any]) -> None:
    """Python kept a value traced in the cell outside the cell's names: in a list, dict or set
    of the notebook's (``lst += [x]``, a function's ``losses.append``), in a notebook name
    (a function's ``global``), or in what the cell defines (a closure, a default, a class
    attribute; a ``jax.jit`` function it defines forgets its traces). Outside its trace such a
    value is good for nothing, so it is taken out again (the notebook's names put back) and the
    cell runs as plain Python instead (``NeedsValueError``: see ``segments.needs_value``)."""
    where = None
    for name, value in list(user_ns.items()):
        if _traced(value):
            if name in before:
                user_ns[name] = before[name]
            else:
                del user_ns[name]
            where = where or f"the notebook name {name!r}"
        elif type(value) in _CONTAINERS and not name.startswith("_") and (
                _drop_traced(value) + sum(_drop_traced(x) for x in list(_items(value))
                                          if type(x) in _CONTAINERS)):
            where = where or f"{name!r} (a {type(value).__name__} from outside the cell)"
    for name, value in bound.items():
        if _is_jit(value):  # its traces may hold this cell's traced values as constants:
            value.clear_cache()  # it traces again, on the notebook's values, when next called
        if where is None and any(_holds_traced(x) for x in leaves(value) if not _traced(x)):
            where = (f"what {name!r} holds (a closure, a default, a class attribute, or an "
                     "object, iterator or generator that is no pytree)")
    if where is not None:
        raise NeedsValueError(f"%%pathways: the cell keeps a value it computes in {where}; "
                              "it runs as plain Python.")


def leaves(value: Any) -> list[Any]:
    """``value``'s pytree leaves; ``[value]`` where JAX cannot flatten it (a dict whose keys
    do not sort, ``{1: x, "a": y}``, which plain Python holds and ``jax.jit`` refuses): the
    cell takes that as an object that is no pytree, as the notebook holds it."""
    try:
        return jax.tree_util.tree_leaves(value)
    except (ValueError, TypeError):
        return [value]


def _holds_traced(value: Any, budget: int = 10_000) -> bool:
    """``value`` (a pytree leaf the cell bound) holds a traced value: a function,
    ``functools.partial`` or class through its closure, defaults or attributes (and the
    function a ``jax.jit`` wraps), any other object through what it refers to (a
    ``SimpleNamespace``, a dataclass that is no pytree, an iterator, ``map``, a generator's
    frame). Namespaces (globals, modules) are not followed: the cell's own names are its
    outputs. At most ``budget`` objects are visited."""
    todo, seen = [value], set()
    while todo and budget > 0:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        budget -= 1
        if _traced(x):
            return True
        if isinstance(x, _OPAQUE) or (isinstance(x, dict) and "__builtins__" in x):
            continue
        if _is_jit(x):
            todo.append(x.__wrapped__)
        elif isinstance(x, functools.partial):
            todo += [x.func, x.args, x.keywords]
        elif isinstance(x, types.FunctionType):
            todo += [x.__defaults__, x.__kwdefaults__,
                     [c.cell_contents for c in x.__closure__ or () if _filled(c)]]
        elif isinstance(x, type):
            if x.__module__ != "builtins":
                todo += list(vars(x).values())
        else:
            todo += gc.get_referents(x)
    return False


# values that hold no traced value of the cell (or that are outputs of it): not followed
_OPAQUE = (str, bytes, int, float, complex, bool, type(None), types.ModuleType,
           types.CodeType, jax.Array, np.ndarray, np.generic, Future)


def _is_jit(value: Any) -> bool:
    return all(hasattr(value, a) for a in ("lower", "clear_cache", "__wrapped__"))


def _traced(x: Any) -> bool:
    """A value of a trace: a JAX tracer, or a program's placeholder."""
    return isinstance(x, jax.core.Tracer | Value)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


_CONTAINERS = (list, dict, set)


def _items(container) -> Any:
    return container.values() if type(container) is dict else container


def _drop_traced(container) -> int:
    """Take traced values out of ``container`` (by identity: a traced value compares as an
    array); how many there were."""
    if type(container) is dict:
        gone = [k for k, v in container.items() if _traced(v)]
        for k in gone:
            del container[k]
        return len(gone)
    kept = [x for x in container if not _traced(x)]
    n = len(container) - len(kept)
    if n:
        container.clear()
        (container.extend if type(container) is list else container.update)(kept)
    return n


def rehome(value: Any, scope: CellScope, user_ns: dict[str, Any]) -> Any:
    """What the cell defined, with the user's namespace as the globals of its functions (as
    without the magic): a function (a new one), a ``functools.partial`` of one (a new one), a
    class's methods (in place). Other wrappers (``functools.lru_cache``, ``jax.jit``) keep the
    scope, which reads through to the user's namespace; a ``global`` they set stays theirs."""
    if isinstance(value, types.FunctionType) and value.__globals__ is scope:
        out = types.FunctionType(value.__code__, user_ns, value.__name__, value.__defaults__,
                                 value.__closure__)
        out.__kwdefaults__, out.__qualname__ = value.__kwdefaults__, value.__qualname__
        out.__dict__.update(value.__dict__)
        out.__doc__, out.__module__ = value.__doc__, value.__module__
        out.__annotations__ = value.__annotations__
        return out
    if isinstance(value, functools.partial) and isinstance(value.func, types.FunctionType):
        func = rehome(value.func, scope, user_ns)
        return value if func is value.func else functools.partial(func, *value.args,
                                                                 **value.keywords)
    if isinstance(value, type):
        for name, attr in list(vars(value).items()):
            if isinstance(attr, types.FunctionType) and attr.__globals__ is scope:
                setattr(value, name, rehome(attr, scope, user_ns))
    return value

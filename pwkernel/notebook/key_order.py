"""The key order of the dicts a ``%%pathways`` cell binds.

JAX flattens a dict in sorted key order and rebuilds it so, where plain Python keeps the order
the keys were inserted in (``{"b": x, "a": y}`` lists ``b`` first, ``{2: x, 1: y}`` ``2``).
A cell's outputs come back through JAX's flattening, so the order each dict the cell built had
is recorded while the cell is traced (``order_of``) and given back to what it binds
(``restore``): the cell binds what the cell without the magic binds. (A ``jax.jit`` result, or
``jax.tree.map``'s, is sorted in the plain cell too, and stays so.)
"""

from __future__ import annotations

from typing import Any

import jax

#: (a dict's keys in its own order, the order of what each key holds)
_Dict = tuple[tuple[Any, ...], tuple[Any, ...]]


def order_of(value: Any) -> Any:
    """A record of the key order of the dicts in ``value``, None where there is nothing to
    give back (every dict's keys are in sorted order already, or there is no dict)."""
    if type(value) is dict:
        keys = tuple(value)
        subs = tuple(order_of(value[k]) for k in keys)
        if all(s is None for s in subs) and _sorted(keys):
            return None
        return ("dict", keys, subs)
    children = _children(value)
    if not children:
        return None
    subs = tuple(order_of(c) for c in children)
    return None if all(s is None for s in subs) else ("node", subs)


def restore(value: Any, order: Any) -> Any:
    """``value`` (the same pytree, rebuilt by JAX) with its dicts in the ``order`` recorded."""
    if order is None:
        return value
    if order[0] == "dict":
        _, keys, subs = order
        return {k: restore(value[k], s) for k, s in zip(keys, subs, strict=True)}
    children, treedef = _one_level(value)
    return jax.tree_util.tree_unflatten(
        treedef, [restore(c, s) for c, s in zip(children, order[1], strict=True)])


def _one_level(value: Any) -> tuple[list[Any], Any]:
    return jax.tree_util.tree_flatten(value, is_leaf=lambda c: c is not value)


def _children(value: Any) -> list[Any]:
    """``value``'s children as a pytree node (none for a leaf)."""
    children, treedef = _one_level(value)
    return [] if treedef.num_nodes == 1 else children


def _sorted(keys: tuple[Any, ...]) -> bool:
    try:
        return keys == tuple(sorted(keys))
    except TypeError:  # (keys that do not compare: keep their order)
        return False

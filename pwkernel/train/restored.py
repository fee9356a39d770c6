"""A training state as a checkpointer restores it without a target: ``orbax``'s
``restore(path)`` (or ``CheckpointManager.restore(step)``) gives a saved ``TrainState`` back
as ``{"params": [...], "opt_state": [...]}``, its optax states (named tuples) as dicts,
their tuples as lists and an empty state (``optax.EmptyState()``) as ``None``. The leaves
are the saved ones; only the containers differ from what ``init`` makes. Before, ``step``
refused the dict ("got dict"), and ``TrainState(**restored)`` was refused by the state's
check as another model's state, naming the same leaves twice (``[0]['count']`` against
``[0].count``).

``from_mapping`` rebuilds such a mapping into the trainer's own containers, matching the
leaves by their path's names (a named tuple's field and a dict's key alike), so
``step(mgr.restore(n), batch)`` resumes; ``hint`` tells the check's error that only
the containers differ. Both run only where ``step`` was given something else than a
``TrainState`` or the check already failed: never on the way of a step given its state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax


def from_mapping(state: Any, expected: Callable[[], Any]) -> Any:
    """``state`` as a ``TrainState`` in ``expected()``'s containers when it is a mapping of
    exactly ``params`` and ``opt_state`` (a ``TrainState`` restored without a target), with
    the same leaves by name; given other leaves, a ``TrainState`` of them as they are (the
    step's check then says where they differ); ``None`` for anything else. (``expected()``
    is a ``TrainState``: its type makes the new one, so this module imports no ``state``.)"""
    if not isinstance(state, Mapping) or set(state) != {"params", "opt_state"}:
        return None
    shapes = expected()
    got = type(shapes)(list(state["params"]), list(state["opt_state"]))
    want, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    by_name = {_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(got)[0]}
    if len(by_name) != len(want) or any(_names(path) not in by_name for path, _ in want):
        return got
    return jax.tree_util.tree_unflatten(treedef, [by_name[_names(path)] for path, _ in want])


def hint(got: Any, want: Any) -> str:
    """For the check's error: what to do when ``got`` holds ``want``'s leaves by name in
    other containers (a dict where ``init`` makes a named tuple): a state restored without a
    target and wrapped as ``TrainState(**restored)``."""
    def names(tree):
        return sorted((_names(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]),
                      key=repr)
    if names(got) != names(want):
        return ""
    return (" Its leaves are those init() makes, in other containers (dicts for optax's "
            "states), as orbax restores a checkpoint without a target: pass the restored "
            "dict to step() as it is, or restore with a target "
            "(ocp.args.StandardRestore(abstract state); docs/training.md, 'Saving and "
            "resuming').")


def _names(path) -> tuple:
    return tuple(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))) for k in path)

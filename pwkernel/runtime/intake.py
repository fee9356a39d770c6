"""How a run takes its arguments (``Dispatcher.submit``), as ``jax.jit`` reads a call's.

A host value is read at the call (a copy: the caller may refill its buffer before the upload
runs); a ``jax.Array`` is used as it is; a ``Future`` goes in its slot if it exists, or joins
the ``ArgumentGroup`` of its producer's pending futures (one watched future per producer, not
one hook per leaf). A future that an earlier call donated, one of another controller (closed,
or simulated) and a ``jax.ShapeDtypeStruct`` are refused with what to pass instead; an
argument a program returns as it is comes back as ``jax.jit`` returns it (``passed_through``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import numpy as np

from .errors import ControllerClosedError, ProgramError, deleted_input
from .graph import Graph
from .objects import Future, resolved
from .slots import ArgumentGroup

if TYPE_CHECKING:
    from .tasks import ProgramRun


def passed_through(value, weak: bool) -> Future:
    """A program's argument returned as it is, as ``jax.jit`` returns one: a ``jax.Array``
    with its sharding (a host value put on the default device; a Python scalar weakly typed;
    a ``float0`` value, a gradient's of an int, has no data to put anywhere: a new host array
    of it, as ``jax.jit`` gives)."""
    if getattr(value, "dtype", None) == jax.dtypes.float0:
        return resolved(np.zeros(np.shape(value), jax.dtypes.float0))
    if not isinstance(value, jax.Array):
        value = jax.numpy.asarray(value.item()) if weak else jax.device_put(value)
    fut = resolved(value, value.sharding)
    fut.weak_type = weak
    return fut


def take_arguments(run: ProgramRun, graph: Graph, leaves: list, store) -> dict:
    """Put a run's arguments and constants in their slots; returns the arguments still
    pending, by the task making them: a state of many leaves is one ``ArgumentGroup``,
    watched on the one of its futures its producer resolves last.

    A group's first future is looked at in full; the rest of its producer's futures that
    follow it join it as they come (a state's leaves: one check per state, not per leaf).
    One of them that resolved meanwhile is the group's to count, through its hooks, like a
    value that arrives later. Their values are read now only if the producer has launched
    (``has_outputs``); else the group's launch hook puts them in their slots."""
    plan, parallel = run.plan, run.parallel
    values, futures, t_done = run.values, run.futures, run.t_done
    pending: dict = {}
    checked = group = made_by = None  # the last producer checked; the last group, its maker
    peek = False  # the group's producer has launched: its values exist (maybe computing)
    for slot, leaf in zip(plan.inputs, leaves, strict=True):
        if not isinstance(leaf, Future):
            # a host value is read now, as ``jax.jit`` reads it during the call: a copy (the
            # caller may refill its buffer before the upload runs)
            if isinstance(leaf, jax.Array):
                values[slot] = leaf
            elif type(leaf) is jax.ShapeDtypeStruct:
                raise ProgramError(
                    f"{graph.name} was called with a jax.ShapeDtypeStruct, which has no value: "
                    "eval_shape(...) and lower(...) take it; a call takes arrays.")
            else:
                values[slot] = np.array(leaf, graph.values[slot].dtype)
            t_done[slot] = 0.0
            made_by = None
            continue
        futures[slot] = leaf
        producer = leaf.producer
        if producer is not made_by or producer is None:  # (not the group being filled)
            if producer is None or producer is not checked:  # (one run, one store)
                held_by = leaf.store
                if held_by is not store and held_by is not None:
                    _refuse_foreign(leaf)
                checked = producer
            if leaf.done():
                if leaf.error is not None:
                    run.errors[slot] = leaf.error
                elif leaf.donated and _consumed(leaf.peek()):
                    run.errors[slot] = deleted_input(
                        f"input {plan.inputs.index(slot)} of {graph.name} was given to an "
                        "earlier call that donates it, which now owns its buffer",
                        leaf.peek().aval.str_short())
                else:
                    values[slot] = leaf.peek()
                t_done[slot] = leaf.t_done
                made_by = None  # (its next future is looked at in full too)
                continue
            key = leaf if producer is None else producer
            group = pending.get(key)
            if group is None:
                group = pending[key] = ArgumentGroup(leaf)
            made_by = producer
            peek = parallel and (producer is None or producer.has_outputs)
        group.slots.append(slot)
        group.futures.append(leaf)
        if leaf.order > group.watched.order:
            group.watched = leaf
        if peek:
            values[slot] = leaf.peek()  # launched already, or None
    for slot, const in plan.consts:
        values[slot] = const
        t_done[slot] = 0.0
    return pending


def _consumed(value) -> bool:
    """A donated value is gone, also in part: a host view of one shard (``np.asarray`` of a
    replicated array on CPU) keeps that shard from being donated, so ``is_deleted()`` says
    False while another shard is gone, and XLA's call would crash the process on it."""
    if getattr(value, "is_deleted", None) is None:
        return False
    return value.is_deleted() or any(s.data.is_deleted() for s in value.addressable_shards)


def _refuse_foreign(leaf: Future) -> None:
    """A future of another controller's store was passed to a program: say what to pass."""
    if leaf.store.closed:
        raise ControllerClosedError(
            "a future from a closed controller was passed to a program; its buffer is gone. "
            "Pass fut.result() (a jax.Array) or rerun the program that made it.")
    if leaf.run is not None and leaf.run.owner.virtual:  # (its result() raises NoValueError)
        raise ProgramError(
            f"a future from another controller, a simulated one, was passed to a program; it "
            f"has no value to move across. Pass an array of its shape and dtype instead, "
            f"e.g. np.zeros({tuple(leaf.shape)}, {str(leaf.dtype)!r}).")
    raise ProgramError("a future from another controller was passed to a program; pass "
                       "fut.result() to move the value across.")

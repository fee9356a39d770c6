"""A call that donates a value goes after the earlier calls that read it, as under ``jax.jit``.

``jax.jit`` dispatches calls in the order they are made, and XLA holds a buffer for every
call dispatched before the one that consumes it. Here a call may wait to launch (for an input
from another island, the upload of a NumPy argument, memory) while a later call that donates
one of its arguments is ready at once: launched first, that one would consume the buffer and
the earlier call would fail with "was given to an earlier call that donates it". An eval
submitted after training step n and before step n+1 (which donates the parameters) is the
usual case.

So before a run starts, each of its computations that donates a future (or the user's
``jax.Array`` it was asked to donate) waits, one more arrival each, for every node of an
earlier run that reads it and has not launched: for its launch, its end, or its failure or
cancellation (``RunSlots.on_launch``); a future and its ``result()`` (one buffer) are one
value here. Inside one program, ``Plan.gates`` orders the same.
Only donating runs look, through the dispatcher's live runs that read an argument without
donating it (``Plan.read_inputs``), newer than the run that made what they donate (its
readers were submitted after it); a run that donates nothing pays one check of its plan.
"""

from __future__ import annotations

import jax

from .objects import Future


def gate(runs: dict, run, release) -> None:
    """Before ``run`` starts (its arguments taken; ``runs``: the other live runs, by id):
    each of its nodes that donates a future or a ``jax.Array`` waits for the earlier runs'
    nodes that read it and have not launched; ``release(run, index)`` is called once for
    each as it launches or ends."""
    donors: dict[int, list[int]] = {}  # id of a donated argument -> the nodes donating it
    floor = None  # runs up to this id were made before every donated future was
    for index, slot in run.plan.donated_inputs:
        given = _given(run, slot)
        if given is None:
            continue
        for key in _keys(given):
            donors.setdefault(key, []).append(index)
        made_by = given.run if isinstance(given, Future) else None
        low = made_by.id if made_by is not None else -1
        floor = low if floor is None or low < floor else floor
    if not donors:
        return
    for earlier in list(runs.values()):
        tasks = earlier.tasks  # ([] once it is over)
        if earlier.id <= floor or not tasks or not earlier.plan.read_inputs:
            continue
        consumers = earlier.plan.consumers
        for slot in earlier.plan.read_inputs:
            given = _given(earlier, slot)
            if given is None:
                continue
            nodes = None
            for key in _keys(given):
                nodes = donors.get(key)
                if nodes is not None:
                    break
            if nodes is None:
                continue
            for reader in consumers[slot]:
                for index in nodes:
                    run.after_launch(index, earlier, tasks[reader], release)


def _given(run, slot: int):
    """The argument ``run`` was given in ``slot`` that a donation consumes: a future, or the
    user's ``jax.Array`` (None: a host value, copied at the call, or the run is over)."""
    fut = run.futures.get(slot)
    if fut is not None:
        return fut
    values = run.values
    value = values[slot] if values is not None else None
    return value if isinstance(value, jax.Array) else None


def _keys(given) -> list[int]:
    """What identifies the buffer ``given`` stands for: the future, and its array once it
    has one (``fut.result()`` given to one call and ``fut`` to another are one buffer)."""
    held = given.peek() if isinstance(given, Future) else None
    return [id(given), id(held)] if isinstance(held, jax.Array) else [id(given)]

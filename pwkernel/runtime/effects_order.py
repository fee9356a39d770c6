"""Computations with ordered effects launch in the order they were called, as under ``jax.jit``.

``jax.experimental.io_callback(..., ordered=True)`` and ``jax.debug.print(..., ordered=True)``
run in call order under ``jax.jit``: each call is dispatched in the order it is made, and JAX
threads a runtime token from one ordered computation to the next, so a later call's callback
waits for an earlier one's even when the earlier call waits for its inputs. Here a call may
wait to launch (for an input from another island, an upload, memory) while a later one is
ready at once; launched first, its callback would run first. Once launched, JAX's own token
keeps them in order, so launching them in order is enough.

So before a run starts, each of its computations with ordered effects waits, one more arrival
each, for the launch (or end) of the ordered computation before it: the last one of each
earlier live run that has not launched, and the one before it in its own program. A run
without ordered effects pays nothing (``Plan.ordered`` is empty).
"""

from __future__ import annotations

from jax._src import effects


def has_ordered_effects(exe) -> bool:
    """Whether a compiled specialization's body has ordered effects (its traced jaxpr says)."""
    jaxpr = getattr(exe, "jaxpr", None)
    return bool(jaxpr is not None and effects.ordered_effects.filter_in(jaxpr.effects))


def gate(runs: dict, run, release) -> None:
    """Before ``run`` starts (``runs``: the other live runs, by id, all made before it): each of
    its ordered nodes waits for the ordered node before it; its first for those of the earlier
    runs that have not launched. ``release(run, index)`` is called once for each as it
    launches or ends."""
    ordered = run.plan.ordered
    first = ordered[0]
    for earlier in list(runs.values()):
        tasks = earlier.tasks  # ([] once it is over)
        if earlier is run or not tasks or not earlier.plan.ordered:
            continue
        # its last one: the others launch before it (its own chain, below)
        run.after_launch(first, earlier, tasks[earlier.plan.ordered[-1]], release)
    for before, index in zip(ordered, ordered[1:], strict=False):
        run.after_launch(index, run, run.tasks[before], release)


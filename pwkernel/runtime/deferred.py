"""Calls deferred to the end of the current one, per thread: ``soon`` and ``later``.

A failure spreads from a task to everything that depends on it, and an end can launch the
next task, which can end at once: done by plain recursion, a long chain would go as deep as
the chain. ``soon`` runs a call now, or queues it behind the one this thread is running, so
those cascades stay flat.
"""

from __future__ import annotations

import threading

_local = threading.local()


def soon(fn, *args) -> None:
    """Run ``fn(*args)`` now, or after the current one if this thread is already inside one:
    failures cascading down long chains stay flat instead of recursing."""
    pending = getattr(_local, "pending", None)
    if pending is not None:
        pending.append((fn, args))
        return
    _local.pending = pending = [(fn, args)]
    try:
        while pending:
            f, a = pending.pop(0)
            f(*a)
    finally:
        _local.pending = None


def later(fn, *args) -> bool:
    """Inside a ``soon`` loop with work queued: make sure ``fn(*args)`` runs after it (True).
    A call already queued is not queued twice, so two copies of one (the memory check) cannot
    re-queue behind each other forever: the queue empties and the last copy runs."""
    pending = getattr(_local, "pending", None)
    if pending:
        if (fn, args) not in pending:
            pending.append((fn, args))
        return True
    return False

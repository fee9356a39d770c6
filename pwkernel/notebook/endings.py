"""When a ``%%pathways`` cell's program ends: the futures a cell waits on, the ``--timeout``
clock of a ``--no-block`` cell, and the callback that tells its display how it ended.

Everything here waits on futures' done-callbacks or events, never on a timer loop, so a
cell's display learns of the end from the runtime thread that resolved its last output.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..runtime.errors import CancelledError
from ..runtime.objects import Future
from ..runtime.tasks import TaskState


class Deadline:
    """``--timeout S`` of a ``--no-block`` cell: cancels the program's queued computations when
    S seconds pass before it ends, and says so in the cell's display."""

    def __init__(self, run, seconds: float):
        self.run, self.seconds = run, seconds
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.name = f"pwkernel-timeout-{run.name}"
        self._timer.start()

    def _expire(self) -> None:
        if not self.run.done():
            self.expired = True  # before cancelling: the run may end inside cancel()
            self.run.cancel(f"timed out after --timeout {self.seconds:g} s")

    def finish(self, status: str) -> str:
        """The program ended with ``status``: stop the clock, and say if it ran out."""
        self._timer.cancel()
        return f"{status} (--timeout {self.seconds:g} s expired)" if self.expired else status


def leaves(results) -> list[Future]:
    import jax

    return [f for f in jax.tree_util.tree_leaves(results) if isinstance(f, Future)]


def launched(value) -> bool | None:
    """After its program was cancelled: whether every future in ``value`` (what a cell binds to
    a name) still gets its value, its computation launched (or ended) before the cancel, which
    does not recall it; None when ``value`` holds no future."""
    futs = leaves(value)
    if not futs:
        return None
    return not any(f.cancelled() or (f.producer is not None
                                     and f.producer.state is TaskState.CANCELLED)
                   for f in futs)


def after_all(futures: list[Future], fn: Callable[[], None]) -> None:
    """Call ``fn()`` once every one of ``futures`` has a value or an error (at once if none)."""
    left, lock = [len(futures)], threading.Lock()

    def one(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        fn()

    if not futures:
        fn()
    for f in futures:
        f.add_done_callback(one)


def all_resolved(futures: list[Future]) -> threading.Event:
    """An event set once every one of ``futures`` has a value or an error."""
    event = threading.Event()
    after_all(futures, event.set)
    return event


def when_done(run, results, callback) -> None:
    """Call ``callback(status)`` from the runtime once every output of ``run`` resolved."""
    futs = leaves(results)
    if not futs:
        callback("submitted")
        return

    def ended() -> None:
        bad = [f for f in futs if f.exception(0) is not None]
        if not bad:
            callback(f"done in {max(f.t_done for f in futs) - run.t_submit:.3f} s")
        elif all(isinstance(f.exception(0), CancelledError) for f in bad):
            callback("cancelled")
        else:
            callback(f"failed: {bad[0].exception(0)}")

    after_all(futs, ended)

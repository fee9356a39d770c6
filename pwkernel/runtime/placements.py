"""The process's one gate on moving slices (of every controller): ``ResourceManager.remap``
moves inside ``placements.moving()``, ``pw.function`` and ``@pw.program`` trace inside
``placements.tracing()``."""

from __future__ import annotations

import collections
import contextlib
import threading

from .errors import SliceError


class _Placements:
    """Slices move only while no other thread traces a program: a trace reads its slices'
    devices and meshes many times (placing inputs, compiling), and one that read them on both
    sides of a move would build a graph whose inputs sit on one set of devices and whose
    computation was compiled for another. Traces do not wait for each other; a remap waits for
    the traces of other threads to end (its own thread's: a program that remaps while traced,
    goes on), and traces that start meanwhile wait for the move. Of two programs that remap
    while traced in two threads, each would wait for the other's trace: the second to ask is
    refused (``SliceError``), and the first moves once that trace has ended."""

    def __init__(self):
        self._changed = threading.Condition()
        self._tracing: collections.Counter = collections.Counter()  # thread -> traces
        self._upgrading: set[int] = set()  # tracing threads waiting to move (the others' end)

    @contextlib.contextmanager
    def tracing(self):
        me = threading.get_ident()
        with self._changed:
            self._tracing[me] += 1
        try:
            yield
        finally:
            with self._changed:
                self._tracing[me] -= 1
                if not self._tracing[me]:
                    del self._tracing[me]
                self._changed.notify_all()

    @contextlib.contextmanager
    def moving(self):
        me = threading.get_ident()
        with self._changed:
            if me in self._tracing:  # (its own trace goes on: others may wait for its end)
                if self._upgrading:
                    raise SliceError(
                        "remap inside a program while it is traced, while a program another "
                        "thread traces waits to remap too: each would wait for the other's "
                        "trace to end. Remap before calling the program (outside its "
                        "function), or from one thread at a time.")
                self._upgrading.add(me)
            try:
                self._changed.wait_for(lambda: not self._tracing.keys() - {me})
            finally:
                self._upgrading.discard(me)
            yield


#: the process's: slices of every controller
placements = _Placements()

"""The process's one gate on moving slices (of every controller): ``ResourceManager.remap``
moves inside ``placements.moving()``, ``pw.function`` and ``@pw.program`` trace inside
``placements.tracing()``."""

from __future__ import annotations

import collections
import contextlib
import threading


class _Placements:
    """Slices move only while no other thread traces a program: a trace reads its slices'
    devices and meshes many times (placing inputs, compiling), and one that read them on both
    sides of a move would build a graph whose inputs sit on one set of devices and whose
    computation was compiled for another. Traces do not wait for each other; a remap waits for
    the traces of other threads to end (its own thread's: a program that remaps while traced,
    goes on), and traces that start meanwhile wait for the move."""

    def __init__(self):
        self._changed = threading.Condition()
        self._tracing: collections.Counter = collections.Counter()  # thread -> traces

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
            self._changed.wait_for(lambda: not self._tracing.keys() - {me})
            yield


#: the process's: slices of every controller
placements = _Placements()

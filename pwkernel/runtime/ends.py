"""The order ends are reported in: the one place the runtime keeps it, for every backend.

A backend says only "this launch completed, seen at ``t`` (or failed)" (``Task.completed``).
The runtime reports the task's end (``tasks.py``) once two things hold:

- **launch order per device set**: every computation launched before it on the same devices
  (in the order its island's scheduler decided them) has ended;
- **after the inputs' ends**: every value it reads has ended (so an upstream error wins, and a
  consumer's end never comes before its producer's).

Nothing waits for this: a completion that may not be reported yet is parked, and whoever
reports the end it waits for (the previous computation's, or an input's) reports it too, in
the same thread, in a flat loop (an end can launch more work on the same devices, which can
complete at once: that adds to the loop instead of recursing). A completion that may be
reported at once (the usual case: the outputs were ready right after the call) is reported by
the thread that said so, with one check of the queue's head.

The waits cannot go round in a circle: a task waits only for tasks decided before it (its
island's earlier launches, and its inputs' makers, which were launched before it was ready).
"""

from __future__ import annotations

import collections
import threading
from typing import Any


class Line:
    """The computations launched on one device set whose ends are not reported yet, in launch
    order (see the module docstring). ``add`` is called in decision order, under the island's
    lock; ``pump`` from any thread."""

    __slots__ = ("_tasks", "_lock", "_busy", "last_end", "add")

    def __init__(self, last_end: dict[int, float]):
        self._tasks: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._busy = False  # a thread is reporting this line's ends
        self.last_end = last_end  # the island's: device -> end of the last work seen there
        #: ``add(task)``: a launch joins the line (the deque's own append: no Python frame)
        self.add = self._tasks.append

    def remove(self, task: Any) -> None:
        """Take out a task whose end was reported without this line (``Task.ended``)."""
        with self._lock:
            tasks = self._tasks
            if tasks and tasks[0] is task:
                tasks.popleft()
            else:
                tasks.remove(task)
        if tasks:
            self.pump()

    def __len__(self) -> int:
        return len(self._tasks)

    def span(self, devices, t_start: float, t: float) -> tuple[float, float]:
        """A reported end's span on ``devices`` (of this line): it starts not before the end
        of the work before it there, and ends not before it starts; the next work there
        starts after this end."""
        last_end = self.last_end
        for d in devices:
            prev = last_end.get(d, 0.0)
            if prev > t_start:
                t_start = prev
        if t < t_start:
            t = t_start
        for d in devices:
            last_end[d] = t
        return t_start, t

    def pump(self) -> None:
        """Report the ends at the head that may be reported (completed, inputs ended). One
        thread at a time; another that finds it busy leaves its completion to it (set before
        the call, so the busy thread's next look at the head sees it)."""
        lock, tasks = self._lock, self._tasks
        with lock:  # (the run's lock is taken inside this one, never the other way)
            if self._busy:
                return
            head = tasks[0] if tasks else None
            t_inputs = None if head is None or head.report is None else head.run.park(head)
            if t_inputs is None:  # nothing to report; a parked head's input end pumps
                return
            tasks.popleft()
            self._busy = True
        while True:
            head.report_end(t_inputs)
            with lock:
                head = tasks[0] if tasks else None
                if head is None:  # (the usual case: nothing launched behind it yet)
                    self._busy = False
                    return
                t_inputs = None if head.report is None else head.run.park(head)
                if t_inputs is None:
                    self._busy = False
                    return
                tasks.popleft()


class EndOrder:
    """One island's lines, by device set, and when work last ended on each device."""

    __slots__ = ("lines", "last_end")

    def __init__(self):
        #: by device set (read under the island's lock; ``line`` adds one)
        self.lines: dict[tuple[int, ...], Line] = {}
        self.last_end: dict[int, float] = {}

    def line(self, devices: tuple[int, ...]) -> Line:
        """The line of ``devices`` (called under the island's lock)."""
        line = self.lines.get(devices)
        if line is None:
            line = self.lines[devices] = Line(self.last_end)
        return line

    def unreported(self) -> int:
        """Computations launched here whose ends are not reported yet."""
        return sum(len(line) for line in list(self.lines.values()))


"""The background thread that keeps live views current, off the dispatch path.

It never touches the runtime's locks beyond reading ``trace.next_index`` (a plain int) and,
only when that moved, one ``trace.events(since=k)`` copy of the new events. It stops when its
view closes (from Python or from the page), when the controller closes, or when ``stop()`` is
called.

A view made live calls ``close_with_page(view)``: when the page closes the view's widget
(its model's comm closed from the frontend), the view closes as ``view.close()`` would, so its
thread ends and ipywidgets lets go of it, instead of following the controller until it closes.

It keeps to a budget: updates may take ``budget`` of the thread's time (CPU seconds of this
thread per wall second, 1 % by default). When programs run so fast that an update costs more
than that at ``interval``, it waits longer between updates, so each update takes more events
at once (cheaper per event) and the view never slows the programs by more than about the
budget; at ordinary rates it updates every ``interval``. It never waits more than
``max_wait`` (1 s by default) all the same: one costly update (the first, which draws the
plot, on a busy machine) must not leave a view a minute behind the programs it shows.

``until``: something with ``done()`` (a ``ProgramRun``): once it is done, one last update
shows its end and the thread stops (a cell's view, which nothing new will ever enter). A
paused updater still notices its controller close (within ``max_wait``) and makes that last
update.

>>> import threading
>>> ticks = threading.Event()
>>> class Ctl: closed = False
>>> u = LiveUpdater(Ctl(), ticks.set, interval=0.01)
>>> ticks.wait(5.0)
True
>>> u.stop(); u.is_alive()
False
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.1  # seconds: ~10 updates a second is smooth and costs next to nothing
DEFAULT_BUDGET = 0.01  # fraction of the time the updates may take (see the module docstring)
DEFAULT_MAX_WAIT = 1.0  # seconds: the longest a view lags, whatever its updates cost


class LiveUpdater:
    """Calls ``tick()`` every ``interval`` seconds (or less often, to keep within ``budget``)
    in a daemon thread until stopped, never more than ``max_wait`` apart; ``pause()`` and
    ``resume()`` hold it without stopping it.

    ``tick`` returning normally keeps it going; an exception is logged once and stops the
    thread (a broken view must not spam the kernel log ten times a second).
    """

    def __init__(self, ctl, tick: Callable[[], object], interval: float = DEFAULT_INTERVAL,
                 name: str = "pwkernel-viz-updater", budget: float = DEFAULT_BUDGET,
                 max_wait: float = DEFAULT_MAX_WAIT, until=None):
        if not interval > 0:
            raise ValueError(f"the update interval must be > 0 seconds, got {interval!r}.")
        if not 0 < budget <= 1:
            raise ValueError(f"budget is a fraction of the time in (0, 1], got {budget!r}; "
                             "e.g. budget=0.02 for 2 %.")
        self._ctl = ctl
        self._tick = tick
        self._until = until
        self.interval = float(interval)
        self.budget = float(budget)
        self.max_wait = max(float(max_wait), self.interval)  # a slow interval is kept
        self.wait = self.interval  # the current wait between updates
        self.ticks = 0  # updates made
        self.cpu_seconds = 0.0  # this thread's CPU time in updates
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.wait):
            if self._over():
                break
            if not self._running.is_set():  # paused: resume() or stop() (which sets it)
                self._running.wait(self.max_wait)  # wakes it; a close is seen meanwhile
                continue
            spent = time.thread_time()
            try:
                self._tick()
            except BaseException as exc:  # noqa: BLE001 - reported, then the thread ends
                self.error = exc
                log.exception("pwkernel live view update failed; the view stops updating")
                break
            spent = time.thread_time() - spent
            self.ticks += 1
            self.cpu_seconds += spent
            self.wait = min(self.max_wait, max(self.interval, spent / self.budget - spent))
        # A last update so the view shows the events that ended with the controller (or
        # with what it was following).
        if self._over() and self.error is None and not self._stop.is_set():
            try:
                self._tick()
            except BaseException as exc:  # noqa: BLE001
                self.error = exc

    def _over(self) -> bool:
        """The controller closed, or what the updater follows (``until``) is done."""
        return (getattr(self._ctl, "closed", False)
                or (self._until is not None and self._until.done()))

    def pause(self) -> None:
        """Hold updates (the thread stays) until ``resume()``."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and wait for it (not when called from the thread itself)."""
        self._stop.set()
        self._running.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        return self._thread


def close_all(*widgets) -> None:
    """Close each widget with everything it made: its children (a box's), recursively, and
    its ``layout`` and ``style``. ipywidgets' ``close()`` closes only the widget itself; its
    layout and style are widgets of their own that stay open in ipywidgets' registry (and
    their comms in the kernel) for the rest of the kernel's life, 23 of them for each
    ``ScheduleView`` made and closed. Closing twice is harmless (a shared layout too)."""
    for widget in widgets:
        if widget is None:
            continue
        close_all(*getattr(widget, "children", ()))
        for part in ("layout", "style"):
            child = getattr(widget, part, None)
            if child is not None and callable(getattr(child, "close", None)):
                child.close()
        widget.close()


def close_with_page(widget) -> None:
    """Call ``widget.close()`` when the frontend closes the widget's comm (the page dropped its
    model), as the kernel's comm manager reports it: a live view then stops its updater thread
    and closes its child widgets, as ``view.close()`` does. ipywidgets itself only forgets the
    comm, and would keep the view (and its thread) until the controller closes."""
    channel = getattr(widget, "comm", None)
    if channel is None:  # (a widget made with no comm: nothing can close it from a page)
        return

    def closed_by_page(_msg) -> None:
        if getattr(widget, "comm", None) is channel:  # (not once the kernel closed it)
            widget.close()

    channel.on_close(closed_by_page)

"""The background thread that keeps live views current, off the dispatch path.

It never touches the runtime's locks beyond reading ``trace.next_index`` (a plain int) and,
only when that moved, one ``trace.events(since=k)`` copy of the new events. It stops when its
view closes, when the controller closes, or when ``stop()`` is called.

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
from collections.abc import Callable

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.1  # seconds: ~10 updates a second is smooth and costs next to nothing


class LiveUpdater:
    """Calls ``tick()`` every ``interval`` seconds in a daemon thread until stopped.

    ``tick`` returning normally keeps it going; an exception is logged once and stops the
    thread (a broken view must not spam the kernel log ten times a second).
    """

    def __init__(self, ctl, tick: Callable[[], object], interval: float = DEFAULT_INTERVAL,
                 name: str = "pwkernel-viz-updater"):
        if not interval > 0:
            raise ValueError(f"the update interval must be > 0 seconds, got {interval!r}.")
        self._ctl = ctl
        self._tick = tick
        self.interval = float(interval)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if getattr(self._ctl, "closed", False):
                break
            try:
                self._tick()
            except BaseException as exc:  # noqa: BLE001 - reported, then the thread ends
                self.error = exc
                log.exception("pwkernel live view update failed; the view stops updating")
                break
        # A last update so the view shows the events that ended with the controller.
        if getattr(self._ctl, "closed", False) and self.error is None and not self._stop.is_set():
            try:
                self._tick()
            except BaseException as exc:  # noqa: BLE001
                self.error = exc

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and wait for it (not when called from the thread itself)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

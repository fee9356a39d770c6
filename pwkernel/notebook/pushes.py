"""One thread that pushes to every subscribed comm, however many there are.

A subscriber is anything with ``push(cache) -> bool``: it sends its update and returns False
when it cannot be reached any more (then it is dropped). ``cache`` is a dict shared by the
subscribers served in the same tick, so a snapshot taken once serves them all.

The thread starts with the first subscriber and ends with the last one, so an idle kernel
keeps no thread for it. At most ``limit`` subscribers are served: subscribing one more drops
the one that subscribed longest ago (a frontend that went away without closing its comm is
the usual reason for so many) and hands it back, so the caller can tell it.

>>> updater = Updater(limit=16)                         # doctest: +SKIP
>>> updater.add(conn, interval=0.5)                     # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Protocol


class Subscriber(Protocol):
    def push(self, cache: dict[Any, Any]) -> bool: ...


class Updater:
    """Calls each subscriber's ``push`` every ``interval`` seconds (its own), from one thread."""

    def __init__(self, limit: int, name: str = "pwkernel-comm-updater"):
        self.limit = limit
        self.name = name
        self._cond = threading.Condition()
        # subscriber -> (order of subscription, interval, next due time)
        self._subs: dict[Subscriber, tuple[int, float, float]] = {}
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def subscribed(self, sub: Subscriber) -> bool:
        with self._cond:
            return sub in self._subs

    def count(self) -> int:
        with self._cond:
            return len(self._subs)

    def add(self, sub: Subscriber, interval: float) -> Subscriber | None:
        """Serve ``sub`` every ``interval`` seconds; returns the subscriber dropped to make
        room (the one subscribed longest ago), or None."""
        with self._cond:
            self._subs.pop(sub, None)
            dropped = None
            if len(self._subs) >= self.limit:
                dropped = min(self._subs, key=lambda s: self._subs[s][0])
                del self._subs[dropped]
            self._subs[sub] = (next(self._order), interval, time.monotonic() + interval)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return dropped

    def remove(self, sub: Subscriber) -> None:
        """Stop serving ``sub``; the last one out waits for the thread to end."""
        with self._cond:
            self._subs.pop(sub, None)
            thread = self._thread if not self._subs else None
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _due(self) -> list[Subscriber] | None:
        """Wait until some subscriber is due; None when there are none left (thread ends)."""
        with self._cond:
            while True:
                if not self._subs:
                    self._thread = None
                    return None
                now = time.monotonic()
                wake = min(due for _, _, due in self._subs.values())
                if wake <= now:
                    due = [s for s, (_, _, t) in self._subs.items() if t <= now]
                    for s in due:
                        order, interval, _ = self._subs[s]
                        self._subs[s] = (order, interval, now + interval)
                    return due
                self._cond.wait(wake - now)

    def _run(self) -> None:
        while (due := self._due()) is not None:
            cache: dict[Any, Any] = {}
            for sub in due:
                try:
                    alive = sub.push(cache)
                except Exception:  # noqa: BLE001 - one subscriber's failure stops only it
                    alive = False
                if not alive:
                    with self._cond:
                        self._subs.pop(sub, None)

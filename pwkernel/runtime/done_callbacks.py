"""Where a future's done-callbacks (``Future.add_done_callback``) run: on a thread of their
own, in the order their futures resolved, never on the runtime's threads.

A future resolves on whichever thread sees its computation end: an island's watcher, a
transfer thread, or a thread that launches or waits there. A user's callback run right there
would hold that thread while it runs, and one that waits for another result of the same
devices (``g(fut).result()``) would wait for an end that the thread it holds must report: a
deadlock. So the runtime hands a resolved future's callbacks to this runner. Its thread starts
when there is work and ends when there is none (no thread is left behind); a callback that
blocks holds back only the callbacks after it. A callback added to a future that has resolved
already runs at once, in the thread that adds it, as ``concurrent.futures`` does; a callback
that raises is logged, never raised into the runtime or the caller (on the runner's thread,
even a ``SystemExit`` or other ``BaseException``: the runner goes on with the next one).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CallbackRunner", "call", "check", "runner"]

_log = logging.getLogger("pwkernel")


def check(fn: Any) -> None:
    """``fn`` is a callable, or a ``TypeError`` at ``add_done_callback`` that says so (not a
    log line later, on the runner's thread, far from the call that gave it)."""
    if not callable(fn):
        raise TypeError(f"add_done_callback needs a callable taking the future, got "
                        f"{type(fn).__name__} {fn!r}. Maybe you want "
                        "fut.add_done_callback(lambda f: print(f.result())).")


def call(fn: Callable[[Any], None], fut: Any) -> None:
    """``fn(fut)``; what it raises is logged."""
    try:
        fn(fut)
    except Exception:  # a user's callback must break neither the runtime nor its caller
        _log.exception("future done-callback raised")


class CallbackRunner:
    """One thread at a time that runs queued callbacks in order, started on demand."""

    def __init__(self, name: str = "pw-done-callbacks"):
        self.name = name
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def submit(self, callbacks: Sequence[Callable[[Any], None]], fut: Any) -> None:
        """Run ``fn(fut)`` for each of ``callbacks``, after everything submitted before."""
        with self._lock:
            self._queue.append((callbacks, fut))
            if self._thread is not None:
                return
            thread = self._thread = threading.Thread(target=self._drain, name=self.name,
                                                     daemon=True)
        thread.start()

    def _drain(self) -> None:
        queue = self._queue
        while True:
            with self._lock:
                if not queue:
                    self._thread = None
                    self._idle.notify_all()
                    return
                callbacks, fut = queue.popleft()
            for fn in callbacks:
                try:
                    call(fn, fut)
                except BaseException:  # (``sys.exit()``: raised here, it would end this thread
                    # while ``_thread`` still names it, and no later callback would ever run)
                    _log.exception("future done-callback raised")
            callbacks = fut = None  # (an idle runner keeps no future alive)

    def on_its_thread(self) -> bool:
        """The calling thread is the runner's (a callback is running it)."""
        return self._thread is threading.current_thread()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every callback submitted so far has run (False: ``timeout`` passed, or
        called from a callback, which cannot wait for itself)."""
        if self.on_its_thread():
            return False
        with self._lock:
            return self._idle.wait_for(lambda: self._thread is None, timeout)

    def wait_idle_unless(self, stop: Callable[[], bool], poll: float = 0.1) -> bool:
        """``wait_idle``, asking ``stop()`` every ``poll`` seconds: False once it says to
        stop (or from a callback, which cannot wait for itself)."""
        while not self.wait_idle(poll):
            if self.on_its_thread() or stop():
                return False
        return True


#: the process's runner (every controller's futures)
runner = CallbackRunner()

"""The process's open controllers, and which one is the process-wide one (``pw.controller()``).

Every controller registers itself when made and leaves when closed; those still open when the
process exits are closed then, newest first, while the interpreter still runs threads. Two
open local controllers over the same devices are warned about (``SharedDevicesWarning``): each
has its own gang scheduler. The controllers are known here only through their public parts
(``closed``, ``backend``, ``devices``, ``close()``), so this module imports no controller.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from . import interrupts
from .exits import run_before_pools_stop

_lock = threading.Lock()
# held while pw.controller() finds or makes the process-wide controller: one thread makes it,
# the others wait and get that one (re-entrant: a backend made there may ask for it)
_making_lock = threading.RLock()
_making = threading.local()  # ``default``: pw.controller() is making the controller
_default: Any = None
_open: list[Any] = []


class SharedDevicesWarning(UserWarning):
    """Two open controllers hold the same local devices: each has its own gang scheduler, so
    their computations are not ordered together (collectives on both may deadlock)."""


def register(ctl: Any) -> None:
    """``ctl`` is open (called by the controller as it is made: a warning points at the
    caller's caller)."""
    with _lock:
        mine = set(ctl.devices) if ctl.backend == "local" else set()
        shared = [other for other in _open if not other.closed and other.backend == "local"
                  and mine & set(other.devices)]
        _open.append(ctl)
    run_before_pools_stop(close_at_exit)
    if shared:
        ids = sorted(d.id for d in mine & set(shared[0].devices))
        warnings.warn(
            f"another open controller already holds devices {ids}; this one shares them "
            "with its own gang scheduler, so their computations are not ordered together "
            "(collectives from both may deadlock). "
            + ("pw.controller() made it because no controller was set as the process-wide "
               "one: call ctl.set_default() on yours first, and pw.controller() returns it."
               if getattr(_making, "default", False) else
               "Maybe you want pw.controller() (the process-wide one), or to close the other "
               "first (ctl.close())."),
            SharedDevicesWarning, stacklevel=4)  # (the line that made it: past __init__'s
            # keyword check, keywords.suggests_keywords)


@interrupts.holds_from_entry
def close_at_exit() -> None:
    """Close every open controller, newest first, while the interpreter still runs threads: a
    script that ends without ``ctl.close()`` leaves its watcher threads to be stopped by the
    interpreter's finalization, where one that drops a ``jax.Array`` aborts the process
    (status 134, "FATAL: exception not rethrown"). Also called by a notebook kernel asked to
    shut down (``notebook/kernel_shutdown.py``).

    A Ctrl-C meanwhile (in the main thread, from the first bytecode on) is kept and never
    raised: the process is exiting as asked, and raised, it left controllers unclosed or
    printed "Exception ignored in: <module 'threading'>" with a ``KeyboardInterrupt``
    traceback. It still ends a wait for a done-callback that blocks (``close()``)."""
    with interrupts.held_quietly:  # (its end queues the kept one for a courier now stopped)
        with _lock:
            left = _open[::-1]
        for ctl in left:
            try:
                ctl.close()
            except Exception as e:  # noqa: BLE001 - the others are closed all the same
                warnings.warn(f"closing {ctl!r} at exit failed: {type(e).__name__}: {e}",
                              RuntimeWarning, stacklevel=1)


def unregister(ctl: Any) -> None:
    """``ctl`` was closed: no longer open, nor the process-wide one."""
    global _default
    with _lock:
        if ctl in _open:
            _open.remove(ctl)
        if _default is ctl:
            _default = None


def set_default(ctl: Any) -> None:
    global _default
    with _lock:
        _default = ctl


def running_default() -> Any:
    """The process-wide controller if one is open; never starts one."""
    with _lock:
        return _default if _default is not None and not _default.closed else None


@contextlib.contextmanager
def making_default() -> Iterator[None]:
    """Around finding or making the process-wide controller: one thread at a time, and a
    controller made inside is known to have been made by ``pw.controller()``."""
    with _making_lock:
        before = getattr(_making, "default", False)
        _making.default = True
        try:
            yield
        finally:
            _making.default = before

"""Work that must run when the interpreter exits, before it stops its thread pools."""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable

_hooked: set[Callable[[], None]] = set()  # among threading's exit hooks already


def run_before_pools_stop(fn: Callable[[], None]) -> None:
    """Run ``fn`` at exit before the interpreter stops its thread pools: threading's exit
    hooks run before ``atexit``'s, and one of them shuts ``concurrent.futures``' pools (the
    transfer threads: a program still running would wait for a copy nobody takes, and its
    futures' callbacks never run). That is also before the exit hooks of what a backend
    started (Ray's shutdown). ``atexit`` too, registered again at every call to run before
    the hooks registered since, where the first is missing."""
    register = getattr(threading, "_register_atexit", None)
    if fn not in _hooked and register is not None:
        with contextlib.suppress(RuntimeError):  # (the interpreter is stopping already)
            register(fn)
        _hooked.add(fn)
    atexit.unregister(fn)
    atexit.register(fn)

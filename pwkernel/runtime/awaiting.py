"""``await fut``: an asyncio future of the event loop that awaits, woken by the runtime.

The runtime wakes it itself, through one of the future's hooks, never through a user's
done-callback (which may itself wait for the awaiting coroutine: a deadlock; see
``done_callbacks``). An awaiter that gives up (its task cancelled, ``asyncio.wait_for`` timed
out, a ``gather`` cancelled) takes its hook back at once: a loop that polls a long run with
``wait_for(fut, 0.5)`` would otherwise leave one hook, holding its loop and waiter, per poll
until the run ended (about 440 bytes each, thousands an hour).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["waiter"]

_PENDING = "pending"  # (FutureState.PENDING is a StrEnum: equal to its value)


def waiter(fut: Any) -> asyncio.Future:
    """An asyncio future of the running loop that takes ``fut``'s value or error once it
    resolves (what ``Future.__await__`` awaits)."""
    loop = asyncio.get_running_loop()
    out = loop.create_future()

    def wake(fut: Any) -> None:
        def settle() -> None:
            if out.done():  # (the awaiter gave up: cancelled, timed out)
                return
            try:
                out.set_result(fut.result(0))
            except BaseException as e:  # noqa: BLE001 - hand the error to the awaiter
                out.set_exception(e)
        if not out.done() and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
                loop.call_soon_threadsafe(settle)

    def gave_up(w: asyncio.Future) -> None:
        if w.cancelled():
            fut.unhook(wake)

    producer = fut.producer
    if producer is not None and fut.state == _PENDING:
        producer.expedite(0)  # a simulated clock moves for it (a real one: not blocking)
    fut.hook(wake)
    out.add_done_callback(gave_up)
    return out

"""Futures awaited from asyncio while the process's other threads use them: ``await fut`` is
woken by the runtime itself, so nothing a done-callback does can hold an awaiting coroutine."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import numpy as np

import pwkernel as pw
from pwkernel.runtime import done_callbacks
from tests.helpers.programs import gate


def gated(ctl, island: int):
    """A function on a one-device slice of ``island`` whose calls wait for ``release``, and the
    two events: its futures are pending until the test says so."""
    entered, release = threading.Event(), threading.Event()
    return pw.function(gate(entered, release), slice=ctl.slice(1, island=island)), entered, release


def test_a_callback_that_waits_for_a_coroutine_awaiting_the_next_step_does_not_deadlock(ctl):
    """A done-callback that hands its future to the event loop and waits there for the
    coroutine (``run_coroutine_threadsafe(...).result()``), a coroutine that awaits the next
    step: before, ``await`` was woken by a done-callback too, queued behind the one waiting
    for it, so both waited for each other (the callback gave up after its timeout)."""
    first, _, release = gated(ctl, 1)
    second, _, release_second = gated(ctl, 0)

    async def next_step(fut):
        step = second(fut * 2)
        asyncio.get_running_loop().call_soon(release_second.set)  # (once this awaits it)
        return await step

    async def main():
        loop = asyncio.get_running_loop()
        handed = loop.create_future()

        def on_done(fut):
            try:
                value = asyncio.run_coroutine_threadsafe(next_step(fut), loop).result(30)
            except BaseException as e:  # noqa: BLE001 - handed to the test, which shows it
                value = e
            loop.call_soon_threadsafe(handed.set_result, value)

        fut = first(np.ones(2, np.float32))
        fut.add_done_callback(on_done)  # (pending: the callback runs on the callbacks' thread)
        release.set()
        return await asyncio.wait_for(handed, 60)

    got = asyncio.run(main())
    assert not isinstance(got, BaseException), f"the callback's wait failed: {got!r}"
    assert np.asarray(got).tolist() == [2.0, 2.0]


def test_await_resolves_while_another_futures_callback_blocks(ctl):
    """A callback that blocks holds back the callbacks after it, not an ``await``: the callback
    here waits until the coroutine has its value, which it awaits only once the callback runs."""
    first, _, release_first = gated(ctl, 0)
    second, entered, release = gated(ctl, 1)
    awaited, blocking, waited = threading.Event(), threading.Event(), []

    def blocks(_):
        blocking.set()
        waited.append(awaited.wait(30))  # (False: the await was never woken meanwhile)

    first(np.ones(2, np.float32)).add_done_callback(blocks)
    release_first.set()
    pending = second(np.full(2, 3.0, np.float32))
    assert blocking.wait(60) and entered.wait(60) and not pending.done()

    async def awaits():
        value = await pending
        awaited.set()
        return value

    async def main():
        task = asyncio.ensure_future(awaits())
        await asyncio.sleep(0)  # (the task awaits the future now: the gate opens after)
        release.set()
        return await task

    assert np.asarray(asyncio.run(main())).tolist() == [3.0, 3.0]
    assert done_callbacks.runner.wait_idle(60) and waited == [True]


def _hooks(fut) -> int:
    hooks = fut._hooks
    return 0 if hooks is None else len(hooks) if type(hooks) is list else 1


def test_an_await_that_gives_up_leaves_nothing_on_the_future(ctl):
    """``asyncio.wait_for(fut, t)`` polled while a long run goes on, and a cancelled
    ``gather``: each abandoned await takes back its hook. Before, each left one (its loop and
    waiter with it) on the future until the run ended: memory grew with every poll."""
    fn, entered, release = gated(ctl, 1)
    fut = fn(np.full(2, 5.0, np.float32))
    assert entered.wait(60)
    before = _hooks(fut)

    async def main():
        for _ in range(200):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, 0)
        both = asyncio.gather(fut, fut)
        await asyncio.sleep(0)  # (the gather's tasks await the future now)
        both.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await both
        left = _hooks(fut)
        release.set()  # the run goes on: the future is awaited to its value
        return left, await asyncio.wait_for(fut, 60)

    left, value = asyncio.run(main())
    assert left == before, f"{left - before} hooks left by 202 awaits that gave up"
    assert np.asarray(value).tolist() == [5.0, 5.0]

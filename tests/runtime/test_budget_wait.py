"""A computation that waits for memory only the user's futures hold says so, once per wait
(``pw.MemoryWaitWarning``), and ``ctl.status()`` lists it; it still waits, and goes on once
the futures are dropped. Waits are bounded; nothing sleeps."""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings

import numpy as np

import pwkernel as pw
from pwkernel.runtime import budget
from pwkernel.runtime.objects import BufferRecord


@contextlib.contextmanager
def memory_waits():
    """Every ``MemoryWaitWarning`` shown meanwhile, from any thread, and an event set by each
    (the runtime says it from whichever thread found the wait)."""
    seen: list[warnings.WarningMessage] = []
    told = threading.Event()

    def show(message, category, filename, lineno, file=None, line=None):
        seen.append(warnings.WarningMessage(message, category, filename, lineno))
        if category is pw.MemoryWaitWarning:
            told.set()

    with warnings.catch_warnings():
        warnings.simplefilter("always", pw.MemoryWaitWarning)
        warnings.showwarning = show
        yield seen, told


def _told(seen) -> list[str]:
    return [str(w.message) for w in seen if w.category is pw.MemoryWaitWarning]


def test_a_wait_for_memory_only_your_futures_hold_says_so_once_and_goes_on_when_dropped():
    # Each call uploads its argument (32 bytes, counted until the call is done) and makes a
    # 32-byte output: a call needs 64 bytes while it runs.
    with pw.Controller(islands=(2, 2), memory_budget=96) as ctl, memory_waits() as (seen, told):
        s = ctl.slice(1, island=0)
        make = pw.function(lambda x: x + 1, slice=s, name="make")
        first = make(np.zeros(8, np.float32))   # 32 bytes held
        second = make(np.zeros(8, np.float32))  # 64 bytes held
        first.result(timeout=60), second.result(timeout=60)
        assert not _told(seen)  # nothing waited yet
        third = make(np.zeros(8, np.float32))   # its upload fits (96), its output does not
        assert told.wait(60)
        [text] = _told(seen)
        assert "'make'" in text and "waits for memory" in text
        assert "needs 32 B more" in text and "memory budget of 96 B" in text
        assert text.count(": future ") == 2  # the two outputs held, 32 B each
        assert "32 B: future " in text and "of program 'make'" in text
        assert "del fut" in text and "fut.result()" in text and "memory_budget" in text
        [waiting] = ctl.status()["islands"][0]["waiting_for_memory"]
        assert (waiting["program"], waiting["bytes"]) == ("make", 32)
        ctl.policy = ctl.policy  # the runtime looks again (at once, in this thread) ...
        assert len(_told(seen)) == 1  # ... and says nothing more: the same wait
        assert not third.done()
        del first
        gc.collect()
        assert third.result(timeout=60).tolist() == [1.0] * 8
        assert ctl.wait(60)
        assert ctl.status()["islands"][0]["waiting_for_memory"] == []
        # a new wait is told of again
        told.clear()
        fourth = make(np.zeros(8, np.float32))
        assert told.wait(60)
        assert len(_told(seen)) == 2
        del second
        gc.collect()
        assert fourth.result(timeout=60).tolist() == [1.0] * 8
        assert len(_told(seen)) == 2


def test_a_program_that_cannot_fit_fails_without_a_wait_warning():
    with pw.Controller(islands=(2, 2), memory_budget=96) as ctl, memory_waits() as (seen, _):
        make = pw.function(lambda x: x + 1, slice=ctl.slice(1, island=0))
        huge = make(np.zeros(32, np.float32))  # 128 bytes > budget: refused, never waits
        try:
            huge.result(timeout=60)
        except pw.MemoryBudgetError:
            pass
        assert not _told(seen)


def test_wait_message_names_the_largest_of_your_buffers_and_how_many_more():
    w = budget.Waiting("f", 0, frozenset({0}), 100, 9, "p", "c", 42)
    live = [budget.LiveBuffer(BufferRecord({0: 10 * (i + 1), 1: 5}, "q", i, "c", 0, True),
                              False, (), f"y{i}") for i in range(7)]
    live.append(budget.LiveBuffer(BufferRecord({0: 999}, "r", 8, "c", 0, True), True))
    text = budget.wait_message(w, 1000, {0: 1000}, live, others=1)
    assert "'f' (program 'p', run 9, client 'c') on island 0" in text
    assert "needs 100 B more" in text and "memory budget of 1000 B" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("  ")]
    assert lines[0] == "  70 B: future 'y6' of program 'q' (run 6)"  # the largest first
    assert lines[-1] == "  and 2 more (30 B)"  # 10 B + 20 B; the pinned 999 B is not yours
    assert "1 other computation on island 0 waits likewise" in text

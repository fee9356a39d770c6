"""The memory budget on real JAX devices: every buffer the runtime places counts, waiting for
memory never hangs a program that cannot fit (it fails with a MemoryBudgetError saying who holds
what), programs that fit still finish, and a cancel is one step of the scheduler. Plus the pure
analysis of ``runtime.budget``. Waits are bounded; nothing sleeps."""

from __future__ import annotations

import gc
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pwkernel as pw
from pwkernel.runtime import budget
from pwkernel.runtime.objects import BufferRecord, Future
from tests.helpers.budget import (
    MiB,
    assert_all_memory_returned,
    check_fan_in_fails_and_says_who_holds_the_memory,
    reserved,
)
from tests.helpers.programs import gate


def test_a_fan_in_that_cannot_fit_fails_and_says_who_holds_the_memory():
    with pw.Controller(islands=(4, 4), memory_budget=4 * MiB) as ctl:
        check_fan_in_fails_and_says_who_holds_the_memory(ctl)
        # the controller carries on
        small = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0))
        assert small(np.ones(4, np.float32)).result(timeout=60).tolist() == [2.0] * 4


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_program_too_big_on_two_islands_fails_its_futures(dispatch):
    """The first island refuses its node and the failure reaches the second island's node
    before that island knows the program: the call still returns futures, each failing with
    the MemoryBudgetError, and the second island's scheduler keeps nothing of the run."""
    with pw.Controller(islands=(4, 4), memory_budget=MiB, dispatch=dispatch) as ctl:
        s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
        big = pw.function(lambda: jnp.ones(1 << 19), slice=s0)  # 2 MiB
        grow = pw.function(lambda x: jnp.concatenate([x, x]), slice=s1)

        @pw.program
        def both():
            a = big()
            return a, grow(a)

        for fut in both():
            assert isinstance(fut.exception(timeout=60), pw.MemoryBudgetError)
        assert ctl.wait(60) and not ctl.runs()
        assert all(not i["queued"] and not i["running"] for i in ctl.status()["islands"])
        small = pw.function(lambda x: x * 2, slice=s1)
        assert small(np.ones(4, np.float32)).result(timeout=60).tolist() == [2.0] * 4


def test_a_program_that_fits_only_after_its_values_are_consumed_finishes():
    # Four 1 MiB producers, each consumed before the budget runs out: back-pressure, no error.
    with pw.Controller(islands=(4, 4), memory_budget=4 * MiB) as ctl:
        s0 = ctl.slice(2, island=0)
        make = pw.function(lambda x: jnp.broadcast_to(x[:, None], (512, 1024)) * 2.0,
                           slice=s0, in_specs=pw.BATCH, name="make")
        total = pw.function(lambda a: a.sum(0), slice=s0, name="total")

        @pw.program
        def many(x):
            return [total(make(x)) for _ in range(12)]

        outs = many(np.ones(512, np.float32))
        for out in outs:
            assert out.result(timeout=60).tolist() == [1024.0] * 1024
        del outs, out
        assert_all_memory_returned(ctl)


def test_work_waiting_on_another_island_for_the_users_frees_is_not_stuck():
    """Each run of ``inc(mv(x))`` keeps its ``mv`` output on island 1 while its ``inc`` waits
    for room on island 0, which only the user's values take. Island 1 then fills with those
    outputs, and its next ``mv`` waits for them: it is back-pressure across islands (the
    outputs go once the user frees island 0), not a stuck program. It was stopped with a
    MemoryBudgetError that blamed island 1."""
    with pw.Controller(islands=(4, 4), memory_budget=1024) as ctl:
        s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
        inc = pw.function(lambda x: x + 1, slice=s0)
        mv = pw.function(lambda x: x * 2, slice=s1)
        p = pw.program(lambda v: inc(mv(v)))
        x = np.ones(64, np.float32)  # 256 B per device
        held = [inc(x) for _ in range(3)]  # the user's: 768 B of 1 KiB on island 0
        for h in held:
            h.wait()
        runs = [p(x) for _ in range(5)]
        assert not runs[-1].wait(0.5)  # (a negative check: a wrong stop comes within it)
        del held, h
        gc.collect()
        for i in range(5):
            assert runs[i].result(timeout=60).tolist() == [3.0] * 64
            runs[i] = None  # consumed: room for the next
        assert_all_memory_returned(ctl)


def test_an_upload_is_given_back_before_the_result_it_fed_resolves():
    """A result in hand, the upload only its call read is no longer counted: it was given
    back after the result resolved, so ``y.result()`` then the islands' memory status read
    both (twice the upload here) in the moment between, which a loaded machine made long.
    Read in the thread that resolves the result, as it resolves it (a profile hook on every
    thread the controller starts), so the check does not depend on who runs first."""
    seen: list[dict[int, int]] = []
    armed = threading.Event()
    ctl = None

    def at_resolve(frame, event, _arg):
        if event == "call" and frame.f_code is Future.set_results.__code__ and armed.is_set():
            seen.append(reserved(ctl))

    threading.setprofile(at_resolve)  # (the controller's threads start with it)
    sys.setprofile(at_resolve)  # (a small computation's end is seen by the caller)
    try:
        with pw.Controller(islands=(4, 4), memory_budget=4 * MiB) as ctl:
            s0 = ctl.slice(2, island=0)
            keep = pw.function(lambda x: x * 1, slice=s0, in_specs=pw.BATCH, name="keep")
            arg = np.ones(3 * MiB // 4, np.float32)  # 3 MiB: 1.5 MiB per device
            d0 = s0.device_ids[0]
            keep(arg).result(timeout=60)  # compiled
            assert ctl.wait(60)
            armed.set()
            held = keep(arg)
            held.result(timeout=60)
            armed.clear()
            assert seen and all(r[d0] == 3 * MiB // 2 for r in seen), (seen, 3 * MiB // 2)
            del held
            assert_all_memory_returned(ctl)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def test_uploads_count_against_the_budget_like_computation_outputs():
    with pw.Controller(islands=(4, 4), memory_budget=4 * MiB) as ctl:
        s0 = ctl.slice(2, island=0)
        first = pw.function(lambda x: x[:2], slice=s0, in_specs=pw.BATCH)
        # 16 MiB on two devices is 8 MiB each: refused at once, nothing placed
        with pytest.raises(pw.MemoryBudgetError, match=r"copy host.*needs 8388608 bytes per "
                                                       r"device but the memory budget is 4194304"):
            first(np.ones(4 * MiB, np.float32)).result(timeout=60)
        assert not any(ctl.memory().values())
        # a 1.5 MiB-per-device upload is counted where computation outputs are
        keep = pw.function(lambda x: x * 1, slice=s0, in_specs=pw.BATCH, name="keep")
        arg = np.ones(3 * MiB // 4, np.float32)                  # 3 MiB: 1.5 MiB per device
        d0 = s0.device_ids[0]
        held = keep(arg)                                         # upload + output: 3 MiB
        held.result(timeout=60)
        assert reserved(ctl)[d0] == ctl.memory()[ctl.devices[d0]] == 3 * MiB // 2
        # the next call's upload fits (3 MiB), its output (4.5 MiB) waits for `held` to go
        second = keep(arg)
        assert not second.wait(0.2)
        assert reserved(ctl)[d0] == ctl.memory()[ctl.devices[d0]] == 3 * MiB
        del held
        gc.collect()
        assert second.result(timeout=60).shape == arg.shape
        del second
        assert_all_memory_returned(ctl)


def test_cancelling_a_program_held_back_by_the_budget_launches_none_of_it():
    with pw.Controller(islands=(2, 2), memory_budget=128) as ctl:
        s = ctl.slice(1, island=0)
        x = pw.function(lambda v: v, slice=s)(np.zeros(8, np.float32))   # 32 B, on device
        hold = pw.function(lambda v: jnp.concatenate([v, v]), slice=s)(x)  # 64 B more
        x.result(timeout=60), hold.result(timeout=60)
        big = pw.function(lambda v: jnp.concatenate([v, v]), slice=s, name="big")
        small = pw.function(lambda v: v[:4], slice=s, name="small")
        outs = pw.program(lambda v: (big(v), small(v), small(v)))(x)
        # big needs 64 B (96 + 64 > 128) and waits; the smalls fit but queue behind it
        assert not outs[0].wait(0.2)
        assert outs[0].run.cancel() == 3
        for out in outs:
            with pytest.raises(pw.CancelledError):
                out.result(timeout=60)
        run = outs[0].run.id
        assert not [e for e in ctl.trace.events() if e.program_id == run], "a cancelled node ran"
        assert reserved(ctl)[s.device_ids[0]] == 96
        del x, hold, outs
        assert_all_memory_returned(ctl)


def test_work_that_fits_behind_a_waiting_computation_runs_before_anything_is_stopped():
    """``wide`` waits for room that ``big``'s output takes; ``head``, queued behind it on the
    same device, fits and is the last reader of that output. Once ``big`` ends nothing runs:
    ``head`` goes past ``wide`` and its end makes the room, so both finish. (``head`` waited
    behind ``wide``'s reservation and ``wide`` was stopped with a MemoryBudgetError.)"""
    entered, release = threading.Event(), threading.Event()
    with pw.Controller(islands=(1,), memory_budget=128) as ctl:
        s = ctl.slice(1)
        y = pw.function(lambda v: v, slice=s)(np.ones(1, np.float32))   # 4 B
        y.result(timeout=60)
        held = gate(entered, release)
        big = pw.function(lambda v: held(jnp.broadcast_to(v, (24,))), slice=s, name="big")
        wide = pw.function(lambda v: jnp.broadcast_to(v, (12,)) * 3, slice=s, name="wide")
        head = pw.function(lambda v: v[:2] + 1, slice=s, name="head")
        a = big(y)                   # 96 B
        assert entered.wait(60)
        w = wide(y)                  # 48 B more: 4 + 96 + 48 > 128, it waits
        h = head(a)                  # 8 B: fits, queued behind wide
        del a
        release.set()
        assert h.result(timeout=60).tolist() == [2.0, 2.0]
        assert w.result(timeout=60).tolist() == [3.0] * 12
        del h, w, y
        assert_all_memory_returned(ctl)


# --- property: random programs under random budgets ----------------------------------------
ROWS = 64  # a made value is (ROWS, width) float32 on a 2-device slice: ROWS * width * 2 B each

# A program is a chain of fan-ins: each stage makes one wide value per width from the stage's
# input, then one computation sums them all into the next stage's input (ROWS,). A stage
# needs all its wide values alive at once; the result is its input times its fan-in.
stages = st.lists(st.lists(st.sampled_from([8, 16, 32]), min_size=1, max_size=4),
                  min_size=1, max_size=3)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(progs=st.lists(stages, min_size=1, max_size=3),
       budget_bytes=st.integers(ROWS * 8 * 2, ROWS * 32 * 2 * 5),
       mode=st.sampled_from(["parallel", "sequential"]))
def test_random_programs_under_random_budgets_finish_or_fail_never_hang(progs, budget_bytes,
                                                                        mode):
    with pw.Controller(islands=(4, 4), memory_budget=budget_bytes, dispatch=mode) as ctl:
        s0 = ctl.slice(2, island=0)
        make = {w: pw.function(lambda v, w=w: jnp.broadcast_to(v[:, None], (ROWS, w)) / w,
                               slice=s0, name=f"make{w}") for w in (8, 16, 32)}
        gather = pw.function(lambda *vs: sum(v.sum(1) for v in vs), slice=s0, name="gather")

        def build(plan):
            def body(v):
                for widths in plan:
                    v = gather(*[make[w](v) for w in widths])
                return v
            return pw.program(body)

        # Results are taken by callbacks and the futures dropped at once: a user who holds
        # finished outputs while waiting for more is waited for (back-pressure), by design.
        got: dict[int, object] = {}
        done = [threading.Event() for _ in progs]

        def taker(k):
            def take(fut):
                got[k] = fut.exception() or np.asarray(fut.result())
                done[k].set()
            return take

        for k, plan in enumerate(progs):
            build(plan)(np.arange(ROWS, dtype=np.float32) + k).add_done_callback(taker(k))
        for k, plan in enumerate(progs):
            assert done[k].wait(60), f"a program hung under a budget of {budget_bytes} B"
            if isinstance(got[k], BaseException):
                assert isinstance(got[k], pw.MemoryBudgetError), got[k]
            else:
                want = (np.arange(ROWS, dtype=np.float32) + k) * np.prod([len(w) for w in plan])
                np.testing.assert_array_equal(got[k], want)
        assert_all_memory_returned(ctl)


# --- the analysis itself, without devices ------------------------------------------------
def held(nbytes, run, pinned, program="p"):
    return budget.Held(BufferRecord({0: nbytes, 1: nbytes}, program, run, "c", 0, True), pinned)


def waiting(nbytes, run):
    return budget.Waiting("f", 0, frozenset({0, 1}), nbytes, run, "p", "c")


def test_waiting_for_what_only_the_user_holds_is_back_pressure_not_stuck():
    in_use = {0: 96, 1: 96}
    mine = [held(64, 0, pinned=False), held(32, 1, pinned=True)]
    assert budget.stuck([waiting(64, 1)], 128, in_use, mine, {1}) is None  # 96-64+64 fits
    assert budget.stuck([waiting(100, 1)], 128, in_use, mine, {1}) == (waiting(100, 1), 1)


def test_memory_pinned_by_runs_waiting_for_the_user_elsewhere_counts_as_the_users():
    in_use = {0: 128, 1: 128}
    pinned = [held(64, 3, pinned=True), held(64, 4, pinned=True)]
    head = waiting(64, 4)
    assert budget.stuck([head], 128, in_use, pinned, {3, 4}) is not None
    assert budget.stuck([head], 128, in_use, pinned, {3, 4}, freed_by_user={3}) is None


def test_the_youngest_program_holding_the_memory_is_stopped():
    in_use = {0: 96, 1: 96}
    two = [held(48, 3, pinned=True), held(48, 5, pinned=True)]
    head = waiting(48, 3)
    assert budget.stuck([head], 128, in_use, two, {3, 5}) == (head, 5)
    # a holder with nothing queued here cannot be helped by stopping it: stop the head's
    assert budget.stuck([head], 128, in_use, two, {3}) == (head, 3)
    text = budget.message(head, "program 'p' (run 5)", 128, in_use, two)
    assert "128 B per device" in text and "48 B in 1 buffer of program 'p' (run 3" in text


def test_a_value_of_an_ended_program_is_said_to_be_held_for_its_readers():
    """A value the user passes from an ended program to a later one is pinned by the later
    program's queued reads: the error named the ended program as holding it "for its
    computations that have not run" (it had none left)."""
    with pw.Controller(islands=(4, 4), memory_budget=4 * MiB) as ctl:
        s0 = ctl.slice(2, island=0)
        make = pw.function(lambda x: jnp.broadcast_to(x[:, None], (512, 1024)) * 2.0,
                           slice=s0, in_specs=pw.BATCH, name="make")
        add5 = pw.function(lambda a, b, c, d, e: a + b + c + d + e, slice=s0, name="add5")
        x = np.ones(512, np.float32)
        first = pw.program(lambda x: make(x), name="first")(x)
        assert first.exception(timeout=60) is None

        @pw.program
        def second(v, x):
            return add5(v, *[make(x) for _ in range(4)])

        out = second(first, x)
        with pytest.raises(pw.MemoryBudgetError) as info:
            out.result(timeout=60)
        text = str(info.value)
        assert "program 'second'" in text.split(" was stopped")[0]
        line = next(ln for ln in text.splitlines() if "program 'first'" in ln)
        assert "1.0 MiB in 1 buffer" in line
        assert "held because computations of program 'second'" in line, text
        assert "held for its computations" not in line, text
        del out, first
        assert_all_memory_returned(ctl)


def test_an_ended_programs_value_is_pinned_by_the_run_that_reads_it():
    in_use = {0: 96, 1: 96}
    read = budget.Held(BufferRecord({0: 48, 1: 48}, "p", 2, "c", 0, True), True, ((6, "q"),))
    two = [held(48, 3, pinned=True), read]
    head = waiting(48, 3)
    assert budget.stuck([head], 128, in_use, two, {3, 6}) == (head, 6)  # the reader, not 3
    text = budget.message(head, "program 'q' (run 6)", 128, in_use, two)
    assert "of program 'p' (run 2, client 'c'), its program has ended; held because " \
           "computations of program 'q' (run 6) that have not run read them" in text


# --- many clients under a tight budget -----------------------------------------------------
def test_four_clients_on_overlapping_slices_under_a_tight_budget_all_end():
    # The livelock: with several clients, a memory check re-queued itself behind
    # another queued check (and that one behind it), so the thread that ran them spun at
    # 100 % CPU and its own result(timeout=) never returned. Each program must end: done
    # with the right value, or failed with a MemoryBudgetError.
    ctl = pw.Controller(islands=(4, 4), memory_budget=70)   # bytes per device: two 32 B values
    hung: list[str] = []
    try:
        s_a, s_b, s_c = ctl.slice(2, island=0), ctl.slice(4, island=0), ctl.slice(1, island=0)
        double = pw.function(lambda x: x * 2, slice=s_a, name="double")
        inc = pw.function(lambda x: x + 1, slice=s_b, name="inc")
        add3 = pw.function(lambda a, b, c: a + b + c, slice=s_c, name="add3")

        @pw.program(name="chain")
        def chain(v):
            return inc(double(v))

        @pw.program(name="fan")
        def fan(v):                 # three 32 B values alive at once on s_c: over 70 B
            return add3(double(v), inc(v), inc(double(v)))

        outcomes: dict[tuple[int, str], object] = {}

        def client(c: int) -> None:
            with ctl.client(f"c{c}"):
                x = np.arange(8, dtype=np.float32) + c
                outs = [("chain", chain(x)), ("fan", fan(x))]
            while outs:
                # each result is taken and its future dropped at once, here, in the client's
                # thread (a finished value the user keeps would be waited for, by design)
                name, out = outs.pop(0)
                try:
                    outcomes[c, name] = np.asarray(out.result(timeout=60))
                except BaseException as e:  # noqa: BLE001 - checked below
                    outcomes[c, name] = e
                del out

        threads = [threading.Thread(target=client, args=(c,), name=f"client{c}", daemon=True)
                   for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"{hung} never ended under memory_budget=70"
        assert len(outcomes) == 8, outcomes
        for (c, name), got in outcomes.items():
            if isinstance(got, BaseException):
                assert isinstance(got, pw.MemoryBudgetError), (c, name, got)
            else:
                x = np.arange(8, dtype=np.float32) + c
                want = x * 2 + 1 if name == "chain" else x * 2 + (x + 1) + (x * 2 + 1)
                np.testing.assert_array_equal(got, want)
        # three 32 B values at once on add3's one device can never fit 70 B
        assert all(isinstance(outcomes[c, "fan"], pw.MemoryBudgetError) for c in range(4))
        assert_all_memory_returned(ctl)
    finally:
        if not hung:  # a spinning thread would keep close() waiting: leave it to the process
            ctl.close()


def test_a_check_queued_behind_itself_runs_once_the_queue_empties():
    # The trampoline under the livelock, without threads: two of the same check queued, each
    # re-queues itself behind the queue's other work (``later``). The copy already queued is
    # the one that runs; the queue empties.
    from pwkernel.runtime.deferred import later, soon

    calls: list[str] = []

    def check() -> None:
        calls.append("looked")
        assert len(calls) < 100, "the check kept re-queueing itself behind its own copy"
        if later(check):
            return
        calls.append("ran")

    def two_checks() -> None:
        soon(check)
        soon(check)

    soon(two_checks)
    assert calls == ["looked", "looked", "ran"]

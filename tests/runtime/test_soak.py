"""Soak: four clients, 2,000 programs across two islands over overlapping slices, one in twenty
with a planted run-time failure. Every good value is right, every failure reaches exactly the
outputs that depend on it, and afterwards memory (the store and the budget's accounting) and
threads are back where they started. Then 400 more, with and without a tight memory budget,
while the policy switches and programs are cancelled. Bounded: each client keeps a window of
programs in flight and waits on futures or conditions with timeouts."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from tests.helpers import ROOT

CLIENTS, PROGRAMS, WINDOW, BAD_EVERY = 4, 500, 12, 20  # 4 x 500 = 2,000 programs
N = 8  # elements per value


def boom(x):
    def raise_it(v):
        raise ValueError(f"planted failure on {float(v[0]):g}")

    return jax.pure_callback(raise_it, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def pw_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("pw-")}


def test_soak_four_clients_two_thousand_programs_two_islands():
    threads_before = pw_threads()
    ctl = pw.Controller(islands=(4, 4), memory_budget=64 << 20)  # never reached: accounted
    t0 = time.perf_counter()
    try:
        # overlapping slices on island 0 ([0, 1], [0, 1, 2, 3], then one sharing device 0),
        # and two on island 1
        s_a, s_b = ctl.slice(2, island=0), ctl.slice(4, island=0)
        s_c, s_d = ctl.slice(2, island=1), ctl.slice(2, island=1)
        double = pw.function(lambda x: x * 2, slice=s_a, name="double")
        inc = pw.function(lambda x: x + 1, slice=s_c, name="inc")
        add = pw.function(lambda x, y: x + y, slice=s_b, name="add")
        neg = pw.function(lambda x: -x, slice=s_d, name="neg")
        s_e = ctl.slice(1, island=1)
        fail = pw.function(boom, slice=s_e, name="boom")
        triple = pw.function(lambda x: x * 3, slice=s_e, name="triple")  # launched behind it

        # `left` never depends on the planted failure, `right` does; `bad` also returns the
        # failing computation's own output
        @pw.program(name="good")
        def good(v):
            return double(v), add(double(triple(inc(v))), neg(v)), None

        @pw.program(name="bad")
        def bad(v):
            failed = fail(inc(v))
            return double(v), add(double(triple(failed)), neg(v)), failed

        errors: list[str] = []
        counts = {"good": 0, "bad": 0}
        lock = threading.Lock()

        def check(k: int, left, right, failed, planted: bool) -> None:
            x = np.arange(N, dtype=np.float32) + k
            np.testing.assert_array_equal(np.asarray(left.result(timeout=60)), x * 2)
            if planted:
                error = failed.exception(timeout=60)
                # XLA hands the callback's error back as its own, with the message
                assert f"planted failure on {k + 1:g}" in str(error), error
                # a dependent fails with that very error, not one of its own
                assert right.exception(timeout=60) is error
                assert right.state is failed.state is pw.FutureState.FAILED
            else:
                np.testing.assert_array_equal(np.asarray(right.result(timeout=60)),
                                              (x + 1) * 6 - x)

        def client(c: int) -> None:
            window: list = []
            try:
                with ctl.client(f"c{c}", weight=c + 1):
                    for i in range(PROGRAMS):
                        k = c * PROGRAMS + i
                        planted = k % BAD_EVERY == BAD_EVERY - 1
                        prog = bad if planted else good
                        window.append((k, *prog(np.arange(N, dtype=np.float32) + k), planted))
                        if len(window) >= WINDOW:
                            check(*window.pop(0))
                    while window:
                        check(*window.pop(0))
                with lock:
                    counts["good"] += PROGRAMS - PROGRAMS // BAD_EVERY
                    counts["bad"] += PROGRAMS // BAD_EVERY
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                with lock:
                    errors.append(f"client {c}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "a client hung"
        assert errors == [], errors
        assert counts == {"good": 1900, "bad": 100}
        assert ctl.wait(60) and ctl.runs() == []
        gc.collect()
        assert not any(ctl.memory().values()), ctl.store.records()[:5]
        assert not any(n for isl in ctl.status()["islands"]
                       for n in isl["memory_reserved"].values())
        # in the trace, errors only in the planted programs: the failure and what it fed
        failed = [e for e in ctl.trace.events() if e.status == "error"]
        assert {e.program for e in failed} == {"bad"}, {e.program for e in failed}
        assert sum(e.name == "boom" for e in failed) == 100
    finally:
        ctl.close()
    assert pw_threads() == threads_before
    print(f"soak: 2,000 programs in {time.perf_counter() - t0:.1f} s")


# --- a shorter soak with everything changing at once -----------------------------------------
SHORT_PROGRAMS, SHORT_WINDOW, CANCEL_EVERY, POLICY_EVERY = 50, 6, 7, 10  # 4 x 50 per budget
POLICIES = ("fifo", "priority", "share")


def _expected(name: str, x: np.ndarray) -> list[np.ndarray]:
    if name == "across":
        return [x * 2, (x + 1) * 6 - x]
    return [x * 6 + 3, -(x * 4)]


# 256 B per device is eight 32 B values: programs wait for memory, and some are stopped
@pytest.mark.parametrize("budget", [None, 256], ids=["no budget", "256 B budget"])
def test_soak_clients_switch_policies_and_cancel_on_overlapping_slices(budget, caplog):
    # 2 x 200 = 400 programs: four clients (weights and priorities differ), each keeping up to
    # SHORT_WINDOW programs in flight, one in CANCEL_EVERY cancelled right after submission,
    # the policy switched every POLICY_EVERY programs of client 0. Results are taken by
    # callbacks that drop the futures at once (a value the user keeps would be waited for
    # under a budget, by design). No "Array has been deleted" anywhere, no wait without
    # a bound, and memory and threads back where they started.
    caplog.set_level(logging.WARNING, logger="pwkernel")
    threads_before = set(threading.enumerate())
    ctl = pw.Controller(islands=(4, 4), memory_budget=budget)
    hung: list[str] = []
    try:
        # island 0: two pairs inside all four, and one device inside a pair; island 1: two
        # pairs and one device
        s_a, s_b = ctl.slice(2, island=0), ctl.slice(4, island=0)
        s_o, one = ctl.slice(2, island=0), ctl.slice(1, island=0)
        pair = s_a if one.device_ids[0] in s_a.device_ids else s_o
        s_c, s_d, s_e = ctl.slice(2, island=1), ctl.slice(2, island=1), ctl.slice(1, island=1)
        double = pw.function(lambda x: x * 2, slice=s_a, name="double")
        inc = pw.function(lambda x: x + 1, slice=s_c, name="inc")
        add = pw.function(lambda x, y: x + y, slice=s_b, name="add")
        neg = pw.function(lambda x: -x, slice=s_d, name="neg")
        triple = pw.function(lambda x: x * 3, slice=s_e, name="triple")
        twice = pw.function(lambda x: x * 2, slice=s_o, name="twice")   # overlaps s_a, s_b
        bump = pw.function(lambda x: x + 1, slice=one, in_specs=P(), out_specs=P(), name="bump")
        spread = pw.function(lambda x, y: x * 2 + y, slice=pair, in_specs=(P(), P()),
                             out_specs=P(), name="spread")

        @pw.program(name="across")     # both islands, copies each way
        def across(v):
            return double(v), add(double(triple(inc(v))), neg(v))

        # one island: copies between overlapping slices, and a one-device value (and the
        # user's one-device seed) read replicated on a pair that holds that device, where
        # JAX may hand back the source's own buffer for the copy
        @pw.program(name="overlap")
        def overlap(v, seed):
            d = twice(double(v))
            return add(d, spread(bump(v), seed)), neg(d)

        seeds: list = []

        outcomes: list[tuple[str, int, int, object]] = []
        cancelled_nodes = [0]
        lock = threading.Lock()
        errors: list[str] = []

        def client(c: int) -> None:
            in_flight = [0]
            changed = threading.Condition()

            def taker(name: str, k: int, i: int):
                def take(fut) -> None:
                    error = fut.exception()
                    got = error if error is not None else np.asarray(fut.result())
                    with lock:
                        outcomes.append((name, k, i, got))
                    with changed:
                        in_flight[0] -= 1
                        changed.notify_all()
                return take

            seed = jax.device_put(np.ones(N, np.float32), ctl.devices[one.device_ids[0]])
            with lock:
                seeds.append(seed)
            try:
                with ctl.client(f"c{c}", weight=c + 1, priority=c % 2):
                    for i in range(SHORT_PROGRAMS):
                        k = c * SHORT_PROGRAMS + i
                        if c == 0 and i % POLICY_EVERY == POLICY_EVERY - 1:
                            ctl.policy = POLICIES[(i // POLICY_EVERY) % len(POLICIES)]
                        with changed:
                            assert changed.wait_for(lambda: in_flight[0] < SHORT_WINDOW, 60), \
                                f"client {c}: nothing finished for 60 s"
                            in_flight[0] += 2
                        x = np.arange(N, dtype=np.float32) + k
                        name = "across" if k % 2 else "overlap"
                        outs = across(x) if k % 2 else overlap(x, seed)
                        if k % CANCEL_EVERY == 0:
                            n = outs[0].run.cancel()
                            with lock:
                                cancelled_nodes[0] += n
                        for j, out in enumerate(outs):
                            out.add_done_callback(taker(name, k, j))
                        del outs, out
                with changed:
                    assert changed.wait_for(lambda: in_flight[0] == 0, 60), \
                        f"client {c}: {in_flight[0]} outputs never resolved"
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                with lock:
                    errors.append(f"client {c}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=client, args=(c,), name=f"soak-client{c}",
                                    daemon=True) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"{hung} never ended"
        messages = errors + [f"{type(got).__name__}: {got}" for *_, got in outcomes
                             if isinstance(got, BaseException)]
        messages += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
        deleted = [m for m in messages if "has been deleted" in m]
        assert not deleted, f"{len(deleted)} 'Array has been deleted' errors: {deleted[:3]}"
        assert errors == [], errors
        assert len(outcomes) == 2 * CLIENTS * SHORT_PROGRAMS
        allowed = (pw.CancelledError,) + ((pw.MemoryBudgetError,) if budget else ())
        for name, k, i, got in outcomes:
            if isinstance(got, BaseException):
                assert isinstance(got, allowed), (name, k, i, got)
                if isinstance(got, pw.CancelledError):
                    assert k % CANCEL_EVERY == 0, (name, k, i, got)
            else:
                want = _expected(name, np.arange(N, dtype=np.float32) + k)[i]
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {k} output {i}")
        assert cancelled_nodes[0] > 0, "no cancel dropped anything: the test tests nothing"
        for seed in seeds:  # what the user gave the runtime is still the user's
            np.testing.assert_array_equal(np.asarray(seed), np.ones(N, np.float32))
        seeds.clear()
        assert ctl.wait(60) and ctl.runs() == []
        gc.collect()
        assert not any(ctl.memory().values()), ctl.store.records()[:5]
        assert not ctl.store.records()
        assert not any(n for isl in ctl.status()["islands"]
                       for n in isl["memory_reserved"].values())
    finally:
        if not hung:  # a hung client would keep close() waiting: leave it to the process
            ctl.close()
    left = [t.name for t in threading.enumerate() if t not in threads_before]
    assert left == [], f"threads left after close(): {left}"


def controllers_made_and_closed_in_a_loop() -> None:
    """Fifty controllers, each running a good program, a failing one and a cancelled one, then
    closed: no runtime thread, file descriptor or device array outlives them (checked once
    the loop is done, after a warm-up controller has loaded what JAX keeps for the process).
    Run in a process of its own (``test_controllers_...``): in the suite's, other tests'
    libraries open descriptors of their own meanwhile."""

    def one() -> None:
        ctl = pw.Controller(islands=(4, 4))
        s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
        a = pw.function(lambda x: x * 2, slice=s0)
        b = pw.function(lambda x: x + 1, slice=s1)
        bad = pw.function(boom, slice=s1)

        @pw.program
        def good(v):
            return b(a(v))

        @pw.program
        def failing(v):
            return bad(a(v))

        assert good(np.arange(4.0)).result().tolist() == [1.0, 3.0, 5.0, 7.0]
        with pytest.raises(ValueError, match="planted failure"):
            failing(np.arange(4.0)).result(timeout=60)
        good(np.arange(4.0)).cancel()
        ctl.close()

    one()
    gc.collect()
    threads, fds = pw_threads(), set(os.listdir("/proc/self/fd"))
    arrays = {id(x) for x in jax.live_arrays()}
    for _ in range(50):
        one()
    gc.collect()
    assert pw_threads() == threads
    assert set(os.listdir("/proc/self/fd")) <= fds
    assert [x for x in jax.live_arrays() if id(x) not in arrays] == []


def test_controllers_made_and_closed_in_a_loop_leave_nothing_behind():
    script = ("import jax\njax.config.update('jax_num_cpu_devices', 8)\n"
              "from tests.runtime.test_soak import controllers_made_and_closed_in_a_loop as f\n"
              "f()\nprint('clean')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-3000:]

"""Soak: four clients, 2,000 programs across two islands over overlapping slices, one in twenty
with a planted run-time failure. Every good value is right, every failure reaches exactly the
outputs that depend on it, and afterwards memory (the store and the budget's accounting) and
threads are back where they started. Bounded: each client keeps a window of programs in flight
and waits on futures with timeouts."""

from __future__ import annotations

import gc
import threading
import time

import jax
import numpy as np

import pwkernel as pw

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

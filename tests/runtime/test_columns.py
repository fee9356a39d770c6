"""A run's per-leaf work in columns (``runtime/batch.py``): many futures given to a program,
read and grouped by producer in C-level passes, and fewer read one by one, must give the
same answers. Each test runs both sides of ``MANY`` on a real controller and real arrays."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.runtime.batch import MANY
from tests.helpers.programs import gate

SIZES = [MANY - 1, MANY, 3 * MANY]  # one by one, and in columns


def held(n: int, entered: threading.Event, release: threading.Event):
    """``x -> [x + 0, ..., x + n-1]``, computed only once ``release`` is set."""
    hold = gate(entered, release)

    def fn(x):
        y = hold(x)
        return [y + i for i in range(n)]
    return fn


@pytest.mark.parametrize("n", SIZES)
def test_a_consumer_of_many_leaves_names_their_running_producer_once(ctl, n):
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    make = pw.function(held(n, entered, release), slice=s, name="make")
    total = pw.function(lambda leaves, x: sum(leaves) + x, slice=s, name="total")
    step = pw.function(lambda leaves: [a * 2 for a in leaves], slice=s, donate_argnums=(0,),
                       name="step")
    try:
        outs = make(np.ones(3, np.float32))
        assert entered.wait(30)
        made = outs[0].producer
        result = total(outs[::-1], np.ones(3, np.float32))
        task = result.producer
        assert result.run.after(task) == (made.id,)  # queued behind it, named once
        assert list(task.producers()) == list(task.producers(running=False)) == [made]
        later = make(np.ones(3, np.float32))  # queued behind the first: not ended either
        new = step(later)  # (donated: nothing else reads them)
        assert new[0].producer.donated_makers() == [later[0].producer]
    finally:
        release.set()
    expected = n + sum(range(n)) + 1
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)), np.full(3, expected))
    jax.block_until_ready([f.result(timeout=60) for f in new])
    assert result.run.after(task) == () and list(task.producers()) == []
    assert new[0].producer.donated_makers() == []


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_many_leaves_resolved_or_pending_arrive_with_their_values(ctl, n, dispatch):
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    make = pw.function(held(n, entered, release), slice=s)
    ready = pw.function(lambda x: [x * 10 + i for i in range(n)], slice=s)(np.ones(2))
    jax.block_until_ready([f.result(timeout=60) for f in ready])

    @pw.program
    def total(pending, done, arrays):
        return pw.function(lambda a, b, c: sum(a) + sum(b) + sum(c), slice=s)(pending, done,
                                                                             arrays)

    outs = make(np.ones(2, np.float32))
    assert entered.wait(30)
    arrays = [np.full(2, 100.0, np.float32)] * n
    result = total(outs, ready, arrays, dispatch=dispatch)
    assert not result.done()
    release.set()
    expected = (n + sum(range(n))) + (10 * n + sum(range(n))) + 100 * n
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)), np.full(2, expected))


@pytest.mark.parametrize("n", SIZES)
def test_a_failed_leaf_among_many_resolved_ones_fails_the_consumer(ctl, n):
    s = ctl.slice(1, island=0)
    ok = pw.function(lambda x: [x + i for i in range(n - 1)], slice=s)(np.ones(2))

    def boom(x):
        raise RuntimeError("this leaf failed")

    bad = pw.function(lambda x: jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                  x), slice=s)(np.ones(2, np.float32))
    with pytest.raises(Exception, match="this leaf failed"):
        bad.result(timeout=60)
    jax.block_until_ready([f.result(timeout=60) for f in ok])
    total = pw.function(lambda leaves: sum(leaves), slice=s)
    result = total([*ok[: n // 2], bad, *ok[n // 2:]])
    assert result.exception(timeout=60) is bad.exception()
    again = total(ok + [ok[0]])  # the failure stays with its run: the next one is fine
    np.testing.assert_allclose(np.asarray(again.result(timeout=60)),
                               np.full(2, (n - 1) + sum(range(n - 1)) + 1))


@pytest.mark.parametrize("n", SIZES)
def test_many_outputs_resolve_together_with_their_own_values_and_bytes(ctl, n):
    s = ctl.slice(2, island=0)
    f = pw.function(lambda x: [x * i for i in range(n)], slice=s, name="many")
    before = sum(ctl.memory().values())

    def check() -> None:
        outs = f(np.ones(4, np.float32))
        seen = []
        outs[-1].add_done_callback(lambda fut: seen.append([o.done() for o in outs]))
        values = [o.result(timeout=60) for o in outs]
        assert [np.asarray(v).tolist() for v in values] == [[float(i)] * 4 for i in range(n)]
        assert seen == [[True] * n]
        assert [o.order for o in outs] == list(range(n)) and len({id(o) for o in outs}) == n
        assert sum(ctl.memory().values()) == before + n * 2 * 16  # replicated on 2 devices
        records = [r for r, fut in ctl.store.live() if fut in outs]
        assert len(records) == n and {r.program for r in records} == {"many"}

    check()
    assert sum(ctl.memory().values()) == before  # each freed when its future went


@pytest.mark.parametrize("n", SIZES)
def test_a_donating_call_behind_a_reader_of_a_host_callbacks_outputs_runs(ctl, n):
    """The donating call waits for its inputs' ends; their launch and end are seen in two
    threads, in either order, and it still becomes ready (it once waited for ever when the
    end was seen first)."""
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    make = pw.function(held(n, entered, release), slice=s, name="make")
    total = pw.function(lambda leaves, x: sum(leaves) + x, slice=s, name="total")
    step = pw.function(lambda leaves: [a * 2 for a in leaves], slice=s, donate_argnums=(0,),
                       name="step")
    try:
        outs = make(np.ones(3, np.float32))
        assert entered.wait(30)
        result = total(outs[::-1], np.ones(3, np.float32))
        new = step(outs)
    finally:
        release.set()
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)),
                               np.full(3, n + sum(range(n)) + 1))
    for i, f in enumerate(new):
        np.testing.assert_allclose(np.asarray(f.result(timeout=60)), np.full(3, 2.0 * (1 + i)))

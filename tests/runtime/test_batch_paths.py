"""The per-node batch paths of a call: a pytree of pending futures watched as one group per
producer, a node's outputs launched at once, donated futures marked consumed, a program's last
cache key reused without hashing. Behaviour only, on a real controller and real arrays."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime.objects import Future

N = 12


def held_many(entered: threading.Event, release: threading.Event, fail: bool = False):
    """``x -> [x + 0, ..., x + N-1]``, computed only once ``release`` is set (a host callback
    holds it); with ``fail``, the callback raises instead."""

    def hold(x):
        entered.set()
        if not release.wait(60):
            raise TimeoutError("never released")
        if fail:
            raise RuntimeError("the producer failed")
        return x

    def fn(x):
        y = jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return [y + i for i in range(N)]
    return fn


@pytest.mark.parametrize("order", ["as made", "reversed", "interleaved"])
def test_a_pytree_of_pending_futures_arrives_whole_in_any_order(ctl, order):
    # The group is watched on the future its producer resolves last, whatever the order the
    # arguments come in: watching another would let the consumer go before every leaf exists.
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    make = pw.function(held_many(entered, release), slice=s)
    other = pw.function(lambda x: x * 100, slice=s)
    total = pw.function(lambda leaves, z: sum(leaves) + z, slice=s)
    outs = make(np.ones(3, np.float32))
    z = other(np.ones(3, np.float32))
    assert entered.wait(60)
    if order == "reversed":
        outs = outs[::-1]
    elif order == "interleaved":
        outs = outs[1::2] + outs[0::2]
    result = total(outs, z)
    assert not result.done()
    release.set()
    expected = N * 1 + sum(range(N)) + 100
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)), np.full(3, expected))


def test_a_pytree_of_a_producer_not_yet_launched_arrives_at_its_launch(ctl):
    # Futures of a producer still queued (behind a computation holding the device) have no
    # values yet: the call that reads them takes them as one group, reads none of them when
    # it is submitted, and the group's launch hook puts every value in its slot.
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    hold = pw.function(held_many(entered, release), slice=s, name="hold")
    make = pw.function(lambda x: [x + i for i in range(N)], slice=s, name="make")
    total = pw.function(lambda leaves, k: sum(leaves) * k, slice=s, name="total")
    held = hold(np.ones(3, np.float32))
    assert entered.wait(60)
    outs = make(np.full(3, 2.0, np.float32))  # queued: the device is held
    assert not outs[0].producer.has_outputs and outs[0].peek() is None
    result = total(outs, 3.0)
    assert not result.done()
    release.set()
    np.testing.assert_allclose(np.asarray(result.result(timeout=60)),
                               np.full(3, 3.0 * (N * 2 + sum(range(N)))))
    assert held[0].result(60).tolist() == [1.0] * 3


def test_a_failed_producer_fails_its_whole_groups_consumer(ctl):
    s = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    make = pw.function(held_many(entered, release, fail=True), slice=s)
    total = pw.function(lambda leaves, x: sum(leaves) + x, slice=s)
    outs = make(np.ones(3, np.float32))
    assert entered.wait(60)
    result = total(outs[::-1], np.ones(3, np.float32))
    release.set()
    with pytest.raises(Exception, match="the producer failed"):
        result.result(timeout=60)
    assert all(o.exception() is result.exception() for o in outs)


def test_donated_futures_are_marked_consumed_and_count_no_more(ctl):
    s = ctl.slice(2, island=0)
    init = pw.function(lambda x: [x + i for i in range(N)], slice=s)
    step = pw.function(lambda state: [a * 2 for a in state], slice=s, donate_argnums=(0,))
    keep = pw.function(lambda state: [a * 2 for a in state], slice=s)
    state = init(np.ones(4, np.float32))
    kept = keep(state)
    jax.block_until_ready([k.result() for k in kept])
    assert not any(f.donated for f in state)  # read, not donated
    new = step(state)
    jax.block_until_ready([f.result() for f in new])
    assert all(f.donated for f in state) and not any(f.donated for f in new)
    # the donated leaves' buffers became the new ones: only `kept` and `new` are counted
    assert sum(ctl.memory().values()) == 2 * N * 2 * 16
    del state
    assert sum(ctl.memory().values()) == 2 * N * 2 * 16  # (nothing more to free)
    np.testing.assert_allclose(np.asarray(new[3].result()), np.full(4, 8.0))


def test_a_nodes_outputs_launch_in_order_and_skip_those_without_a_future():
    futs = [Future((2,), np.float32) for _ in range(3)]
    seen = []
    for k, f in enumerate(futs):
        f.on_launch(lambda fut, k=k: seen.append((k, fut.peek())))
    futs[2].set_result("done already")
    Future.set_launched_many([futs[0], None, futs[1], futs[2]], ["a", "b", "c", "d"])
    assert seen == [(2, "done already"), (0, "a"), (1, "c")]
    assert futs[2].peek() == "done already" and futs[0].running()


def test_first_error_finds_a_failed_future_among_other_leaves():
    ok, bad, pending = (Future((), np.float32) for _ in range(3))
    ok.set_result(1.0)
    error = ValueError("boom")
    bad.set_exception(error)
    assert Future.first_error([np.ones(2), ok, pending]) is None
    assert Future.first_error([pending, 3, bad, ok]) is error


def test_a_program_called_with_alternating_placements_uses_the_graph_of_each(ctl):
    s = ctl.slice(2, island=0)
    double = pw.function(lambda x: x * 2, slice=s)
    split = jax.device_put(np.arange(4.0, dtype=np.float32), NamedSharding(s.mesh, P("x")))
    both = jax.device_put(np.arange(4.0, dtype=np.float32), NamedSharding(s.mesh, P()))
    for x in (split, both, split, both.astype(np.int32), both):
        y = double(x)
        assert y.sharding.is_equivalent_to(x.sharding, 1) and y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(y.result()), np.asarray(x) * 2)
    f = double(double(split))  # a future's placement is its plan's precomputed key
    assert f.placement == ("dev", (4,), np.dtype(np.float32), f.sharding, False)
    np.testing.assert_array_equal(np.asarray(f.result()), np.arange(4.0) * 4)

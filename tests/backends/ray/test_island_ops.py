"""What an island does with one operation (``backends/ray/ops.py``, shared by the Ray island
actor and the pool's), run here in this process without Ray: issue operations in order, then
see each end, as the actors' executor and completion threads do."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pwkernel.backends.ray.ops import SETTINGS_AT, IslandDevices


@pytest.fixture
def island(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # (IslandDevices sets it for its process)
    # all of this process's devices: it sets JAX's device count (to the count JAX has, here)
    return IslandDevices(0, jax.device_count(), "cpu")


def run_op(rid, key, fn, inputs, outputs, donated=()):
    """A ``run`` operation of ``fn`` (one float32[4] in, one out) on positions 0 and 1, as
    the controller sends it (its outputs a flat tuple), exported under the name ``key``."""
    struct = jax.ShapeDtypeStruct((4,), np.float32)

    def body(x):
        return (fn(x),)

    body.__name__ = key
    blob = bytes(jax.export.export(jax.jit(body), platforms=["cpu"])(struct).serialize())
    layout = ((0, 1), (2,), ("x",), P("x"))
    return ("run", rid, key, blob, [layout], [layout], inputs, outputs, key, None, (),
            tuple(donated))


def issue(island, op, buffers, executables):
    return island.issue(op, 0.0, buffers, executables, None, None)


def test_a_value_a_later_launch_donates_is_seen_to_end_without_an_error(island):
    # The island issues a step, then the next step that donates the first one's output,
    # before its completion thread waits for the first (a training state donated step to
    # step): waiting on the donated buffer failed the first step with "BlockHostUntilReady()
    # called on deleted or donated buffer", though it ran.
    buffers, executables = {}, {}
    layout = ((0, 1), (2,), ("x",), P("x"))
    put = issue(island, ("put", 0, 10, np.arange(4, dtype=np.float32), layout), buffers,
                executables)
    first = issue(island, run_op(1, "double", lambda x: x * 2, [10], [11], donated=[0]),
                  buffers, executables)
    second = issue(island, run_op(2, "inc", lambda x: x + 1, [11], [12], donated=[0]),
                   buffers, executables)
    assert buffers[10].is_deleted() and buffers[11].is_deleted()  # both given on
    records = [island.complete(item) for item in (put, first, second)]
    assert [(r["rid"], r["ok"], r.get("error")) for r in records] == [
        (0, True, None), (1, True, None), (2, True, None)]
    assert all(r["t_start"] <= r["t_end"] for r in records)
    np.testing.assert_array_equal(np.asarray(buffers[12]), [1.0, 3.0, 5.0, 7.0])



def test_a_send_issued_before_a_run_that_donates_its_buffer_still_sends_the_value(island):
    # An eval on another island is given the parameters (a send), then the next step donates
    # them: the island issues both at once, but its completion thread reads the send's value
    # only after the work issued before it ended, and the step had consumed it ("Array has
    # been deleted"). Under jax.jit the transfer, dispatched first, holds the buffer.
    buffers, executables, sent = {}, {}, []
    layout = ((0, 1), (2,), ("x",), P("x"))

    def deliver(op):
        return lambda bid, value, error, t_src: sent.append((bid, value, error))

    items = [issue(island, ("put", 0, 10, np.arange(4, dtype=np.float32), layout), buffers,
                   executables),
             issue(island, run_op(1, "double", lambda x: x * 2, [10], [11]), buffers,
                   executables),
             island.issue(("send", 2, 11, 1, 50), 0.0, buffers, executables, None, deliver),
             issue(island, run_op(3, "inc", lambda x: x + 1, [11], [12], donated=[0]),
                   buffers, executables)]
    assert buffers[11].is_deleted()  # the step consumed it, as asked
    records = [island.complete(item) for item in items]
    assert [(r["rid"], r["ok"], r.get("error")) for r in records] == [
        (0, True, None), (1, True, None), (2, True, None), (3, True, None)]
    [(bid, value, error)] = sent
    assert (bid, error) == (50, None)
    np.testing.assert_array_equal(value, [0.0, 2.0, 4.0, 6.0])
    np.testing.assert_array_equal(np.asarray(buffers[12]), [1.0, 3.0, 5.0, 7.0])
    assert not island.sends._pending  # (nothing kept once sent)


def test_an_idle_island_actor_keeps_no_value_of_its_last_message(island):
    # The actor's executor thread kept the last message it issued (and its last operation)
    # in its locals while it waited for the next: a program's host argument, which Ray hands
    # over as a view of its shared object store, stayed pinned there until the next message.
    import gc
    import weakref

    from pwkernel.backends.ray.actor import IslandActor

    actor = IslandActor(0, jax.device_count(), "cpu")  # its threads stay (daemons), as on Ray
    value = np.arange(4, dtype=np.float32)
    held = weakref.ref(value)
    layout = ((0, 1), (2,), ("x",), P("x"))
    actor.submit(0, [("put", 0, 10, value, layout), ("free", [10])])
    del value
    assert actor.buffers(after=0) == {}  # the message was issued, its free done
    assert [r["rid"] for r in actor.poll(30.0)] == [0]  # and the put seen to end
    gc.collect()
    assert held() is None


def test_an_idle_pool_island_keeps_no_value_of_a_tenants_last_operation(island):
    # The pool island's completion thread of each tenant kept the last operation it saw end
    # (its item, which holds the operation) while it waited for the next one.
    import gc
    import weakref

    from pwkernel.backends.ray.tenancy import PoolIslandActor

    pool = PoolIslandActor(0, jax.device_count(), "cpu", "leaks", lease=600.0)
    secret = pool.register("t")["secret"]
    value = np.arange(4, dtype=np.float32)
    held = weakref.ref(value)
    layout = ((0, 1), (2,), ("x",), P("x"))
    pool.submit(secret, 0, [("put", 0, 10, value, layout), ("free", [10])])
    del value
    try:
        assert [r["rid"] for r in pool.poll(secret, 30.0)] == [0]  # the put seen to end
        gc.collect()
        assert held() is None
    finally:
        pool.unregister(secret, after=0)  # (its completion thread ends)


def test_a_pool_island_forgets_the_scheduler_accounts_of_tenants_that_left(island):
    # Every tenant that came and went kept an account and its computations' cost estimates
    # in the island's scheduler, which every scheduling pass read: after 10,000 attaches,
    # each launch of the tenants still there took 50 times as long (0.28 ms against 5 us).
    from pwkernel.backends.ray.tenancy import PoolIslandActor

    pool = PoolIslandActor(0, jax.device_count(), "cpu", "churn", lease=600.0)
    layout = ((0, 1), (2,), ("x",), P("x"))

    def run(secret: str, i: int) -> None:
        pool.submit(secret, 0, [("put", 0, 10, np.full(4, float(i), np.float32), layout),
                                run_op(1, f"inc{i}", lambda x: x + 1, [10], [11]),
                                ("free", [10])])
        records = []
        while len(records) < 2:
            records += pool.poll(secret, 30.0)
        assert [r["ok"] for r in records] == [True, True]

    stays = pool.register("stays")["secret"]
    run(stays, 0)
    for i in range(1, 4):
        secret = pool.register(f"t{i}")["secret"]
        run(secret, i)
        pool.unregister(secret, after=0)
    seen, deadline = -1, time.monotonic() + 60
    while pool.pool_status()["accounts"] != 1:  # the three leave as their threads end
        assert time.monotonic() < deadline, f"{pool.pool_status()['accounts']} accounts kept"
        seen = pool.changed(seen, 5.0)
    status = pool.pool_status()
    assert [t["name"] for t in status["tenants"]] == ["stays"]
    pool.unregister(stays, after=0)
    while pool.pool_status()["accounts"]:
        assert time.monotonic() < deadline, f"{pool.pool_status()['accounts']} accounts kept"
        seen = pool.changed(seen, 5.0)


def test_an_island_donates_what_the_controllers_executable_donates_under_debug_nans(island):
    # The controller compiled the step before jax_debug_nans was turned on, so its
    # executable donates (as jax.jit's does, whatever a later call's flag); the island first
    # runs it under the flag and compiled it without the donation: the controller took the
    # input as consumed while the island kept it. A NaN then fails the step, input consumed.
    buffers, executables = {}, {}
    layout = ((0, 1), (2,), ("x",), P("x"))
    issue(island, ("put", 0, 10, np.arange(4, dtype=np.float32), layout), buffers,
          executables)
    op = list(run_op(1, "log", lambda x: jnp.log(x - 1), [10], [11], donated=[0]))
    op[SETTINGS_AT["run"]] = (("jax_debug_nans", True),)
    with pytest.raises(Exception, match="nan") as info:  # (the actor makes its item of it)
        issue(island, tuple(op), buffers, executables)
    assert buffers[10].is_deleted()
    record = island.complete(island.failed(tuple(op), info.value, 0.0))
    assert not record["ok"] and record["type"] == "builtins:FloatingPointError", record


def test_an_islands_executable_is_named_after_the_controllers_function(island):
    """(every one an island compiled was jit_fenced in its process's logs and profiles)"""
    buffers, executables = {}, {}
    layout = ((0, 1), (2,), ("x",), P("x"))
    issue(island, ("put", 0, 10, np.arange(4, dtype=np.float32), layout), buffers,
          executables)
    issue(island, run_op(1, "my_step", lambda x: x * 2, [10], [11]), buffers, executables)
    text = executables["my_step"].call.as_text()
    assert "jit_my_step" in text and "jit_fenced" not in text


def test_a_run_donating_what_a_send_is_reading_waits_for_the_read():
    # The completion thread is reading the send's value when the executor issues a run that
    # donates it: the run waits for the read (no copy), then goes; a send not read yet gets
    # a copy instead.
    import threading

    from pwkernel.backends.ray.sending import Sends

    sends, value = Sends(), jnp.arange(4.0)
    sending = sends.issued(value)
    reading, finish, donated = threading.Event(), threading.Event(), threading.Event()

    def read(array):
        reading.set()
        assert finish.wait(30)
        return np.asarray(array)

    got = []
    reader = threading.Thread(target=lambda: got.append(sends.read(sending, read)))
    reader.start()
    assert reading.wait(30)
    copies = []
    donor = threading.Thread(target=lambda: (sends.before_donating([value], copies.append),
                                            donated.set()))
    donor.start()
    assert not donated.is_set() and not copies  # (waits: the read holds the value)
    finish.set()
    reader.join(30)
    assert donated.wait(30) and copies == []
    np.testing.assert_array_equal(got[0], [0.0, 1.0, 2.0, 3.0])
    later = sends.issued(value)
    sends.before_donating([value], lambda a: a + 0)  # not read yet: a copy
    assert later.array is not value and not sends._pending

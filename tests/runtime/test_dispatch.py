"""Dispatch and the island executors on real JAX devices: concurrency, order, failures,
cancellation, back-pressure, memory and threads. Waits are on futures and events only."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from pwkernel.runtime.scheduler import Finished, Launch
from tests.helpers.gang_order import LaunchLog
from tests.helpers.programs import (
    gate,
    launch_beside_a_running_gate,
    overlapping_chain,
    violations_with_the_device_check_off,
)


def failing(message: str):
    def boom(x):
        raise ValueError(message)

    return lambda x: jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_programs_on_two_islands_run_concurrently(ctl):
    in0, in1 = threading.Event(), threading.Event()
    # each computation waits until the other one has started: both finish only if they overlap
    f0 = pw.function(gate(in0, in1), slice=ctl.slice(1, island=0), name="left")
    f1 = pw.function(gate(in1, in0), slice=ctl.slice(1, island=1), name="right")
    x, y = f0(np.ones(2, np.float32)), f1(np.ones(2, np.float32))
    assert x.result(timeout=60).tolist() == y.result(timeout=60).tolist() == [1.0, 1.0]
    left, right = (next(e for e in ctl.trace.events() if e.name == n) for n in ("left", "right"))
    assert left.t_start < right.t_end and right.t_start < left.t_end


def test_one_island_launches_onto_busy_devices_only_behind_ancestors(ctl, monkeypatch):
    log = LaunchLog().install(monkeypatch)
    held, other = launch_beside_a_running_gate(ctl, log)
    slices = [ctl.slice(4, island=0), ctl.slice(2, island=0), ctl.slice(2, island=0),
              ctl.slice((2, 2), island=0)]
    fns = [pw.function(lambda x, k=k: x * 2 + k, slice=s, name=f"f{k}")
           for k, s in enumerate(slices)]
    results = []

    def chain(first, then):  # then's node is launched ahead, behind its ancestor first's
        return pw.program(lambda v: then(first(v)))

    def client(name: str, seed: int):
        with ctl.client(name):
            rng = np.random.default_rng(seed)
            for _ in range(15):
                a, b = rng.integers(len(fns), size=2)
                out = chain(fns[a], fns[b])(np.ones(4, np.float32))
                results.append((out, (2 + a) * 2 + b))

    threads = [threading.Thread(target=client, args=(f"c{i}", i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert held.result(timeout=60).tolist() == [1.0] * 4
    assert other.result(timeout=60).tolist() == [2.0] * 2
    for fut, want in results:
        assert fut.result(timeout=60).tolist() == [want] * 4
    assert len(results) == 45 and log.launches() >= 2 + 2 * 45
    assert log.violations() == []


def test_the_order_check_catches_a_scheduler_that_ignores_busy_devices(monkeypatch):
    # A test of the test above: with the device check switched off, it reports the launch.
    violations = violations_with_the_device_check_off(monkeypatch)
    assert any("not its ancestors" in v for v in violations), violations


def test_a_failed_computation_fails_its_dependents_not_the_controller(ctl):
    s0, s1 = ctl.slice(1, island=0), ctl.slice(1, island=1)
    bad = pw.function(failing("boom in the kernel"), slice=s0, name="bad")
    inc = pw.function(lambda x: x + 1, slice=s1)
    out = pw.program(lambda v: inc(inc(bad(v))))(np.ones(2, np.float32))
    with pytest.raises(Exception, match="boom in the kernel"):
        out.result(timeout=60)
    assert isinstance(out.exception(), Exception) and out.state is pw.FutureState.FAILED
    assert [e.status for e in ctl.trace.events() if e.name == "bad"] == ["error"]
    # the controller and other clients carry on
    with ctl.client("other"):
        assert inc(np.zeros(2, np.float32)).result(timeout=60).tolist() == [1.0, 1.0]
    del out
    gc.collect()
    assert sum(ctl.memory().values()) == 0


def test_cancel_drops_queued_work_and_frees_its_buffers(ctl):
    entered, release = threading.Event(), threading.Event()
    s = ctl.slice(1, island=0)
    blocker = pw.function(gate(entered, release), slice=s, name="blocker")
    inc = pw.function(lambda x: x + 1, slice=s)
    held = blocker(np.ones(2, np.float32))
    assert entered.wait(60)
    queued = pw.program(lambda v: inc(inc(v)))(np.ones(2, np.float32))
    assert queued.run.cancel() >= 1
    release.set()
    assert held.result(timeout=60).tolist() == [1.0, 1.0]
    with pytest.raises(pw.CancelledError, match="cancelled"):
        queued.result(timeout=60)
    with pytest.raises(concurrent.futures.CancelledError):  # what such code catches, too
        queued.result(timeout=60)
    assert queued.cancelled() and queued.run.wait(60)
    assert ctl.runs() == []
    del held, queued
    gc.collect()
    assert sum(ctl.memory().values()) == 0


def test_back_pressure_waits_for_memory_instead_of_failing():
    # Each call uploads its argument (32 bytes, counted until the call is done) and makes a
    # 32-byte output: a call needs 64 bytes while it runs.
    ctl = pw.Controller(islands=(2, 2), memory_budget=96)
    try:
        s = ctl.slice(1, island=0)
        make = pw.function(lambda x: x + 1, slice=s)
        first = make(np.zeros(8, np.float32))   # 32 bytes held
        second = make(np.zeros(8, np.float32))  # 64 bytes held
        first.result(timeout=60), second.result(timeout=60)
        third = make(np.zeros(8, np.float32))   # its upload fits (96), its output does not
        state = ctl.status()["islands"][0]
        assert (state["queued"], state["running"]) == (1, 0)  # stalled, not failed
        assert state["memory_reserved"][s.device_ids[0]] == 96
        assert not third.done()
        del first
        gc.collect()                                            # frees 32 bytes
        assert third.result(timeout=60).tolist() == [1.0] * 8
        huge = make(np.zeros(32, np.float32))                   # 128 bytes > budget
        with pytest.raises(pw.MemoryBudgetError, match="memory budget is 96"):
            huge.result(timeout=60)
    finally:
        ctl.close()


def test_object_store_returns_to_zero_when_futures_are_dropped(ctl):
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    a = pw.function(lambda x: x * 2, slice=s0)
    b = pw.function(lambda x: x + 1, slice=s1)
    y, z = pw.program(lambda v: (b(a(v)), a(b(v))))(np.ones(8, np.float32))
    y.result(timeout=60), z.result(timeout=60)
    assert ctl.wait(60)  # the run's own bookkeeping (it lets go of its futures) is over too
    held = ctl.memory()
    # only the two outputs are alive: 32 B each, replicated on their slice's two devices
    assert sum(held.values()) == 2 * 2 * 8 * 4
    assert {r.program for r in ctl.store.records()} == {"<lambda>"}
    del y
    gc.collect()
    assert sum(ctl.memory().values()) == 2 * 8 * 4
    del z
    gc.collect()
    assert sum(ctl.memory().values()) == 0


def test_future_api_callbacks_await_and_numpy(ctl):
    f = pw.function(lambda x: x * 3, slice=ctl.slice(2))
    fut = f(np.arange(4, dtype=np.float32))
    seen = threading.Event()
    fut.add_done_callback(lambda fu: seen.set())
    assert seen.wait(60) and fut.done() and fut.exception() is None
    assert np.asarray(fut).tolist() == [0.0, 3.0, 6.0, 9.0]

    async def main():
        return await f(np.ones(2, np.float32))

    assert asyncio.run(main()).tolist() == [3.0, 3.0]
    late = []
    fut.add_done_callback(late.append)  # already done: called at once
    assert late == [fut]


def test_futures_of_a_closed_controller_say_so():
    ctl = pw.Controller(islands=(2, 2))
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1))
    fut = f(np.ones(2, np.float32))
    fut.result(timeout=60)
    ctl.close()
    with pytest.raises(pw.ControllerClosedError, match="closed controller"):
        fut.result()
    other = pw.Controller(islands=(2, 2))
    try:
        g = pw.function(lambda x: x + 1, slice=other.slice(1))
        with pytest.raises(pw.ControllerClosedError, match="closed controller"):
            g(fut)
    finally:
        other.close()


class ClosesWhileRead:
    """The local backend, except that ``fut.result()``'s first look at a value (``at``: the
    backend's ``fetch`` or ``failure``) waits until another thread has closed the controller:
    an interleaving of a reader and a closer, made certain."""

    def __init__(self, at: str):
        self.inner = LocalBackend(islands=(2,))
        self.at, self.ctl = at, None

    def __getattr__(self, name):  # everything else is the local backend's
        return getattr(self.inner, name)

    def _close_first(self, hook: str) -> None:
        if hook == self.at and self.ctl is not None:
            closer = threading.Thread(target=self.ctl.close)
            self.ctl = None
            closer.start()
            closer.join(60)

    def fetch(self, value, sharding):
        self._close_first("fetch")
        return self.inner.fetch(value, sharding)

    def failure(self, value):
        self._close_first("failure")
        return self.inner.failure(value)


@pytest.mark.parametrize("at", ["fetch", "failure"])
def test_a_result_read_while_another_thread_closes_is_the_value_or_says_closed(at):
    """``fut.result()`` in one thread while another closes the controller: the reader saw an
    open controller, then read a buffer the close deleted meanwhile, and returned None or a
    deleted array. Now the value is the reader's once ``result`` has taken it (the close
    leaves it alive: ``failure`` is asked after that), and before that the close wins and
    ``result`` raises ``ControllerClosedError``."""
    backend = ClosesWhileRead(at)
    ctl = pw.Controller(backend=backend)
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1))
    fut = f(np.ones(2, np.float32))
    assert fut.wait(60)
    backend.ctl = ctl
    if at == "fetch":
        with pytest.raises(pw.ControllerClosedError, match="closed controller"):
            fut.result()
    else:
        value = fut.result()
        assert not value.is_deleted() and value.tolist() == [2.0, 2.0]
    assert ctl.status()["closed"]


def test_a_value_read_before_a_close_is_the_readers():
    """The other order: a value ``fut.result()`` handed out stays alive through a close that
    comes after (the close frees the runtime's buffers, not the reader's)."""
    ctl = pw.Controller(islands=(2,))
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1))
    value = f(np.ones(2, np.float32)).result(timeout=60)
    ctl.close()
    assert not value.is_deleted() and value.tolist() == [2.0, 2.0]


def test_close_leaves_no_threads_and_cancels_pending_work():
    before = {t.name for t in threading.enumerate() if t.name.startswith("pw-")}
    ctl = pw.Controller(islands=(2, 2), dispatch="sequential")
    entered, release = threading.Event(), threading.Event()
    s = ctl.slice(1, island=0)
    blocker = pw.function(gate(entered, release), slice=s)
    inc = pw.function(lambda x: x + 1, slice=s)
    held = blocker(np.ones(2, np.float32))
    pending = inc(inc(np.ones(2, np.float32)))
    assert entered.wait(60)
    pending.add_done_callback(lambda _: release.set())  # close cancels it, then the gate opens
    ctl.close()
    assert held.exception(timeout=0) is None
    with pytest.raises(pw.CancelledError):
        pending.result(timeout=0)
    after = {t.name for t in threading.enumerate() if t.name.startswith("pw-")}
    assert after == before
    with pytest.raises(pw.ControllerClosedError):
        ctl.policy = "share"
    with pytest.raises(pw.ControllerClosedError), ctl.client("late"):
        pass


def _over_the_link(bandwidth: float):
    """A controller whose islands are joined by an emulated DCN link of ``bandwidth``, and a
    program that returns ``x`` and ``x + 1`` computed on the other island (``x`` crosses)."""
    ctl = pw.Controller(islands=(2, 2), dcn=pw.Link(bandwidth=bandwidth, latency=0.0))
    a = pw.function(lambda x: x * 2, slice=ctl.slice(1, island=0))
    b = pw.function(lambda x: x + 1, slice=ctl.slice(1, island=1))

    @pw.program
    def across(v):
        x = a(v)
        return x, b(x)

    return ctl, across


def test_close_with_copies_on_the_link_ends_every_run_and_frees_its_buffers():
    """More emulated DCN copies in flight than transfer workers when the controller closes:
    each is watched to its end. Before, the copies still queued for a worker were dropped: their
    runs never ended and kept their buffers, and copies waiting for them kept their threads."""
    before = {t.name for t in threading.enumerate() if t.name.startswith("pw-")}
    arrays = {id(a) for a in jax.live_arrays()}
    ctl, across = _over_the_link(bandwidth=4e6)  # 0.1 s a copy, one at a time
    outs = [across(np.full(100_000, i, np.float32)) for i in range(10)]
    for x, _ in outs:
        x.result(timeout=60)  # every copy has begun
    ctl.close()
    assert ctl.runs() == []
    assert all(y.done() for _, y in outs)  # landed and computed, or cancelled
    del outs, x
    gc.collect()
    assert [a for a in jax.live_arrays() if id(a) not in arrays] == []
    assert {t.name for t in threading.enumerate() if t.name.startswith("pw-")} == before


def test_close_does_not_wait_for_the_link_model():
    """Closing lands the copies on an emulated DCN link at once: the link model held each to
    its modelled time, and ten 100 KB copies on a 10 KB/s link kept close() for 100 s."""
    ctl, across = _over_the_link(bandwidth=1e4)
    outs = [across(np.full(25_000, i, np.float32)) for i in range(10)]
    for x, _ in outs:
        x.result(timeout=60)
    closing = threading.Thread(target=ctl.close)
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive()
    assert ctl.runs() == [] and all(y.done() for _, y in outs)


def test_share_policy_on_the_real_runtime(ctl):
    ctl.policy = "share"
    s = ctl.slice(4, island=0)
    replicated = jax.sharding.PartitionSpec()
    work = pw.function(lambda x: (x @ x.T) @ x, slice=s, in_specs=replicated, out_specs=replicated)
    # an input already on the slice: no transfers, so every queued computation is ready at once
    x = work(np.ones((192, 192), np.float32) / 192).result(timeout=60)
    entered, release = threading.Event(), threading.Event()
    gate_fn = pw.function(gate(entered, release, s.mesh), slice=s, in_specs=pw.BATCH)
    blocker = gate_fn(np.ones(4, np.float32))  # hold the island while every client queues up
    assert entered.wait(60)
    weights = {"w1": 1, "w2": 2, "w4": 4, "w8": 8}
    futures = {}
    for name, w in weights.items():
        with ctl.client(name, weight=w):
            futures[name] = [work(x) for _ in range(24 * w)]
    release.set()
    blocker.result(timeout=60)
    for name in ("w8", "w4", "w2", "w1"):
        for f in futures[name]:
            f.result(timeout=120)
    events = [e for e in ctl.trace.events() if e.kind == "compute" and e.client in weights]
    # shares while every client was still backlogged: until the first client ran out
    first_done = min(max(e.t_end for e in events if e.client == n) for n in weights)
    window = [e for e in events if e.t_end <= first_done]
    busy = {n: sum(e.duration for e in window if e.client == n) for n in weights}
    total = sum(busy.values())
    for name, w in weights.items():
        assert abs(busy[name] / total - w / 15) <= 0.05, (busy, total)


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_a_transfer_between_overlapping_slices_copies_instead_of_aliasing(mode):
    # Sequential dispatch launches g only after the transfer landed and f's output was freed:
    # a copy that aliased f's buffer would be deleted with it (the crash this guards against).
    with pw.Controller(islands=(4, 4), dispatch=mode) as ctl:
        prog = overlapping_chain(ctl)
        for i in range(20):
            outs = [prog(np.full(24, i, np.float32)) for _ in range(2)]
            for out in outs:
                np.testing.assert_array_equal(np.asarray(out.result(timeout=60)),
                                              np.full(24, 2 * i + 1, np.float32))
        del outs, out
        assert ctl.wait(60)
        gc.collect()
        assert all(n == 0 for n in ctl.memory().values())


def stamped(ctl, name: str, times: dict[str, tuple[float, float]]):
    """A computation that notes, on the controller's clock, when its host callback began and
    returned (``times[name]``): when the work really ran, to hold its trace span against."""

    def hold(x):
        begin = ctl.executor.now()
        times[name] = (begin, ctl.executor.now())
        return x

    return lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_the_trace_spans_cover_when_the_work_ran(ctl):
    # docs/architecture.md "How time is measured": a span's end is seen only after the work
    # returned, and it starts no earlier than its launch nor than the work before it on its
    # devices ended. (How LATE an end is seen is a measurement, not a rule: a benchmark's.)
    s = ctl.slice(1, island=0)
    times: dict[str, tuple[float, float]] = {}
    first = pw.function(stamped(ctl, "first", times), slice=s, name="first")
    second = pw.function(stamped(ctl, "second", times), slice=s, name="second")
    out = pw.program(lambda v: second(first(v)))(np.ones(2, np.float32))
    assert out.result(timeout=60).tolist() == [1.0, 1.0]
    spans = {e.name: e for e in ctl.trace.events() if e.kind == "compute"}
    assert set(spans) == set(times) == {"first", "second"}
    for name, (_, returned) in times.items():  # never ends before the work returned
        assert spans[name].t_submit <= spans[name].t_start <= spans[name].t_end, spans[name]
        assert returned <= spans[name].t_end, (name, times[name], spans[name])
    assert times["first"][1] <= times["second"][0]  # the data dependency, as XLA ran it
    assert spans["first"].t_end <= spans["second"].t_start


def test_work_launched_ahead_starts_when_its_producer_ends(ctl, monkeypatch):
    # The consumer is launched at once, behind its producer (both launches are decided when
    # the program is submitted, before the producer can have finished): its span starts at
    # the later of the producer's end and its own launch, never at its launch alone.
    log = LaunchLog().install(monkeypatch)
    s = ctl.slice(1, island=0)
    slow = pw.function(lambda x: jax.lax.fori_loop(0, 30, lambda i, v: jnp.tanh(v @ v), x),
                       slice=s, name="slow")
    quick = pw.function(lambda x: x + 1, slice=s, name="quick")

    @pw.program
    def prog(v):
        y = slow(v)
        return y, quick(y)

    made, out = prog(np.eye(128, dtype=np.float32))
    out.result(timeout=60)
    producer, consumer = made.producer, out.producer  # the runtime's tasks for slow, quick
    (calls,) = [c for c in log.calls.values() if any(
        isinstance(d, Launch) and d.task == consumer.id for _, ds in c for d in ds)]
    launched = next(k for k, (_, ds) in enumerate(calls)
                    if any(isinstance(d, Launch) and d.task == consumer.id for d in ds))
    finished = next(k for k, (evs, _) in enumerate(calls)
                    if any(isinstance(e, Finished) and e.task == producer.id for e in evs))
    assert launched < finished  # launched ahead: before the scheduler heard slow had ended
    spans = {e.name: e for e in ctl.trace.events() if e.kind == "compute"}
    assert spans["slow"].t_end <= spans["quick"].t_start <= spans["quick"].t_end
    assert spans["quick"].t_start == max(spans["slow"].t_end, consumer.t_launch)


def test_a_plan_is_made_once_per_input_signature_and_runs_keep_few_objects(ctl):
    s = ctl.slice(2, island=0)
    inc = pw.function(lambda x: x + 1, slice=s)
    prog = pw.program(lambda v: inc(inc(inc(v))))
    x = np.ones(4, np.float32)
    first = prog(x)
    plan = prog.trace(x).plan
    assert plan is not None and [n.is_compute for n in plan.nodes] == [False, True, True, True]
    # a run held back behind a gate: what it keeps while it waits
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release, s.mesh), slice=s, in_specs=pw.BATCH,
                       name="gate")(x)
    assert entered.wait(60)
    second = prog(x)
    assert prog.trace(x).plan is plan  # the same plan: no host-side work per node again
    inside = {v for n in plan.nodes for v in n.outputs} - set(plan.outputs)
    assert len(inside) == 3 and not inside & set(second.run.futures)  # no Future for those
    assert len(second.run.tasks) == len(plan.nodes)
    release.set()
    assert first.result(timeout=60).tolist() == second.result(timeout=60).tolist() == [4.0] * 4
    held.result(timeout=60)
    assert prog(np.ones(8, np.float32)).run.plan is not plan  # another signature, another plan


def test_cancelling_the_task_awaiting_a_future_leaves_its_program_running(ctl):
    """Unlike ``asyncio.wrap_future`` on a ``concurrent.futures.Future``, a cancelled awaiter
    (``task.cancel()``, ``asyncio.wait_for`` timing out) gives up only its own wait: the
    future is a value other programs and futures may share, and ``fut.cancel()`` cancels its
    whole program, so that stays an explicit call."""
    release = threading.Event()

    def held(x):
        return jax.pure_callback(lambda a: (release.wait(60), a)[1],
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    fut = pw.function(held, slice=ctl.slice(2))(np.arange(3, dtype=np.float32))

    async def main():
        task = asyncio.ensure_future(_awaiting(fut))
        await asyncio.sleep(0)  # the task is now awaiting the future
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not fut.done()
        release.set()
        return await fut

    assert asyncio.run(main()).tolist() == [0.0, 1.0, 2.0] and not fut.cancelled()


async def _awaiting(fut):
    return await fut

"""A value a run made is let go of once its last reader has launched, as ``jax.jit``'s caller
drops an intermediate: XLA then frees it when that reader has run, not when the runtime hears of
the reader's end. The executor says whether its launches hold their inputs
(``launch_holds_inputs``); one that does not gets its values deleted after the last reader's
end, as before.

The executor here is the local backend with one change, made through the public executor
contract: the completion of computations named ``late`` is reported only when the test says
so, so the test can look at the run between that launch and its end.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from tests.helpers.budget import reserved

SHAPE = (3, 5)  # the intermediate's shape: nothing else in the program has it


class LateEnds:
    """The local backend, except that a ``late`` computation's completion waits for ``go``."""

    def __init__(self, holds_inputs: bool):
        self.inner = LocalBackend(islands=(2,))
        self.launch_holds_inputs = holds_inputs
        self.launched, self.go = threading.Event(), threading.Event()
        self._threads: list[threading.Thread] = []

    def __getattr__(self, name):  # everything else is the local backend's
        return getattr(self.inner, name)

    def launch(self, island, tasks):
        for task in tasks:
            if task.node.name != "late":
                self.inner.launch(island, [task])
                continue
            outs = task.node.call(*task.inputs())
            task.launched(outs)
            self.launched.set()

            def complete(task=task, outs=outs):
                self.go.wait(60)
                jax.block_until_ready(list(outs))
                task.completed(self.inner.now())

            thread = threading.Thread(target=complete, name="late-end")
            thread.start()
            self._threads.append(thread)

    def close(self):
        self.go.set()
        for thread in self._threads:
            thread.join()
        self.inner.close()


def intermediates(ctl) -> list:
    """The values the controller's runs hold that have the intermediate's shape."""
    return [v for run in ctl.runs() for v in run.values or ()
            if isinstance(v, jax.Array) and v.shape == SHAPE]


def run_held(holds_inputs: bool):
    """Start ``late(early(x))`` and stop between ``late``'s launch and its end; returns the
    controller, its backend, the output future and what the run then holds."""
    ex = LateEnds(holds_inputs)
    ctl = pw.Controller(backend=ex)
    s = ctl.slice(1, island=0)
    early = pw.function(lambda x: jnp.ones(SHAPE) * x.sum(), slice=s, name="early")
    late = pw.function(lambda a: a.sum(axis=0), slice=s, name="late")
    out = pw.program(lambda x: late(early(x)))(np.arange(4, dtype=np.float32))
    assert ex.launched.wait(60)
    return ctl, ex, out, intermediates(ctl)


@pytest.mark.parametrize("holds_inputs", [True, False])
def test_the_last_readers_launch_lets_go_of_a_value_where_launches_hold_their_inputs(
        holds_inputs):
    ctl, ex, out, held = run_held(holds_inputs)
    try:
        # the local backend's launches hold their inputs: nothing of early's output is kept
        # while late runs; a backend whose launches do not keeps it until late's end
        assert len(held) == (0 if holds_inputs else 1)
        ex.go.set()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.full(5, 18.0))
        assert ctl.wait(60) and not ctl.runs()
        assert all(v.is_deleted() for v in held)  # deleted after its last reader's end
    finally:
        ctl.close()


def test_a_let_go_value_still_gives_its_bytes_back_under_a_memory_budget():
    ex = LateEnds(True)
    ctl = pw.Controller(backend=ex, memory_budget=1 << 20)
    try:
        s = ctl.slice(1, island=0)
        early = pw.function(lambda x: jnp.ones(SHAPE) * x.sum(), slice=s, name="early")
        late = pw.function(lambda a: a.sum(axis=0), slice=s, name="late")
        out = pw.program(lambda x: late(early(x)))(np.arange(4, dtype=np.float32))
        assert ex.launched.wait(60) and not intermediates(ctl)
        device = s.device_ids[0]
        # let go of, and still counted until late's end (XLA frees it only once late has run)
        assert reserved(ctl)[device] >= 4 * np.prod(SHAPE)
        ex.go.set()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.full(5, 18.0))
        assert ctl.wait(60)
        del out
        assert not any(reserved(ctl).values())  # given back once, at late's end
    finally:
        ctl.close()


def donating_chain(s):
    """``early`` makes a value, ``late`` donates what it is given (XLA reuses its buffer for
    its own output), ``total`` reads that: three functions on ``s``."""
    early = pw.function(lambda x: jnp.ones(SHAPE) * x.sum(), slice=s, name="early")
    late = pw.function(lambda a: a * 2.0, slice=s, donate_argnums=0, name="late")
    total = pw.function(lambda b: b.sum(axis=0), slice=s, name="total")
    return early, late, total


class ReadsInside:
    """``wrap(fn)``: each call first starts a thread that reads ``ctl.memory()[device]`` and
    waits until it has started (it then reads at once, holding the GIL), so the read lands
    inside ``fn``'s caller, at the moment ``fn`` is called."""

    def __init__(self, ctl, device):
        self.ctl, self.device, self.reads, self._threads = ctl, device, [], []

    def wrap(self, fn):
        def inside(*args):
            started = threading.Event()

            def read():
                started.set()
                self.reads.append(self.ctl.memory()[self.device])

            reader = threading.Thread(target=read, name="memory-read")
            self._threads.append(reader)
            reader.start()
            started.wait(60)
            return fn(*args)
        return inside

    def done(self) -> list[int]:
        for reader in self._threads:
            reader.join(60)
        return self.reads


@contextlib.contextmanager
def probed_chain():
    """A sequential controller whose ``late`` ends when the test says (``LateEnds``), the
    ``donating_chain`` on one device of it, and a ``ReadsInside`` of that device."""
    ex = LateEnds(True)
    ctl = pw.Controller(backend=ex, dispatch="sequential")
    try:
        s = ctl.slice(1, island=0)
        [device] = [d for d in ctl.devices if d.id == s.device_ids[0]]
        yield ex, ReadsInside(ctl, device), donating_chain(s)
    finally:
        ctl.close()


@pytest.mark.parametrize("budget", [None, 1 << 20])
def test_a_value_the_run_made_and_a_launch_donated_holds_no_bytes_while_that_launch_runs(
        budget):
    """``late`` donates ``early``'s output and XLA reuses its buffer for its own: while
    ``late`` runs, ``ctl.memory()`` counts that buffer once, as its output (as it does a
    donated future), not also as the consumed input, with or without a memory budget.
    Before, without a budget it counted both until ``late``'s end (a pipeline's backward
    that donates the running gradient sum showed two sums per stage, where one is held)."""
    ex = LateEnds(True)
    ctl = pw.Controller(backend=ex, memory_budget=budget, dispatch="sequential")
    try:
        s = ctl.slice(1, island=0)
        early, late, total = donating_chain(s)
        out = pw.program(lambda x: total(late(early(x))))(np.arange(4, dtype=np.float32))
        assert ex.launched.wait(60)
        [device] = [d for d in ctl.devices if d.id == s.device_ids[0]]
        assert ctl.memory()[device] == 4 * np.prod(SHAPE), budget  # late's output alone
        ex.go.set()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.full(5, 36.0))
        assert ctl.wait(60)
    finally:
        ctl.close()


def test_memory_read_while_a_launch_takes_its_donated_value_counts_it_once(monkeypatch):
    """``ctl.memory()`` read by another thread at the moment ``late``'s launch holds its
    output and marks ``early``'s output consumed sees one value, not both: the two happen
    under the run's lock, and the read takes it. Before, a read between them (a sampling
    thread given the GIL there) counted the donated value beside the output that reuses
    its buffer (the doc's pipeline step read 2.03 MiB in some steps for 1.04)."""
    from pwkernel.runtime.slots import RunSlots

    with probed_chain() as (ex, probe, (early, late, total)):
        monkeypatch.setattr(RunSlots, "mark_given", probe.wrap(RunSlots.mark_given))
        out = pw.program(lambda x: total(late(early(x))))(np.arange(4, dtype=np.float32))
        assert ex.launched.wait(60)
        assert probe.done() == [4 * np.prod(SHAPE)]  # late's output alone
        ex.go.set()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.full(5, 36.0))


def test_memory_read_while_a_launch_consumes_a_donated_future_counts_it_once(monkeypatch):
    """``late`` donates a future (``state``, another run's output, in the object store) and
    holds its output in its run's slots: ``ctl.memory()`` read by another thread between the
    two (the output held, the future not yet marked consumed) counts the buffer once. Before,
    the store still counted the future and the run its output, which reuses that buffer."""
    from pwkernel.runtime.objects import Future

    with probed_chain() as (ex, probe, (early, late, total)):
        state = pw.program(lambda x: early(x))(np.arange(4, dtype=np.float32))
        state.wait(60)
        assert probe.ctl.memory()[probe.device] == 4 * np.prod(SHAPE)  # the future alone
        monkeypatch.setattr(Future, "consumed_many",
                            staticmethod(probe.wrap(Future.consumed_many)))
        out = pw.program(lambda a: total(late(a)))(state)
        assert ex.launched.wait(60)
        assert probe.done() == [4 * np.prod(SHAPE)]  # late's output alone
        ex.go.set()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.full(5, 36.0))

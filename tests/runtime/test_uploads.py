"""A call's host values (NumPy arrays, Python scalars) go up in one ``host`` transfer: one
task, one span in the trace, one ``jax.device_put`` (``Graph.upload``), not one per leaf."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.backends.local.executor import _upload_error
from pwkernel.runtime.plan import build

N = 40


def _body(xs, scale):
    return [x * scale for x in xs]


def test_many_host_leaves_go_up_in_one_transfer(ctl):
    s = ctl.slice(2, island=0)
    f = pw.function(_body, slice=s)
    xs = [np.full((2,), i, np.float32) for i in range(N)]
    n = ctl.trace.next_index
    outs = f(xs, 2.0)
    got = [o.result(timeout=60) for o in outs]
    copies = [e for e in ctl.trace.events(since=n) if e.kind == "transfer"]
    assert len(copies) == 1  # one span for the N + 1 leaves, not one each
    assert copies[0].link == "host" and copies[0].nbytes == N * 8 + 4
    want = jax.jit(_body)(xs, 2.0)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert [o.weak_type for o in outs] == [w.weak_type for w in want]
    graph = pw.program(lambda xs, scale: f(xs, scale)).trace(xs, 2.0)
    (upload,) = [node for node in graph.nodes if type(node).__name__ == "TransferNode"]
    assert len(upload.inputs) == len(upload.outputs) == N + 1
    assert graph.values[upload.outputs[-1]].weak  # the Python scalar stays weakly typed


def test_an_upload_counts_every_value_on_each_device(ctl):
    s = ctl.slice(2, island=0)
    f = pw.function(lambda a, b: (a + 1, b + 1), slice=s, in_specs=(P("x"), P()))
    a, b = np.ones(4, np.float32), np.ones(3, np.float32)
    plan = build(pw.program(lambda a, b: f(a, b)).trace(a, b))
    (upload,) = [p for p in plan.nodes if not p.is_compute]
    # a is split over the 2 devices (8 bytes each), b replicated (12 bytes each)
    assert upload.out_nbytes == ({d: 8 for d in s.device_ids}, {d: 12 for d in s.device_ids})
    assert upload.memory == 20
    assert [sh.spec for sh in upload.shardings] == [P("x"), P()]


def test_an_upload_under_a_memory_budget_runs_and_gives_its_bytes_back():
    ctl = pw.Controller(islands=(4,), memory_budget=1 << 20)
    try:
        s = ctl.slice(2)
        f = pw.function(_body, slice=s)
        xs = [np.full((2,), i, np.float32) for i in range(N)]
        outs = f(xs, 3.0)
        assert [o.result(timeout=60).tolist() for o in outs] == [[3.0 * i] * 2
                                                                 for i in range(N)]
        del outs
        ctl.wait()
        gc.collect()
        assert not any(ctl.memory().values())  # the upload's bytes were given back
    finally:
        ctl.close()


def test_programs_share_a_host_value_uploaded_for_an_earlier_call(ctl):
    s = ctl.slice(2, island=0)
    f = pw.function(lambda a, b: a + b, slice=s)

    @pw.program
    def p(a, b, c):
        return f(f(a, b), c), f(a, c)

    graph = p.trace(np.ones(2, np.float32), np.ones(2, np.float32), np.ones(2, np.float32))
    uploads = [node for node in graph.nodes if type(node).__name__ == "TransferNode"]
    # the first call uploads a and b together; the second c alone; the third reuses both
    assert [len(u.inputs) for u in uploads] == [2, 1]
    y, z = p(np.ones(2, np.float32), np.ones(2, np.float32), np.full(2, 2.0, np.float32))
    assert y.result(timeout=60).tolist() == [4.0, 4.0]
    assert z.result(timeout=60).tolist() == [3.0, 3.0]


def test_a_value_that_cannot_go_up_fails_the_upload_with_its_own_error():
    devices = jax.devices()[:1]
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    node = SimpleNamespace(name="host:host->0", shardings=(sharding, sharding))
    values = [np.ones(2), object()]
    with pytest.raises(TypeError) as alone:
        jax.device_put(values[1], sharding)
    error = _upload_error(node, values, RuntimeError("the batch failed"))
    assert type(error) is TypeError and str(error) == str(alone.value)

"""Property: random programs from concurrent clients, with collectives, all complete with the
plain-numpy answer, and every island's scheduler launches a computation onto a busy device only
behind its own ancestors (checked on its decisions, see tests/helpers/gang_order.py)."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from tests.helpers.gang_order import LaunchLog
from tests.helpers.programs import violations_with_the_device_check_off

N = 8  # elements per value: divides every slice size used here


def build(ctl):
    s4 = ctl.slice(4, island=0)
    s2a = ctl.slice(2, island=0)
    s2b = ctl.slice(2, island=1)
    s4b = ctl.slice(4, island=1)

    def with_psum(vs):
        body = jax.shard_map(lambda b: b + jax.lax.psum(b, "x"), mesh=vs.mesh,
                             in_specs=P("x"), out_specs=P("x"))
        return pw.function(body, slice=vs, in_specs=P("x"), out_specs=P("x"), name="psum")

    def psum_ref(x, n):
        return x + np.tile(x.reshape(n, -1).sum(0), n)

    return [
        (pw.function(lambda x: x * 2, slice=s2a, name="double"), lambda x: x * 2),
        (pw.function(lambda x: x + 1, slice=s2b, name="inc"), lambda x: x + 1),
        (with_psum(s4), lambda x: psum_ref(x, 4)),
        (with_psum(s4b), lambda x: psum_ref(x, 4)),
        (pw.function(lambda x, y: x - y, slice=s4, name="sub"), None),
    ]


steps = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 99), st.integers(0, 99)),
                 min_size=1, max_size=6)


def run_random(ops, plan, seed):
    def body(v):
        vals = [v]
        for op, i, j in plan:
            fn = ops[op][0]
            args = (vals[i % len(vals)], vals[j % len(vals)]) if op == 4 else (vals[i % len(vals)],)
            vals.append(fn(*args))
        return vals[-1]

    def ref(v):
        vals = [v]
        for op, i, j in plan:
            a = vals[i % len(vals)]
            vals.append(a - vals[j % len(vals)] if op == 4 else ops[op][1](a))
        return vals[-1]

    x = np.arange(N, dtype=np.float32) + seed
    return pw.program(body)(x), ref(x)


def run_clients(ctl, plans) -> None:
    """Each plan from its own client thread, weighted; every result checked against numpy."""
    ops = build(ctl)
    outcomes: list = [None] * len(plans)

    def client(k: int) -> None:
        with ctl.client(f"client{k}", weight=k + 1):
            outcomes[k] = run_random(ops, plans[k], k)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fut, expected in outcomes:
        np.testing.assert_allclose(fut.result(timeout=120), expected, rtol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(plans=st.lists(steps, min_size=2, max_size=3), mode=st.sampled_from(["parallel",
                                                                           "sequential"]))
def test_random_programs_from_concurrent_clients(plans, mode):
    with pytest.MonkeyPatch.context() as mp:
        log = LaunchLog().install(mp)
        with pw.Controller(islands=(4, 4), dispatch=mode) as ctl:
            run_clients(ctl, plans)
        assert log.launches() >= len(plans)  # at least each program's last step
        assert log.violations() == []


def test_the_order_check_catches_a_scheduler_that_ignores_busy_devices(monkeypatch):
    # A test of the property above: the same clients, behind an unrelated computation that
    # holds island 0, with the device check switched off: the check reports it.
    plans = [[(0, 0, 0), (2, 1, 0)], [(1, 0, 0), (3, 1, 0)]]
    violations = violations_with_the_device_check_off(monkeypatch,
                                                      lambda ctl: run_clients(ctl, plans))
    assert any("not its ancestors" in v for v in violations), violations

"""Computations and programs that tests in several folders run on a controller: a gate that
holds its devices until released, a transfer between overlapping slices, the paper's Figure 2
with a consumer over ICI, and the order check's own test (a scheduler that ignores busy
devices)."""

from __future__ import annotations

import threading

import jax
import numpy as np

import pwkernel as pw
from pwkernel.runtime.scheduler import GangScheduler
from tests.helpers.gang_order import LaunchLog


def gate(entered: threading.Event, release: threading.Event, mesh=None):
    """A computation that signals when it runs, then holds its devices until released.

    On a multi-device ``mesh`` every device calls the host function itself (inside shard_map):
    a callback placed on one device would leave the others stuck in a collective, which XLA's
    CPU runtime aborts after a while."""

    def hold(x):
        entered.set()
        if not release.wait(60):
            raise TimeoutError("gate was never released")
        return x

    def held(x):
        return jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    if mesh is None:
        return held
    spec = jax.sharding.PartitionSpec(mesh.axis_names)
    return jax.shard_map(held, mesh=mesh, in_specs=spec, out_specs=spec)


def launch_beside_a_running_gate(ctl, log: LaunchLog):
    """Hold island 0's four devices with a gate, then call an unrelated computation on two of
    them. A correct scheduler queues it until the gate ends; one that ignores busy devices
    launches it at once (the gate opens at that launch, or once the call returns)."""
    quad, pair = ctl.slice(4, island=0), ctl.slice(2, island=0)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(gate(entered, release, quad.mesh), slice=quad, in_specs=pw.BATCH,
                       name="gate")(np.ones(4, np.float32))
    assert entered.wait(60)
    log.on_launch = lambda task: release.set()
    other = pw.function(lambda x: x + 1, slice=pair, name="other")(np.ones(2, np.float32))
    release.set()
    return held, other


def violations_with_the_device_check_off(monkeypatch, work=lambda ctl: None) -> list[str]:
    """A test of an order test: ``work`` runs beside a gate on a controller whose schedulers
    ignore busy devices (``_devices_free`` is True); what the order check reports."""
    log = LaunchLog().install(monkeypatch)
    monkeypatch.setattr(GangScheduler, "_devices_free", lambda self, t: True)
    with pw.Controller(islands=(4, 4)) as ctl:
        held, other = launch_beside_a_running_gate(ctl, log)
        work(ctl)
        held.result(timeout=60), other.result(timeout=60)
    return log.violations()


def overlapping_chain(ctl):
    """``g(f(v))`` where f's slice [0, 1] and g's slice [0, 3] share device 0: the transfer
    between them has a destination shard on the device that holds its source."""
    s_b = ctl.slice(2, island=0)
    ctl.slice(2, island=0), ctl.slice(3, island=0)  # push the next 2-device slice to [0, 3]
    s_e = ctl.slice(2, island=0)
    assert set(s_b.device_ids) & set(s_e.device_ids) and s_b.device_ids != s_e.device_ids
    f = pw.function(lambda x: x * 2, slice=s_b, name="f")
    g = pw.function(lambda x: x + 1, slice=s_e, name="g")
    return pw.program(lambda v: g(f(v)))


def make_programs(ctl):
    """The paper's Figure 2 program, plus a consumer on a second slice of island 0 (so the
    program moves data inside island 0 over ICI and between islands over DCN)."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    s2 = ctl.slice(2, island=0)
    a = pw.function(lambda x: x * 2, slice=s0)
    b = pw.function(lambda x: x + 1, slice=s1)
    c = pw.function(lambda x: x / 2, slice=s1)
    d = pw.function(lambda x: x - 1, slice=s2)

    @pw.program
    def fig2(v):
        x = a(v)
        return b(x), a(c(x)), d(x)

    @pw.program
    def local(v):
        return a(v)

    return fig2, local


def run(prog, n: int = 1) -> None:
    for _ in range(n):
        outs = prog(np.array([1.0, 2.0], dtype=np.float32))
        outs = outs if isinstance(outs, tuple) else (outs,)
        for out in outs:
            out.result()
        assert outs[0].run.wait(60)

"""A device pool shared by several controllers (tenants), on a real Ray cluster on 127.0.0.1
with token authentication: island actors with one gang scheduler each (``tenancy.py``),
tenants in this process and in processes of their own.

One head and one pool (2 islands x 4 devices) for the module; the tests run in file order.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
import ray

import pwkernel as pw
from pwkernel.backends.ray import tenancy
from pwkernel.bench.figure2 import figure2
from tests.helpers.pool import (
    TIMEOUT,
    Tenant,
    island_changes,
    renewing,
    running_pool,
    wait_until,
)

NAME = "test"
LEASE = 4.0


@pytest.fixture(scope="module")
def pool():
    with running_pool(NAME, (4, 4), LEASE) as head:
        yield head


def islands() -> list:
    return tenancy.find_islands(NAME)


def statuses() -> list[dict]:
    return ray.get([a.pool_status.remote() for a in islands()], timeout=TIMEOUT)


def tenants() -> set[str]:
    return {t["name"] for s in statuses() for t in s["tenants"]}


def test_a_pool_is_detached_named_actors_that_refuse_a_second_start(pool):
    infos = ray.get([a.info.remote() for a in islands()])
    assert [(i["island"], i["size"], i["pool"]) for i in infos] == [(0, 4, NAME), (1, 4, NAME)]
    with pytest.raises(pw.DeviceSetupError, match="pool 'test' already has island actors"):
        tenancy.create_islands(NAME, (4, 4), "cpu")
    with pytest.raises(pw.DeviceSetupError, match="no pool named 'nope'.*pwkernel.pool start"):
        tenancy.find_islands("nope")
    with pytest.raises(pw.DeviceSetupError, match="is not 1 to 64 letters"):
        tenancy.namespace("no spaces")
    assert tenants() == set()


def test_the_pool_refuses_a_connection_without_its_token(pool):
    import subprocess
    import sys

    ask = ("from ray._raylet import GcsClient\n"
           f"GcsClient(address={pool.address!r}).internal_kv_get(b'x', None, timeout=10)\n")
    bare = {k: v for k, v in pool.env.items() if not k.startswith("RAY_AUTH")}
    for name, env, ok in (("without", dict(bare, RAY_AUTH_MODE="disabled"), False),
                          ("with", pool.env, True)):
        done = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True,
                              text=True, timeout=TIMEOUT)
        assert (done.returncode == 0) is ok, (name, done.stderr[-2000:])
        if not ok:
            assert "Authentication" in done.stderr or "Unauthenticated" in done.stderr


def test_a_controller_attaches_runs_programs_and_leaves_the_pool_running(pool):
    with pytest.raises(pw.DeviceSetupError, match=r"islands=\(2, 2\) but pool 'test' has "
                       r"islands of \(4, 4\)"):
        pw.Controller(backend="ray", address=pool.address, pool=NAME, islands=(2, 2))
    with pytest.raises(pw.DeviceSetupError, match="address=.* and ray_address=.* name two"):
        pw.Controller(backend="ray", address=pool.address, ray_address="127.0.0.1:1",
                      pool=NAME)
    with pytest.raises(ValueError, match="pool= is only for backend='ray'"):
        pw.Controller(pool=NAME)
    with pytest.raises(pw.DeviceSetupError, match="pool='elsewhere' needs the address"):
        pw.Controller(backend="ray", pool="elsewhere")
    with pytest.raises(pw.DeviceSetupError, match="tenant= and weight= name this controller"):
        pw.Controller(backend="ray", address=pool.address, weight=2)
    with pytest.raises(pw.DeviceSetupError, match="weight= .* must be a finite number > 0"):
        pw.Controller(backend="ray", address=pool.address, pool=NAME, weight=0)
    assert tenants() == set()
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="here")
    try:
        assert [len(i.devices) for i in ctl.islands] == [4, 4]
        f = figure2(ctl).f
        for mode in ("parallel", "sequential"):
            ctl.dispatch = mode
            y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
            np.testing.assert_array_equal(y.result(TIMEOUT), [3.0, 5.0, 7.0, 9.0])
            np.testing.assert_array_equal(z.result(TIMEOUT), [2.0, 4.0, 6.0, 8.0])
        view = ctl.executor.status()["pool"]
        assert view["name"] == NAME and [t["name"] for t in view["tenants"]] == ["here"]
        me = view["tenants"][0]
        assert me["me"] and me["bytes"] > 0 and me["device_seconds"] > 0
        assert set(me["devices"]) == {0, 1}
        del y, z
    finally:
        ctl.close()
    assert tenants() == set()  # close() unregistered: the pool forgot this tenant...
    assert all(s["bytes"] == 0 for s in statuses())  # ...and its buffers
    assert len(islands()) == 2  # the pool's actors live on


def test_a_pool_tenant_keeps_its_memory_budget_and_its_clients(pool):
    # The kernel's own scheduler still orders its own clients and holds its budget; the
    # island orders tenants.
    from tests.helpers.budget import MiB, check_fan_in_fails_and_says_who_holds_the_memory

    with pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="budget",
                       memory_budget=4 * MiB, policy="share") as ctl:
        check_fan_in_fails_and_says_who_holds_the_memory(ctl)
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1))
        with ctl.client("alice", weight=2):
            a = double(np.ones(4, np.float32))
        with ctl.client("bob"):
            b = double(a)
        assert b.result(TIMEOUT).tolist() == [4.0] * 4 and b.run.client == "bob"
    assert tenants() == set()


def test_a_tenant_cannot_read_or_free_another_tenants_buffers(pool):
    actor = islands()[0]
    a = ray.get(actor.register.remote("alice", 1.0))
    b = ray.get(actor.register.remote("bob", 1.0))
    assert a["secret"] != b["secret"] and len(a["secret"]) == 32
    layout = ((0, 1), (2,), ("x",), jax_spec())
    value = np.arange(4, dtype=np.float32)
    ray.get(actor.submit.remote(a["secret"], 0, [("put", 0, 7, value, layout)]))
    assert ray.get(actor.buffers.remote(a["secret"], 0)) == {7: 16}
    with pytest.raises(KeyError, match="buffer 7 is not on island 0"):
        ray.get(actor.fetch.remote(b["secret"], 7))
    ray.get(actor.submit.remote(b["secret"], 0, [("free", [7])]))  # bob's own id 7: none
    assert ray.get(actor.buffers.remote(b["secret"], 0)) == {}
    np.testing.assert_array_equal(ray.get(actor.fetch.remote(a["secret"], 7)), value)
    with pytest.raises(PermissionError, match="no tenant with this secret"):
        ray.get(actor.fetch.remote("0" * 32, 7))
    for t in (a, b):
        ray.get(actor.unregister.remote(t["secret"]))
    with pytest.raises(PermissionError, match="no tenant with this secret"):
        ray.get(actor.poll.remote(a["secret"], 0.0))


def test_a_recv_still_waiting_for_its_value_holds_back_only_its_own_tenant(pool):
    actor = islands()[0]
    a = ray.get(actor.register.remote("waits", 1.0))
    b = ray.get(actor.register.remote("goes", 1.0))
    layout = ((2, 3), (2,), ("x",), jax_spec())
    value = np.arange(4, dtype=np.float32)
    try:
        # a's next operation waits for a value from island 1 that no island has sent yet
        ray.get(actor.submit.remote(a["secret"], 0, [("recv", 0, 5, layout, 1, 0),
                                                      ("put", 1, 6, value, layout)]))
        ray.get(actor.submit.remote(b["secret"], 0, [("put", 0, 1, value, layout)]))
        assert [r["rid"] for r in ray.get(actor.poll.remote(b["secret"], 30))] == [0]
        status = {t["name"]: t for t in ray.get(actor.pool_status.remote())["tenants"]}
        assert status["waits"]["queued"] == 2 and status["goes"]["queued"] == 0
        assert ray.get(actor.poll.remote(a["secret"], 0.0)) == []
        ray.get(actor.deliver.remote(a["secret"], 5, value * 2, None, 0.0))  # it arrives
        got = []
        while len(got) < 2:
            got += ray.get(actor.poll.remote(a["secret"], TIMEOUT))
        assert [(r["rid"], r["ok"]) for r in got] == [(0, True), (1, True)]
        np.testing.assert_array_equal(ray.get(actor.fetch.remote(a["secret"], 5)), value * 2)
    finally:
        for t in (a, b):
            ray.get(actor.unregister.remote(t["secret"]))


def test_unregister_cancels_queued_work_and_frees_buffers_at_once(pool):
    actor = islands()[0]
    before = ray.get(actor.pool_status.remote())
    t = ray.get(actor.register.remote("leaves", 1.0))
    layout = ((0, 1), (2,), ("x",), jax_spec())
    big = np.ones(1 << 18, np.float32)
    ray.get(actor.submit.remote(t["secret"], 0, [("put", 0, 1, big, layout),
                                                  ("recv", 1, 2, layout, 1, 0),
                                                  ("put", 2, 3, big, layout)]))
    assert [r["rid"] for r in ray.get(actor.poll.remote(t["secret"], TIMEOUT))] == [0]
    status = ray.get(actor.pool_status.remote())
    assert status["queued"] == before["queued"] + 1  # the recv, waiting for its value
    assert status["bytes"] >= before["bytes"] + big.nbytes
    ray.get(actor.unregister.remote(t["secret"]))
    status = ray.get(actor.pool_status.remote())
    assert status["queued"] == before["queued"] and status["bytes"] == before["bytes"]
    assert "leaves" not in {x["name"] for x in status["tenants"]}


def test_the_island_policy_is_share_by_default_and_fifo_on_request(pool):
    actor = islands()[1]
    assert ray.get(actor.pool_status.remote())["policy"] == "share"
    assert ray.get(actor.policy.remote("fifo")) == "fifo"
    with pytest.raises(ValueError, match="unknown scheduling policy 'fair'"):
        ray.get(actor.policy.remote("fair"))
    assert ray.get(actor.policy.remote("share")) == "share"
    status = ray.get(actor.pool_status.remote())
    assert {"island", "devices", "platform", "pid", "tenants", "bytes", "launches"} <= set(
        status)


def jax_spec():
    from jax.sharding import PartitionSpec as P

    return P("x")


def gang_violations(records: list[dict]) -> list[str]:
    """Two tenants' computations whose launch-to-end intervals overlap on a shared device."""
    computes = [r for r in records if r["kind"] == "compute"]
    out = []
    for r, s in itertools.combinations(computes, 2):
        if r["tenant"] != s["tenant"] and set(r["devices"]) & set(s["devices"]) and (
                r["t_launch"] < s["t_end"] and s["t_launch"] < r["t_end"]):
            out.append(f"{r['tenant']} #{r['seq']} and {s['tenant']} #{s['seq']}")
    return out


def test_three_tenants_collectives_on_overlapping_slices_in_one_order(pool):
    since = [s["launches"] for s in statuses()]
    layouts = {"t0": ("0,1,2,3", "4,5"), "t1": ("2,3", "5,6"), "t2": ("1,2", "6,7")}
    procs = [Tenant(pool, NAME, "collectives", name, d0=d0, d1=d1, steps=8)
             for name, (d0, d1) in layouts.items()]
    try:
        for t in procs:
            assert t.line()["ready"] == t.name
        for t in procs:
            t.go()
        for t in procs:
            exact = t.finish()["exact"]
            assert exact == [True] * 8, (t.name, exact)
    finally:
        for t in procs:
            t.kill()
    for actor, start in zip(islands(), since, strict=True):
        log = ray.get(actor.launches.remote(start))
        assert [r["seq"] for r in log] == list(range(start, start + len(log)))
        assert all(r["ok"] for r in log), [r for r in log if not r["ok"]]
        launched = [r["t_launch"] for r in log]
        assert launched == sorted(launched)  # one issue order
        computes = [r for r in log if r["kind"] == "compute"]
        assert {r["tenant"] for r in computes} == set(layouts)
        assert gang_violations(log) == []
    wait_until(lambda: tenants() == set(), TIMEOUT, "the tenants unregistered",
               island_changes(islands()[0]))


def exported_step(size: int) -> bytes:
    """A psum step over 4 devices, exported for a pool island's CPU devices (what a
    controller sends in a ``run`` operation)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    body = jax.shard_map(lambda b: jnp.tanh(b @ b.T) * 0.5 + jax.lax.psum(b, "x") * 0.01,
                         mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    jitted = jax.jit(lambda b: (body(b),), in_shardings=(sharding,),  # outputs: a tuple
                     out_shardings=(sharding,))
    struct = jax.ShapeDtypeStruct((4 * size, size), np.float32, sharding=sharding)
    return bytes(jax.export.export(jitted, platforms=["cpu"])(struct).serialize())


def chain(blob: bytes | None, first: int, steps: int, rid: int) -> list[tuple]:
    """``steps`` runs of the step, each reading the buffer the one before wrote (freed once
    read: a launched computation keeps its inputs)."""
    layout = ((0, 1, 2, 3), (4,), ("x",), jax_spec())
    ops = []
    for k in range(first, first + steps):
        ops += [("run", rid, "step", blob, [layout], [layout], [k], [k + 1], "step", "c"),
                ("free", [k])]
        blob, rid = None, rid + 1
    return ops


def records(actor, secret: str, count: int) -> list[dict]:
    got: list[dict] = []
    while len(got) < count:
        more = ray.get(actor.poll.remote(secret, TIMEOUT))
        assert more, f"{len(got)} of {count} records in {TIMEOUT} s"
        got += more
    assert all(r["ok"] for r in got), [r for r in got if not r["ok"]]
    return got


def test_share_gives_each_tenant_its_weights_share_while_all_are_busy(pool):
    """Two tenants with weights 1 and 2, each with a long chain of computations on the same
    4 devices queued at the island at once (so neither is ever idle there): the island's
    device time splits 1:2 between them, measured from its own launch log."""
    actor = islands()[0]
    size, steps = 256, 300
    blob = exported_step(size)
    layout = ((0, 1, 2, 3), (4,), ("x",), jax_spec())
    weights = {"light": 1.0, "heavy": 2.0}
    secrets = {n: ray.get(actor.register.remote(n, w))["secret"] for n, w in weights.items()}
    try:
        with renewing(actor, list(secrets.values())):  # (read one tenant at a time)
            # Each compiles and runs the step once, then a short chain once that has ended: the
            # island's estimate of a step is then what a step in a chain takes (a launch is
            # charged its estimate until it ends), and neither tenant starts behind the other.
            for secret in secrets.values():
                start = np.ones((4 * size, size), np.float32)
                ray.get(actor.submit.remote(secret, 0, [("put", 0, 0, start, layout),
                                                        *chain(blob, 0, 1, 1)]))
                records(actor, secret, 2)
                ray.get(actor.submit.remote(secret, 1, chain(None, 1, 8, 2)))
                records(actor, secret, 8)
            since = ray.get(actor.pool_status.remote())["launches"]
            for secret in secrets.values():
                actor.submit.remote(secret, 2, chain(None, 9, steps, 10))
            for secret in secrets.values():
                records(actor, secret, steps)
            log = [r for r in ray.get(actor.launches.remote(since)) if r["kind"] == "compute"]
    finally:
        for secret in secrets.values():
            ray.get(actor.unregister.remote(secret))
    both = [r for r in log if set(weights) <= set(r["busy"])]
    assert len(both) > steps, f"only {len(both)} of {len(log)} launches found both busy"
    first = min(r["t_launch"] for r in both)
    last = max(r["t_end"] for r in both)
    seconds = dict.fromkeys(weights, 0.0)
    for r in both:
        seconds[r["tenant"]] += min(r["t_end"], last) - max(r["t_start"], first)
    share = seconds["heavy"] / sum(seconds.values())
    assert abs(share - 2 / 3) < 0.02, (share, seconds)


def test_a_killed_tenant_is_dropped_and_its_buffers_freed_while_others_carry_on(pool):
    baseline = sum(s["bytes"] for s in statuses())
    held = Tenant(pool, NAME, "hold", "doomed")
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="survivor")
    try:
        holding = held.line()["holding"]
        assert sum(s["bytes"] for s in statuses()) >= baseline + holding
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0))
        held.kill()  # kill -9: nothing unregisters it
        for i in range(3):
            assert double(np.full(4, float(i))).result(TIMEOUT).tolist() == [2.0 * i] * 4
        wait_until(lambda: "doomed" not in tenants(), LEASE + 10, "the lease to expire",
                   island_changes(islands()[0]))
        assert double(np.ones(4)).result(TIMEOUT).tolist() == [2.0] * 4
    finally:
        held.kill()
        ctl.close()
    wait_until(lambda: sum(s["bytes"] for s in statuses()) == baseline, 10,
               "the island's bytes back at the baseline", island_changes(islands()[0]))


def test_tenants_that_send_the_same_computation_share_one_compiled_executable(pool):
    # Each tenant's executables were compiled for it alone and dropped when it left: every
    # attach of the same notebook compiled its programs again (0.13 s each here), and the
    # island's memory grew by some 14 KB that XLA keeps per compile, 200 attaches or 2,000.
    def watch(actor) -> None:  # in the island actor: count its compiles from now on
        import jax

        seen = actor.__dict__.setdefault("test_compiles", [])
        if not seen:
            seen.append(0)
            event = "/jax/core/compile/backend_compile_duration"

            def listen(name, _seconds, **_) -> None:
                if name == event:
                    seen[0] += 1

            jax.monitoring.register_event_duration_secs_listener(listen)

    def compiles() -> int:
        return ray.get(islands()[1].__ray_call__.remote(lambda a: a.test_compiles[0]),
                       timeout=TIMEOUT)

    def attach(tenant: str):
        return pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant=tenant)

    def run(ctl, x: float) -> float:
        step = pw.function(lambda v: v * 3 + 1, slice=ctl.slice(2, island=1))
        return step(np.full(4, x, np.float32)).result(TIMEOUT).tolist()

    ray.get(islands()[1].__ray_call__.remote(watch), timeout=TIMEOUT)
    kept, before = statuses()[1]["executables"], compiles()
    first, second = attach("first"), attach("second")  # two notebooks of the same code
    try:
        assert run(first, 1.0) == [4.0] * 4
        made = compiles() - before
        assert made > 0 and statuses()[1]["executables"] == kept + made
        assert run(second, 2.0) == [7.0] * 4
        assert compiles() - before == made  # the second tenant uses the first's
    finally:
        first.close()
        second.close()
    with attach("again") as again:  # after both left: kept for the next one
        assert run(again, 0.0) == [1.0] * 4
    assert compiles() - before == made
    assert statuses()[1]["executables"] == kept + made


def test_a_controller_whose_watcher_is_held_keeps_its_lease(pool):
    """Something holds island 0's watcher thread (where the island's futures resolve) for
    two leases (a runtime hook here: a user's done-callback runs on a thread of its own): the
    controller's keep-alive thread renews the lease meanwhile, so the pool keeps the tenant,
    and its work runs on afterwards."""
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="busy")
    held, release = threading.Event(), threading.Event()

    def hold(_) -> None:
        if threading.current_thread().name.startswith("pw-ray-island0"):
            held.set()
            release.wait(TIMEOUT)

    def island0_tenants() -> set[str]:
        return {t["name"] for t in statuses()[0]["tenants"]}

    try:
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0))
        for i in range(20):  # until one resolves on the watcher, not at once on this thread
            double(np.full(4, float(i))).hook(hold)
            if held.is_set():
                break
        assert held.wait(TIMEOUT)
        until = time.monotonic() + 2 * LEASE
        wait_until(lambda: time.monotonic() > until or "busy" not in island0_tenants(),
                   2 * LEASE + TIMEOUT, "two leases, or the tenant dropped",
                   island_changes(islands()[0]))
        assert "busy" in island0_tenants()
        release.set()
        assert double(np.full(4, 3.0)).result(TIMEOUT).tolist() == [6.0] * 4
    finally:
        release.set()
        ctl.close()


def test_an_island_stopped_for_two_leases_keeps_its_tenants(pool):
    """The island's process itself does not run for two leases (SIGSTOP, as a machine
    starved of CPU or swapping would stop it): its tenants' calls waited for it, so that is no
    silence of theirs, and when it runs again it keeps them."""
    import os
    import signal

    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="patient")
    try:
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0))
        assert double(np.ones(4)).result(TIMEOUT).tolist() == [2.0] * 4
        pid = ray.get(islands()[0].__ray_call__.remote(lambda actor: os.getpid()), timeout=TIMEOUT)
        os.kill(pid, signal.SIGSTOP)
        try:  # the stop's length is what the test is about, not a wait for something to happen
            threading.Event().wait(2 * LEASE)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert double(np.full(4, 5.0)).result(TIMEOUT).tolist() == [10.0] * 4
        assert "patient" in {t["name"] for t in statuses()[0]["tenants"]}
    finally:
        ctl.close()


def test_a_lost_island_fails_only_the_futures_that_needed_it(pool, caplog):
    """The last test of the module: it kills island 1's actor (the pool's teardown ends the
    rest). Work that needs island 1 fails with IslandLostError; island 0 carries on. Reading
    the other tenants' work finds it dead and marks it lost without a warning of Ray's text
    (the pool's KeepAlive, stopped here so that it is not first to see, would say it)."""
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="unlucky")
    try:
        on0 = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0))
        on1 = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=1))
        x = np.arange(4.0, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(on1(x).result()), x + 1)
        ctl.executor.keepalive.close()
        doomed = islands()[1]
        ray.kill(doomed, no_restart=True)  # the island's process dies
        gone_by = time.monotonic() + TIMEOUT  # (ray.kill is asynchronous: a call made at
        while True:                           # once may still be answered)
            try:
                ray.get(doomed.info.remote(), timeout=TIMEOUT)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < gone_by, "the killed island still answers"
        ctl.executor.others.pull()
        assert ctl.executor.hosts[1].lost
        assert not [r for r in caplog.records if "launch log" in r.getMessage()]
        with pytest.raises(pw.IslandLostError):
            on1(x).result(timeout=TIMEOUT)
        np.testing.assert_array_equal(np.asarray(on0(x).result(timeout=TIMEOUT)), x * 2)
    finally:
        ctl.close()

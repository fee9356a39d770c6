"""Attaching to a pool, on a real one (``tests/helpers/pool.py``: a Ray head of our own with
the pool's island actors, this process connected to it): tenants of one name, a wrong
cluster, and an island that died. One pool for the module; the last test kills an island."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest
import ray

import pwkernel as pw
from pwkernel.backends.ray import poolfile, tenancy
from pwkernel.notebook.tenants import tenant_rows
from pwkernel.pool import head as pool_head
from pwkernel.pool import report, service
from tests.helpers.pool import TIMEOUT, running_pool

NAME = "attach"


@pytest.fixture(scope="module")
def pool():
    with running_pool(NAME, (2, 2, 2), 4.0) as head:
        yield head


def test_attaching_to_another_cluster_while_connected_says_so(pool):
    """One Ray connection per process: a pool elsewhere is refused for what it is."""
    elsewhere = f"127.0.0.1:{pool_head.free_port()}"
    with pytest.raises(pw.DeviceSetupError) as caught:
        pw.Controller(backend="ray", address=elsewhere, pool="other")
    message = str(caught.value)
    assert f"connected to the Ray cluster at {pool.address}" in message
    assert f"cannot join pool 'other' at {elsewhere}" in message
    assert "ctl.close()" in message and "no pool named" not in message
    # the cluster it is connected to, by another spelling of its address, is fine
    same = pool.address.replace("127.0.0.1", "localhost")
    with pw.Controller(backend="ray", address=same, pool=NAME, tenant="same") as ctl:
        assert [len(i.devices) for i in ctl.islands] == [2, 2, 2]


def test_tenants_of_one_name_are_rows_of_their_own(pool):
    a = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="twin")
    try:
        b = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="twin")
        try:
            double = pw.function(lambda x: x * 2, slice=b.slice(2, island=2))
            assert double(np.ones(4)).result(TIMEOUT).tolist() == [2.0] * 4
            rows = a.executor.status()["pool"]["tenants"]
            assert [t["name"] for t in rows] == ["twin", "twin"]
            assert len({t["id"] for t in rows}) == 2
            assert sorted(t["me"] for t in rows) == [False, True]  # a's view: itself once
            busy = next(t for t in rows if not t["me"])  # b, by its work on island 2
            assert busy["devices"] == {2: [0, 1]} and busy["device_seconds"] > 0
            shown = [r[0] for r in tenant_rows({"tenants": rows})]
            assert len(set(shown)) == 2 and all(s.startswith("twin [") for s in shown)
        finally:
            b.close()
        assert [t["name"] for t in a.executor.status()["pool"]["tenants"]] == ["twin"]
    finally:
        a.close()


QUIET = textwrap.dedent("""
    import gc, sys
    import numpy as np
    import pwkernel as pw
    for _ in range(3):
        ctl = pw.Controller(backend="ray", address=sys.argv[1], pool=sys.argv[2], tenant="q")
        f = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=0))
        g = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1))
        values = [g(f(np.full(4, float(i)))) for i in range(20)]
        values[-1].result(120)
        last = f(np.zeros(500_000, dtype=np.float32))  # in flight: a big put, then close
        del values
        gc.collect()  # their frees are pending as the controller closes
        ctl.close()
    print("closed")
""")


def test_a_slice_larger_than_the_pools_islands_says_how_to_get_a_larger_pool(pool):
    """A tenant's islands are the pool's: the fix is a pool with larger islands (or more of
    them), not ``pw.Controller(islands=...)`` or ``PWKERNEL_ISLANDS``, which an attached
    controller refuses or ignores (before, the error offered those)."""
    with pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="big") as ctl:
        for ask in (lambda: ctl.slice(3, island=0), lambda: ctl.slice(5),
                    lambda: ctl.slice(2, island=4)):
            with pytest.raises(pw.SliceError) as caught:
                ask()
            message = str(caught.value)
            assert f"pool {NAME!r}" in message and "python -m pwkernel.pool start" in message
            assert "PWKERNEL_ISLANDS" not in message and "Controller(islands=" not in message
        assert ctl.slice(2, island=2).devices  # (what fits still does)


def test_closing_is_quiet_and_frees_nothing_after_unregistering(pool):
    """A tenant that closes with frees pending: nothing reaches an island after the tenant
    unregistered (which Ray printed as a TenantRefused traceback)."""
    done = subprocess.run([sys.executable, "-c", QUIET, pool.address, NAME], env=pool.env,
                          capture_output=True, text=True, timeout=4 * TIMEOUT)
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr[-3000:]
    for word in ("TenantRefused", "Unhandled error", "Traceback"):
        assert word not in done.stderr, done.stderr[-3000:]


def test_a_tenant_the_pool_dropped_is_told_in_the_pools_own_words(pool):
    """A tenant dropped by its lease (a stalled process): its next call fails with the pool's
    ``TenantRefused`` (a PermissionError) and its message, not a RuntimeError wrapping Ray's
    traceback of the actor call."""
    with pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="late") as ctl:
        f = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=0))
        assert f(np.zeros(4)).result(TIMEOUT).tolist() == [1.0] * 4
        actor = ctl.executor.hosts[0].actor
        ray.get(actor.handle.unregister.remote(actor.secret, -1), timeout=TIMEOUT)  # the drop
        with pytest.raises(PermissionError, match="no tenant with this secret") as caught:
            f(np.zeros(4)).result(TIMEOUT)
        assert "ray::" not in str(caught.value) and "\x1b[" not in str(caught.value)


def test_an_unregister_that_overtakes_a_message_waits_for_it(pool):
    """Ray may run a threaded actor's calls out of order: an unregister that names the last
    message sent (``after``) waits for it, so that message is taken, not refused."""
    actor = tenancy.find_islands(NAME)[0]
    secret = ray.get(actor.register.remote("leaving", 1.0), timeout=TIMEOUT)["secret"]
    leaving = actor.unregister.remote(secret, 0)  # sent first: it runs before message 0
    ray.get(actor.submit.remote(secret, 0, [("free", [])]), timeout=TIMEOUT)  # not refused
    ray.get(leaving, timeout=TIMEOUT)
    status = ray.get(actor.pool_status.remote(), timeout=TIMEOUT)
    assert "leaving" not in {t["name"] for t in status["tenants"]}


def test_closing_drops_the_work_the_island_has_not_launched(pool):
    """``close()`` with a chain of computations queued on a pool's island: the island drops
    what it has not launched (it ran all of them first, holding the devices other tenants
    wait for, and the closing kernel with them), and their futures say they were stopped."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from tests.helpers.pool import island_changes, wait_until

    def steps(x):  # a few tenths of a second on this machine's cores
        return jax.lax.fori_loop(0, 20, lambda i, x: jnp.tanh(x @ x) * 0.5, x)

    actor = tenancy.find_islands(NAME)[0]
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="leaver")
    try:
        mine = ctl.executor.hosts[0].tenant_id
        f = pw.function(steps, slice=ctl.slice(2, island=0), in_specs=P(), out_specs=P())
        x = f(np.ones((384, 384), np.float32))
        x.result(TIMEOUT)  # compiled, and its upload done
        since = ray.get(actor.pool_status.remote(), timeout=TIMEOUT)["launches"]
        for _ in range(12):
            x = f(x)

        def held() -> bool:  # all 12 at the island (queued, or launched since), some queued
            rows = ray.get(actor.pool_status.remote(), timeout=TIMEOUT)["tenants"]
            queued = sum(r["queued"] for r in rows if r["tenant"] == mine)
            launched = sum(e["tenant_id"] == mine and e["kind"] == "compute"
                           for e in ray.get(actor.launches.remote(since), timeout=TIMEOUT))
            return queued > 0 and queued + launched >= 12  # (on a loaded machine the first
            #                                                may end before the last arrives)
        wait_until(held, TIMEOUT, "the island holds the 12 computations", island_changes(actor))
    finally:
        ctl.close()
    ran = [e for e in ray.get(actor.launches.remote(since), timeout=TIMEOUT)
           if e["tenant_id"] == mine and e["kind"] == "compute"]
    assert len(ran) < 12, f"all {len(ran)} ran before the tenant left"
    with pytest.raises(pw.CancelledError, match="stopped by ctl.close()"):
        x.result(TIMEOUT)
    status = ray.get(actor.pool_status.remote(), timeout=TIMEOUT)
    assert "leaver" not in {t["name"] for t in status["tenants"]}


def test_a_tenants_bytes_leave_out_what_its_steps_donated(pool):
    """A training step donates its state: the island's buffers of it are gone at once, while
    the controller frees their ids later (when the old state's futures go). The tenant's bytes
    in the pool's status counted them until then (a training tenant showed many times what it
    held, more than the whole island)."""
    with pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="donor") as ctl:
        bump = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=1), donate_argnums=0)
        old = pw.function(lambda: jnp.zeros(250_000, jnp.float32), slice=ctl.slice(2, island=1))()
        new = bump(old)  # ``old`` stays referenced here: its id is not freed yet
        assert float(new[0]) == 1.0
        actor = ctl.executor.hosts[1].actor.handle
        status = ray.get(actor.pool_status.remote(), timeout=TIMEOUT)
        [mine] = [t for t in status["tenants"] if t["name"] == "donor"]
        assert mine["bytes"] == 1_000_000, mine  # ``new``'s alone
        assert old.state is pw.FutureState.DONE  # (held to the end)


def test_a_dead_island_is_shown_lost_and_the_others_keep_their_numbers(pool, tmp_path,
                                                                       monkeypatch):
    """The last test of the module: island 1's actor dies."""
    monkeypatch.setenv(poolfile.ENV, str(tmp_path))
    poolfile.save({"name": NAME, "address": pool.address, "token_path": str(pool.token_path),
                   "islands": [2, 2, 2], "platform": "cpu", "lease": 4.0,
                   "started_cluster": False, "session_dir": None, "temp_dir": None,
                   "pids": [], "started": time.time()})
    ray.kill(tenancy.find_islands(NAME)[1], no_restart=True)
    with pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="late") as ctl:
        assert [len(i.devices) for i in ctl.islands] == [2, 2, 2]
        on2 = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=2))
        on1 = pw.function(lambda x: x + 1, slice=ctl.slice(2, island=1))
        assert on2(np.zeros(4)).result(TIMEOUT).tolist() == [1.0] * 4
        with pytest.raises(pw.IslandLostError):
            on1(np.zeros(4)).result(TIMEOUT)
        view = ctl.executor.status()["pool"]
        assert [(i["island"], i.get("lost", False)) for i in view["islands"]] == [
            (0, False), (1, True), (2, False)]
        me = next(t for t in view["tenants"] if t["me"])
        assert me["devices"] == {2: [0, 1]}  # its work ran on island 2's actor
        st = service.status(NAME)  # the command line's view
        assert [(i["island"], i.get("lost", False)) for i in st["islands"]] == [
            (0, False), (1, True), (2, False)]
        text = report.status_text(st)
        assert any(line.split()[:3] == ["1", "2", "lost"] for line in text.splitlines())

"""Tenancy you can see: a controller in a pool (tenant ``alice``, this process) sees the pool's
other tenant (``bob``, a process of its own) in its snapshot, its trace, its schedule view and
its sidebar payload. A real Ray cluster on 127.0.0.1 with token authentication, the pool's
island actors on it (``tests/helpers/pool.py``), real programs on both sides.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.ray.others import IslandLog
from pwkernel.notebook import comm
from pwkernel.notebook.usage import Utilization
from tests.helpers.pool import TIMEOUT, Tenant, running_pool, wait_until

NAME = "views"


@pytest.fixture(scope="module")
def pool():
    with running_pool(NAME, (4, 4), lease=4.0) as head:
        yield head


def test_a_tenant_sees_the_other_tenant_in_its_snapshot_trace_view_and_sidebar(pool):
    t_begin = time.perf_counter()
    ctl = pw.Controller(backend="ray", address=pool.address, pool=NAME, tenant="alice")
    bob = Tenant(pool, NAME, "collectives", "bob", d0="0,1,2,3", d1="4,5", steps=4)
    try:
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0), name="double")
        assert double(np.ones(4)).result(TIMEOUT).tolist() == [2.0] * 4
        assert bob.line()["ready"] == "bob"  # attached (both islands) and compiled

        pool_view = ctl.snapshot().pool
        assert pool_view is not None and pool_view.name == NAME
        assert {t.name: t.me for t in pool_view.tenants} == {"alice": True, "bob": False}
        assert pool_view.me.name == "alice" and [t.name for t in pool_view.others] == ["bob"]
        assert pool_view.me.slices == {0: (0, 1)} and pool_view.me.device_seconds > 0
        assert set(pool_view.others[0].slices) == {0, 1}  # its compile run used both
        status = ctl.status()["pool"]
        assert {t["name"]: t["me"] for t in status["tenants"]} == {"alice": True, "bob": False}
        tenants = comm.status_message(ctl)["data"]["pool"]["tenants"]
        assert {t["name"]: (t["me"], bool(t["color"])) for t in tenants} == {
            "alice": (True, False), "bob": (False, True)}
        assert next(t for t in tenants if t["name"] == "bob")["devices"] == [0, 1, 2, 3, 4, 5]

        bob.go()
        assert bob.finish()["exact"] == [True] * 4  # it ran and left the pool

        def bobs() -> list:  # the pull runs every half second: wait for all of bob's work
            ctl.executor.status()  # (and at once on a status read)
            got = [e for e in ctl.trace.events() if e.tenant == "bob"]
            return got if len(got) >= 3 * 5 else []  # 3 computations per run, 5 runs

        theirs = wait_until(bobs, TIMEOUT, "bob's computations in alice's trace",
                            lambda left: ctl.trace.wait_for(ctl.trace.next_index + 1, left))
        assert {e.name for e in theirs} == {"psum-bob", "gather-bob"}
        assert {(e.program, e.client, e.program_id, e.kind) for e in theirs} == {
            ("bob", "bob/default", -1, "compute")}
        on = {n: {(e.island, e.devices) for e in theirs if e.name == n} for n in
              ("psum-bob", "gather-bob")}
        assert on == {"psum-bob": {(0, (0, 1, 2, 3))}, "gather-bob": {(1, (4, 5))}}
        t_now = time.perf_counter()
        # on alice's clock: inside the test, each computation after its launch there
        assert all(t_begin < e.t_submit <= e.t_start <= e.t_end < t_now for e in theirs)
        assert all(e.status == "ok" for e in theirs)
        mine = [e for e in ctl.trace.events() if not e.tenant]
        assert any(e.name == "double" for e in mine)
        assert not [e for e in ctl.trace.events() if e.tenant == "alice"]  # never twice
        assert len({(e.name, e.island, e.t_start) for e in theirs}) == len(theirs)

        view = pw.ScheduleView(ctl, live=False)
        try:
            rows = view.decoded(view.others)
            assert set(rows["tenant"]) == {"bob"} and set(rows["client"]) == {"bob/default"}
            assert len(rows["tenant"]) == sum(len(e.devices) for e in theirs)
            assert set(rows["device"]) == {0, 1, 2, 3, 4, 5}
            assert "bob" not in view.decoded()["tenant"] and "double" in view.decoded()["name"]
            assert list(view.tenants) == ["bob"] and "other tenants:" in view.legend.value
            assert view.figure.select_one({"name": "others"}).data_source is view.others
        finally:
            view.close()

        data = comm.status_message(ctl, Utilization(window=3600.0))["data"]
        recent = data["pool"]["recent"]
        assert recent and {r["tenant"] for r in recent} == {"bob"}
        assert {r["name"] for r in recent} == {"psum-bob", "gather-bob"}
        assert {r["client"] for r in recent} == {"bob/default"}
        devices = {d["id"]: d for d in data["devices"]}
        assert set(devices[0]["others"]) == {"bob"} and devices[6]["others"] == {}
        assert [t["name"] for t in data["pool"]["tenants"]] == ["alice"]  # bob has left
    finally:
        bob.kill()
        ctl.close()
    assert "pw-ray-others" not in {t.name for t in threading.enumerate()}  # the pull stopped


def test_the_launch_log_is_read_on_from_its_first_entry_not_ended():
    class Host:
        tenant_id, generation = 7, 0

    log = IslandLog(Host(), (10, 11, 12, 13))

    def entry(seq, tenant_id, ended=True, kind="compute"):
        return {"seq": seq, "tenant_id": tenant_id, "kind": kind,
                "t_end": 1.0 if ended else None}

    first = [entry(0, 3), entry(1, 7), entry(2, 3, ended=False), entry(3, 3),
             entry(4, 3, kind="put")]
    assert [e["seq"] for e in log.take(first)] == [0, 3]  # not its own, not a copy
    assert log.since == 2  # entry 2 has not ended: read again from there
    again = [entry(2, 3), entry(3, 3), entry(4, 3, kind="put"), entry(5, 3)]
    assert [e["seq"] for e in log.take(again)] == [2, 5]  # 3 was taken already
    assert log.since == 6 and log.seen == set()
    assert [e["seq"] for e in log.take([entry(9, 3)])] == [9]  # the island dropped 6..8
    assert log.since == 10

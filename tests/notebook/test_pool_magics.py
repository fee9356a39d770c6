"""``%pathways attach ray --address A --pool NAME`` and the pool's tenants in
``%pathways status`` (the CLI and a real pool: tests/pool/)."""

from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError

import pwkernel as pw
from pwkernel.backends.local import LocalBackend
from pwkernel.notebook.magics import PathwaysMagics
from pwkernel.notebook.state import current
from pwkernel.notebook.tenants import PoolStatus
from tests.helpers.shell import run

TENANTS = [
    {"name": "host:11", "queued": 2, "running": 1, "device_seconds": 1.5, "share": 0.25,
     "bytes": 3072, "devices": [0, 1, 2, 3]},
    {"name": "host:12", "queued": 0, "running": 0, "device_seconds": 4.5, "share": 0.75,
     "bytes": 0, "devices": [0, 2]},
]


class PoolTenantStandIn(LocalBackend):
    """This process's devices, reporting what the Ray backend reports for a tenant of a
    pool: ``status()["pool"]`` in the shared design's shape (the real one needs pool-core's
    island actors; tests/pool/ attaches to a real pool)."""

    name = "ray"

    def status(self, island=None):
        if island is not None:
            return super().status(island)
        return {"token_auth": True, "islands": {},
                "pool": {"name": "class", "tenant": "host:11", "tenants": TENANTS}}


def test_attach_takes_a_pool_only_through_ray(ip):
    with pytest.raises(UsageError, match="attach local takes no --pool.*attach ray --address A "
                                         "--pool NAME"):
        run(ip, "%pathways attach local --pool class")
    with pytest.raises(UsageError, match="pool name 'a/b' is not 1 to 64 letters"):
        run(ip, "%pathways attach ray --address 127.0.0.1:1 --pool a/b")
    assert "--pool NAME" in PathwaysMagics.pathways.__doc__
    with pytest.raises(UsageError, match="--tenant and --weight name this kernel in a device "
                                         "pool; pass them with --pool"):
        run(ip, "%pathways attach ray --address 127.0.0.1:1 --tenant anna --weight 2")
    with pytest.raises(UsageError, match="--weight: expected a positive number"):
        run(ip, "%pathways attach ray --pool class --weight inf")


def test_a_pool_that_does_not_answer_is_a_usage_error(ip, tmp_path, monkeypatch):
    """--address keeps its meaning with --pool: a cluster where nothing listens fails at once
    (with the kernel's old controller closed: one Ray connection per process)."""
    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(tmp_path))
    from pwkernel.pool.head import free_port

    with pytest.raises(UsageError, match="%pathways attach ray: "):
        run(ip, f"%pathways attach ray --address 127.0.0.1:{free_port()} --pool class")


def test_status_lists_the_pools_tenants(ip):
    ctl = pw.Controller(backend=PoolTenantStandIn((2, 2)))
    current().adopt(ctl)
    try:
        status = run(ip, "%pathways status")
        assert isinstance(status, PoolStatus)
        text, page = repr(status), status._repr_html_()
        for part in ("Pool class: tenants", "host:11 (this kernel)", "host:12", "25%", "75%",
                     "3.0 KiB", "[0-3]", "[0, 2]", "1500.0 ms",
                     "Memory per device"):
            assert part in text and part in page, part
        lines = text.splitlines()
        row = next(line for line in lines if line.startswith("host:11"))
        assert row.split()[3:5] == ["2", "1"]  # queued, running
    finally:
        ctl.close()


def test_status_without_a_pool_is_unchanged(ip):
    status = run(ip, "%pathways status")
    assert not isinstance(status, PoolStatus) and "Pool" not in repr(status)


def test_this_kernel_is_marked_by_its_default_tenant_name(monkeypatch):
    """Without the pool's ``tenant`` key: the name a controller registers by default."""
    from pwkernel.notebook.tenants import own_name, tenant_rows

    monkeypatch.setenv("PWKERNEL_TENANT", "host:12")
    pool = {"name": "class", "tenants": TENANTS}
    assert own_name(pool) == "host:12"
    assert [r[0] for r in tenant_rows(pool, own_name(pool))] == ["host:11",
                                                                 "host:12 (this kernel)"]
    monkeypatch.delenv("PWKERNEL_TENANT")
    assert own_name(pool).endswith(f":{os.getpid()}")
    # The Ray backend's view: devices per island, and a `me` flag on this controller's row.
    view = {"name": "class", "tenants": [TENANTS[0] | {"me": False, "devices": {1: [0, 1]}},
                                         TENANTS[1] | {"me": True, "devices": {0: [0, 1, 2]}}]}
    rows = tenant_rows(view, own_name(view))
    assert [r[0] for r in rows] == ["host:11", "host:12 (this kernel)"]
    assert [r[-1] for r in rows] == ["island 1: [0, 1]", "island 0: [0-2]"]


def test_tenants_of_one_name_are_told_apart_by_their_ids():
    from pwkernel.notebook.tenants import tenant_rows

    pool = {"name": "class", "tenants": [TENANTS[0] | {"id": "a1", "me": True},
                                         TENANTS[0] | {"id": "b2", "me": False},
                                         TENANTS[1] | {"id": "c3", "me": False}]}
    assert [r[0] for r in tenant_rows(pool)] == ["host:11 [a1] (this kernel)", "host:11 [b2]",
                                                 "host:12"]

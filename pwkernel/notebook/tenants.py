"""What ``%pathways status`` shows of a device pool the kernel's controller is a tenant of.

A controller attached with ``pool=NAME`` (``%pathways attach ray --address A --pool NAME``)
reports the pool in its executor's status: ``ctl.executor.status()["pool"]`` is ``{"name",
"tenants": [{"name", "id", "queued", "running", "device_seconds", "share", "bytes",
"devices", "me"}]}`` (one entry per tenant: names may repeat, ids do not),
built by the Ray backend from the islands' own records (``share``: the tenant's fraction of
the pool's device time). ``PoolStatus`` is the usual status with one more section, the pool's
tenants, this kernel among them.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from ..runtime.units import device_ids, human_bytes, human_seconds
from .display import Status

TENANT_HEAD = ["tenant", "queued", "running", "device time", "share", "memory", "devices"]


def pool_of(ctl) -> dict[str, Any] | None:
    """The pool ``ctl`` is a tenant of, as its executor reports it, or None."""
    if ctl.closed or ctl.backend != "ray":
        return None
    facts = ctl.executor.status()  # the Ray backend's cluster view (no island given)
    pool = facts.get("pool") if isinstance(facts, dict) else None
    return pool if isinstance(pool, dict) else None


def own_name(pool: dict[str, Any]) -> str:
    """This process's tenant name: as the pool reports it (``tenant``), else the name a
    controller registers by default (``PWKERNEL_TENANT``, or ``host:pid``)."""
    return (pool.get("tenant") or os.environ.get("PWKERNEL_TENANT")
            or f"{socket.gethostname()}:{os.getpid()}")


def devices_text(devices: Any) -> str:
    """A tenant's device positions: a list, or per island (``{island: [positions]}``)."""
    if isinstance(devices, dict):
        return "; ".join(f"island {i}: {device_ids(d)}" for i, d in sorted(devices.items()))
    return device_ids(devices)


def tenant_rows(pool: dict[str, Any], me: str | None = None) -> list[list[Any]]:
    """One row per tenant; this kernel's (its ``me`` flag, or named ``me``) is marked. Two
    tenants may have one name (two kernels started with one ``PWKERNEL_TENANT``): their rows
    then show their ids too."""
    tenants = list(pool.get("tenants", ()))
    names = [t["name"] for t in tenants]
    return [[t["name"] + (f" [{t['id']}]" if names.count(t["name"]) > 1 and t.get("id") else "")
             + (" (this kernel)" if t.get("me", t["name"] == me) else ""),
             t["queued"], t["running"], human_seconds(t["device_seconds"]),
             f"{100 * t['share']:.0f}%", human_bytes(t["bytes"]), devices_text(t["devices"])]
            for t in tenants]


class PoolStatus(Status):
    """``Status`` and the pool's tenants."""

    def __init__(self, ctl, names: dict[int, str] | None = None, client: str = "default",
                 pool: dict[str, Any] | None = None):
        super().__init__(ctl, names, client)
        self.pool = pool or {}

    def _sections(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        me = own_name(self.pool)
        title = f"Pool {self.pool.get('name', '?')}: tenants"
        return super()._sections() + [(title, TENANT_HEAD, tenant_rows(self.pool, me))]


def status_view(ctl, names: dict[int, str], client: str) -> Status:
    """What ``%pathways status`` returns: with the pool's tenants when ``ctl`` is one."""
    pool = pool_of(ctl)
    if pool is None:
        return Status(ctl, names, client)
    return PoolStatus(ctl, names, client, pool)

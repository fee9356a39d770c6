"""The controller's side of a pool (``pw.Controller(backend="ray", pool=NAME)``).

The pool's island actors (``tenancy.py``) outlive every controller: this controller finds them
by name, registers on each as one tenant (its name ``host:pid``, or ``PWKERNEL_TENANT``, or
``tenant=``), and from then on every call it makes on an island carries the secret the island
gave it (``TenantActor``), so the rest of the Ray backend (``island.py``) talks to a pool's
island exactly as to its own. ``close()`` unregisters; it never kills the pool's actors.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import ray

from ...runtime.errors import DeviceSetupError
from .cluster import IslandHost, clock_offset
from .poolfile import check_name, load
from .tenancy import find_islands

#: the island actor's methods that act for one tenant: they take its secret first
TENANT_CALLS = frozenset({"submit", "poll", "buffers", "fetch", "executables", "source_lost",
                          "unregister", "renew"})
HEARTBEAT = 1.0  # s between renewals of this tenant's lease on each island (KeepAlive)


def tenant_name(given: str | None = None) -> str:
    """This controller's name as a tenant: ``given``, else ``PWKERNEL_TENANT``, else
    ``host:pid``."""
    name = given if given is not None else os.environ.get("PWKERNEL_TENANT") or \
        f"{socket.gethostname()}:{os.getpid()}"
    if not isinstance(name, str) or not name:
        raise DeviceSetupError(f"tenant= must be a non-empty string, got {name!r}.")
    return name


def pool_address(pool: str, address: str | None) -> str:
    """Where to find pool ``pool``: ``address``, else its pool file's (the pool's token is
    lent by ``cluster.connect(address, pool=pool)``)."""
    check_name(pool)
    if address is None:
        record = load(pool)
        if record is not None:
            address = record.get("address")
    if address is None:
        raise DeviceSetupError(
            f"pool={pool!r} needs the address of its Ray cluster: pass address='host:port' "
            f"(printed by `python -m pwkernel.pool start --name {pool}`), or start the pool on "
            "this machine so its pool file is found.")
    return address


class TenantActor:
    """A pool island's actor as one tenant sees it: ``TENANT_CALLS`` carry the secret."""

    def __init__(self, actor, secret: str):
        self.handle, self.secret = actor, secret

    def __getattr__(self, name: str):
        method = getattr(self.handle, name)
        return _WithSecret(method, self.secret) if name in TENANT_CALLS else method

    def __repr__(self) -> str:
        return f"TenantActor({self.handle!r})"


class _WithSecret:
    __slots__ = ("method", "secret")

    def __init__(self, method, secret: str):
        self.method, self.secret = method, secret

    def remote(self, *args):
        return self.method.remote(self.secret, *args)


class PoolIslandHost(IslandHost):
    """One island of a pool, for this controller: registers as a tenant on ``start`` and
    unregisters on ``kill`` (the actor stays: it is the pool's)."""

    def __init__(self, island: int, actor, info: dict, pool: str, tenant: str,
                 weight: float):
        platform = "gpu" if info["platform"] in ("gpu", "cuda") else "cpu"
        super().__init__(island, int(info["size"]), platform)
        self.pool, self.tenant, self.weight = pool, tenant, weight
        self.handle, self.tenant_id = actor, None

    def start(self) -> None:
        """Register (again, after ``reattach``: the pool's actor of that name now)."""
        if self.generation >= 0:
            actors = find_islands(self.pool)
            if self.island >= len(actors):
                raise DeviceSetupError(f"pool {self.pool!r} has no island {self.island} now.")
            self.handle = actors[self.island]
        try:
            reg = ray.get(self.handle.register.remote(self.tenant, self.weight), timeout=60)
            info = ray.get(self.handle.info.remote(), timeout=60)
        except ray.exceptions.RayError as e:
            raise DeviceSetupError(f"pool {self.pool!r}: island {self.island} did not take "
                                   f"this controller as a tenant: {e}") from None
        self.tenant_id = reg["tenant"]
        self.started(TenantActor(self.handle, reg["secret"]), info, clock_offset(self.handle))

    def release(self, actor: TenantActor) -> None:
        try:
            ray.get(actor.unregister.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - dropped already, or the island died
            pass

    def pool_status(self) -> dict | None:
        try:
            return ray.get(self.handle.pool_status.remote(), timeout=30)
        except ray.exceptions.RayError:
            return None


class KeepAlive:
    """Renews this controller's lease on each of its pool islands every ``HEARTBEAT`` seconds,
    from a thread that does nothing else: the pool drops a tenant silent for its lease (a
    killed notebook's memory comes back), so the renewals must not wait behind anything a
    busy controller does (a watcher thread resolving futures runs the user's done-callbacks;
    a poll can wait on a long computation). A refused renewal (the pool dropped this tenant)
    is logged once; an island whose actor died is marked lost, as a failed call marks it."""

    def __init__(self, hosts: list[PoolIslandHost]):
        self.hosts, self._stop, self._refused = hosts, threading.Event(), False
        self._thread = threading.Thread(target=self._loop, name="pw-pool-keepalive",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            for host in self.hosts:
                actor = host.actor
                if actor is None or host.lost:
                    continue
                try:
                    ray.get(actor.renew.remote(), timeout=10)
                except ray.exceptions.RayActorError:
                    host.mark_lost()
                except ray.exceptions.RayError as e:  # refused, or a timeout: say it once
                    if not self._refused:
                        logging.getLogger("pwkernel").warning("island %s: %s", host.island, e)
                    self._refused = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def attach(pool: str, sizes: tuple[int, ...] | None, tenant: str | None,
           weight: float | None) -> list[PoolIslandHost]:
    """Pool ``pool``'s islands on the connected cluster, as hosts not started yet; refuses
    ``sizes`` that differ from the pool's."""
    weight = 1.0 if weight is None else weight
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise DeviceSetupError(f"weight= (this tenant's share of the pool) must be a positive "
                               f"number, got {weight!r}.")
    name = tenant_name(tenant)
    actors = find_islands(pool)
    infos = ray.get([a.info.remote() for a in actors], timeout=60)
    have = tuple(int(i["size"]) for i in infos)
    if sizes is not None and tuple(sizes) != have:
        raise DeviceSetupError(f"islands={tuple(sizes)} but pool {pool!r} has islands of "
                               f"{have} devices; drop islands= (a pool brings its own) or pass "
                               f"islands={have}.")
    return [PoolIslandHost(i, a, info, pool, name, float(weight))
            for i, (a, info) in enumerate(zip(actors, infos, strict=True))]


def pool_view(pool: str, hosts: list[PoolIslandHost]) -> dict:
    """The pool's tenants over all its islands (``ctl.executor.status()["pool"]``): per tenant
    its queued and running operations, device time and share, bytes, and the device positions
    its work used on each island (``{island: [positions]}``); ``me`` marks this controller."""
    tenants: dict[str, dict] = {}
    islands = []
    mine = {(h.island, h.tenant_id) for h in hosts}
    for host in hosts:
        status = host.pool_status()
        if status is None:
            islands.append({"island": host.island, "lost": True})
            continue
        islands.append({k: status[k] for k in ("island", "devices", "platform", "pid",
                                               "bytes", "launches", "policy")})
        for row in status["tenants"]:
            t = tenants.setdefault(row["name"], {
                "name": row["name"], "queued": 0, "running": 0, "device_seconds": 0.0,
                "bytes": 0, "devices": {}, "me": False})
            for key in ("queued", "running", "device_seconds", "bytes"):
                t[key] += row[key]
            if row["devices"]:
                t["devices"][status["island"]] = row["devices"]
            t["me"] |= (status["island"], row["tenant"]) in mine
    total = sum(t["device_seconds"] for t in tenants.values())
    for t in tenants.values():
        t["share"] = t["device_seconds"] / total if total else 0.0
    return {"name": pool, "tenants": list(tenants.values()), "islands": islands}

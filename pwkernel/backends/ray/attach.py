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
import secrets
import socket
import threading

import numpy as np
import ray

from ...runtime.errors import DeviceSetupError
from . import cluster, poolfile
from .cluster import IslandHost, clock_offset
from .poolfile import check_name, load
from .tenancy import find_islands, named_islands, namespace

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


def tenant_weight(weight: float | None) -> float:
    """This controller's weight as a tenant: ``weight`` (default 1), a finite number > 0 (an
    infinite one would take every island for itself while it has work, as ``ctl.client``
    refuses for its clients)."""
    weight = 1.0 if weight is None else weight
    if (isinstance(weight, bool) or not isinstance(weight, int | float | np.number)
            or not 0 < weight < float("inf")):
        raise DeviceSetupError(f"weight= (this tenant's share of the pool) must be a finite "
                               f"number > 0, got {weight!r}; e.g. weight=2 for twice the "
                               "share of a weight-1 tenant.")
    return float(weight)


def pool_address(pool: str, address: str | None) -> str:
    """Where to find pool ``pool``: ``address``, else its pool file's (the pool's token is
    lent by ``cluster.connect(address, pool=pool)``)."""
    check_name(pool)
    holder = poolfile.start_holder(pool)
    if holder is not None:  # (its file, or its islands, may not be there yet)
        raise DeviceSetupError(poolfile.being_started(pool, holder))
    record = load(pool)
    if record is not None:
        return address if address is not None else record.get("address")
    here = poolfile.records()
    # a pool's cluster is its own: a pool here at that address has another name
    for other in here if address is not None else ():
        if other.get("address") and cluster.same_address(address, other["address"]):
            raise DeviceSetupError(
                f"no pool named {pool!r} is written down on this machine, and the pool at "
                f"{address} is {other['name']!r}: attach with pool={other['name']!r}.")
    if address is None:
        known = ", ".join(repr(r["name"]) for r in here) or "none"
        raise DeviceSetupError(
            f"pool={pool!r} needs the address of its Ray cluster: pass address='host:port' "
            f"(printed by `python -m pwkernel.pool start --name {pool}`), or start the pool on "
            f"this machine so its pool file is found (pools written down here: {known}).")
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


def island_actors(pool: str) -> dict[int, object]:
    """Pool ``pool``'s live island actors by island number: an island whose actor died is
    missing, and the others keep their numbers."""
    return {i: ray.get_actor(name, namespace=namespace(pool))
            for i, name in sorted(named_islands(pool).items())}


def lost_island(pool: str, island: int) -> DeviceSetupError:
    """The error for island ``island`` of ``pool`` whose actor died."""
    return DeviceSetupError(
        f"pool {pool!r} has no island {island} now: its actor died (the pool does not "
        f"restart islands). Stop and start the pool to have it again: python -m "
        f"pwkernel.pool stop --name {pool}, then start.")


class PoolIslandHost(IslandHost):
    """One island of a pool, for this controller: registers as a tenant on ``start`` and
    unregisters on ``kill`` (the actor stays: it is the pool's). ``actor`` None: the island
    was lost before this controller attached; it starts lost (its work fails)."""

    def __init__(self, island: int, actor, info: dict, pool: str, tenant: str,
                 weight: float, key: str = ""):
        platform = "gpu" if info["platform"] in ("gpu", "cuda") else "cpu"
        super().__init__(island, int(info["size"]), platform)
        self.pool, self.tenant, self.weight, self.key = pool, tenant, weight, key
        self.handle, self.tenant_id, self.first_info = actor, None, info

    def lost_advice(self) -> str:
        return (f"pool {self.pool!r} lost it (the pool was stopped, or its island died): "
                f"attach again once the pool runs (pw.Controller(backend='ray', "
                f"pool={self.pool!r}); python -m pwkernel.pool status --name {self.pool} says "
                "whether it does)")

    def start(self) -> None:
        """Register (again, after ``reattach``: the pool's actor of that name now)."""
        if self.generation >= 0:
            self.handle = island_actors(self.pool).get(self.island)
            if self.handle is None:
                raise lost_island(self.pool, self.island)
        elif self.handle is None:  # lost before this controller came: a lost island
            self.started(None, dict(self.first_info), 0.0)
            self.mark_lost()
            return
        try:
            reg = ray.get(self.handle.register.remote(self.tenant, self.weight, self.key),
                          timeout=60)
            info = ray.get(self.handle.info.remote(), timeout=60)
        except ray.exceptions.RayError as e:
            raise DeviceSetupError(f"pool {self.pool!r}: island {self.island} did not take "
                                   f"this controller as a tenant: {e}") from None
        self.tenant_id = reg["tenant"]
        self.started(TenantActor(self.handle, reg["secret"]), info, clock_offset(self.handle))

    def release(self, actor: TenantActor) -> None:
        """Unregister, once the island has taken every message this controller sent (Ray
        may run an actor's calls out of order: a free sent before must not come after, and
        be refused as a stranger's)."""
        if not ray.is_initialized():  # this process left a cluster that went away (a Ray
            return  # call now would start a new local cluster)
        sent = self.last_message
        after = sent[1] if sent is not None and sent[0] is actor else -1
        try:
            ray.get(actor.unregister.remote(after), timeout=60)
        except Exception:  # noqa: BLE001 - dropped already, or the island died
            pass

    def pool_status(self) -> dict | None:
        """The island's ``pool_status()``, or None when it is lost. A lost island is not
        asked: once the pool's cluster has gone this process has left it, and any Ray call
        (even to a dead actor's handle) would start a local cluster of Ray's own."""
        if self.handle is None or self.lost or not ray.is_initialized():
            return None
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
    is logged once; an island whose actor died is marked lost, as a failed call marks it.
    When the cluster itself has gone (``pool stop``), every island is lost and the process
    leaves the cluster at once: Ray would end it (a notebook kernel) after 60 s without it."""

    def __init__(self, hosts: list[PoolIslandHost]):
        self.hosts, self._stop, self._refused = hosts, threading.Event(), False
        self._thread = threading.Thread(target=self._loop, name="pw-pool-keepalive",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            failed = False
            for host in self.hosts:
                actor = host.actor
                if actor is None or host.lost:
                    continue
                try:
                    ray.get(actor.renew.remote(), timeout=10)
                except ray.exceptions.RayActorError:
                    host.mark_lost()
                    failed = True
                except ray.exceptions.RayError as e:  # refused, or a timeout: say it once
                    if not self._refused:
                        logging.getLogger("pwkernel").warning("island %s: %s", host.island, e)
                    self._refused = failed = True
            # (a stop kills the islands before the cluster: look again while any is lost)
            if (failed or any(h.lost for h in self.hosts)) and cluster.gone():
                self._left()
                return

    def _left(self) -> None:
        """The cluster went away: lose every island (their calls fail, saying so), leave."""
        for host in self.hosts:
            host.mark_lost()
        logging.getLogger("pwkernel").warning(
            "the pool's Ray cluster has gone (the pool was stopped?): its islands are lost; "
            "this process left the cluster. Attach again once the pool runs.")
        cluster.drop_lost()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the renewals stop (closed, or the cluster went away); True if so."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def attach(pool: str, sizes: tuple[int, ...] | None, tenant: str | None,
           weight: float | None) -> list[PoolIslandHost]:
    """Pool ``pool``'s islands on the connected cluster, as hosts not started yet; refuses
    ``sizes`` that differ from the pool's."""
    weight = tenant_weight(weight)
    name = tenant_name(tenant)
    actors = island_actors(pool)
    if not actors:
        find_islands(pool)  # raises: says there is no such pool, and how to start one
    infos = {}
    for i, actor in actors.items():
        try:
            infos[i] = ray.get(actor.info.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            continue  # it died just now: a lost island
    layout = next((i["sizes"] for i in infos.values() if i.get("sizes")), None)
    count = len(layout) if layout else max(actors) + 1
    lost = [i for i in range(count) if i not in infos]
    if lost and not layout or not infos:
        raise lost_island(pool, lost[0])  # (a pool of older code: sizes unknown)
    have = tuple(int(layout[i]) if layout else int(infos[i]["size"]) for i in range(count))
    if sizes is not None and tuple(sizes) != have:
        raise DeviceSetupError(f"islands={tuple(sizes)} but pool {pool!r} has islands of "
                               f"{have} devices; drop islands= (a pool brings its own) or pass "
                               f"islands={have}.")
    if lost:
        logging.getLogger("pwkernel").warning(
            "pool %r: island(s) %s lost (their actors died); work on them fails with "
            "IslandLostError. Stop and start the pool to have them again.", pool, lost)
    some = next(iter(infos.values()))
    key = secrets.token_hex(4)  # this controller on every island: its rows are one tenant
    return [PoolIslandHost(i, actors[i] if i in infos else None,
                           infos.get(i) or {"island": i, "size": have[i],
                                            "platform": some["platform"]},
                           pool, name, float(weight), key)
            for i in range(count)]


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
            islands.append({"island": host.island, "lost": True, "devices": host.devices})
            continue
        islands.append({k: status[k] for k in ("island", "devices", "platform", "pid",
                                               "bytes", "launches", "policy")})
        for row in status["tenants"]:
            # one row per tenant, named or not alike: a controller's key is the same on
            # every island (one without is a tenant of its island only)
            key = row.get("key") or f"{status['island']}:{row['tenant']}"
            t = tenants.setdefault(key, {
                "name": row["name"], "id": key, "queued": 0, "running": 0,
                "device_seconds": 0.0, "bytes": 0, "devices": {}, "me": False})
            for key in ("queued", "running", "device_seconds", "bytes"):
                t[key] += row[key]
            if row["devices"]:
                t["devices"][status["island"]] = row["devices"]
            t["me"] |= (status["island"], row["tenant"]) in mine
    total = sum(t["device_seconds"] for t in tenants.values())
    for t in tenants.values():
        t["share"] = t["device_seconds"] / total if total else 0.0
    return {"name": pool, "tenants": list(tenants.values()), "islands": islands}

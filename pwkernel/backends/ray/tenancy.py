"""A pool's island: one long-lived Ray actor that every attached controller (a *tenant*) uses.

It is the single controller's island actor (``actor.py``) made multi-tenant. It holds the
island's devices, every tenant's buffers (each tenant's under its own ids: a tenant can neither
read nor free another's) and **the island's gang scheduler** (``runtime.scheduler``'s
``GangScheduler``, the same one the controller uses, policy ``share`` by tenant weight unless
``policy("fifo")``), which puts the work of every tenant on the island in ONE issue order:

- a tenant's messages are taken in its own sequence order, and its operations join the
  scheduler one at a time, each once the one before it is launched, so a tenant's operations
  are issued in its order;
- each computation is chained to the tenant's previous one (``after``), so a tenant's chain may
  run ahead on its devices (up to the scheduler's ``depth``) while another tenant's computation
  waits until no other tenant's work is in flight on its devices: tenants hand devices over,
  and collectives of different tenants never interleave on shared devices;
- a ``recv`` whose value has not arrived is not ready: it holds back its own tenant only, so
  overlapping programs of several tenants on several islands cannot deadlock;
- transfers (``put``, ``reshard``, ``send``, ``recv``) need no devices to themselves: they go
  through the scheduler as copies (in the one order, never waiting for devices).

An executor thread issues the launches in decision order; one completion thread per tenant sees
the tenant's items end in its issue order (a long computation of one tenant never delays
another's records), reports ``Ended`` with the device time measured there, and keeps the
tenant's completion records for its ``poll``. Every issued operation has an entry in the
launch log (``launches``), the island's one issue order as it happened.

A tenant registers (``register(name, weight, key)`` returns its id and a random secret), passes the
secret in every later call, and is dropped by ``unregister`` (a controller's ``close``) or when
it has been silent for ``lease`` seconds (its controller renews every second while open): its
queued work is cancelled and its buffers are freed at once.

Helpers (for ``python -m pwkernel.pool`` and tests): ``namespace``, ``create_islands``,
``named_islands`` (by number: a dead island is missing), ``find_islands``, ``destroy_islands``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from typing import Any

from ...runtime.errors import DeviceSetupError
from ...runtime.scheduler import (
    Cancel,
    Ended,
    GangScheduler,
    Launch,
    Policy,
    Ready,
    SetPolicy,
    Submit,
)
from .actor import linger
from .hostvalues import to_host
from .ops import IslandDevices, compute_positions, now
from .poolfile import check_name
from .tenants import Item, Tenant, TenantRefused

DEFAULT_LEASE = 5.0  # s without a call after which a pool drops a tenant
POOL_CONCURRENCY = 64  # actor threads: every tenant's poll waits in one
# Computations of one tenant in flight on a device: enough to hide the launch gap; few, as a
# deep chain charged on a stale cost estimate (``share``) moves its tenant's pass, and others'.
DEPTH = 4
_LOG_KEEP = 100_000  # launch log entries kept (older ones are dropped in halves)


def namespace(pool: str) -> str:
    """The Ray namespace of pool ``pool``'s island actors."""
    return f"pwkernel-pool-{check_name(pool)}"


class PoolIslandActor:
    """One island of pool ``pool``: ``devices`` JAX devices of this process, shared by every
    tenant. Created detached, as ``island-<island>`` in the namespace ``namespace(pool)``, by
    ``create_islands``."""

    def __init__(self, island: int, devices: int, platform: str, pool: str,
                 lease: float = DEFAULT_LEASE, sizes: tuple[int, ...] = ()):
        if not lease > 0:
            raise ValueError(f"lease must be a positive number of seconds, got {lease!r}")
        self.island, self.pool, self.lease = island, pool, float(lease)
        self.sizes = [int(n) for n in sizes]  # every island's devices (the pool's layout)
        self.ops = IslandDevices(island, devices, platform, shared=True)
        self._cv = threading.Condition()
        self._scheduler = GangScheduler(range(devices), Policy.SHARE, depth=DEPTH)
        self._every = frozenset(range(devices))
        self._tenants: dict[str, Tenant] = {}  # secret -> tenant
        self._ids = itertools.count()
        self._task_ids = itertools.count()
        self._items: dict[int, Item] = {}  # task id -> item, until launched (copies) or ended
        self._issue: deque = deque()  # (tenant, item or None, op), in decision order
        self._log: list[dict] = []
        self._logged = 0  # launches logged before ``_log[0]``
        self._peers: dict[int, Any] = {}
        self._changes = 0  # what pool_status shows changed this often (``changed``)
        self._watchers = 0  # callers waiting in ``changed``
        threading.Thread(target=self._issue_loop, name="pool-issuer", daemon=True).start()
        threading.Thread(target=self._lease_loop, name="pool-leases", daemon=True).start()

    # --- set-up and introspection ----------------------------------------------------------
    def info(self) -> dict:
        return self.ops.info() | {"pool": self.pool, "lease": self.lease,
                                  "size": len(self.ops.devices), "sizes": self.sizes}

    def peers(self, handles: dict) -> None:
        """The pool's other islands (given by ``create_islands``)."""
        self._peers.update(handles)

    def clock(self) -> float:
        return now()

    def policy(self, name: str) -> str:
        """Order tenants by ``share`` (their weights) or ``fifo`` from now on."""
        policy = Policy.parse(name)
        with self._cv:
            self._post(SetPolicy(policy=policy))
        return policy.value

    def launches(self, since: int = 0) -> list[dict]:
        """The launch log from entry ``since`` on: every operation issued here, in the one
        issue order (``t_start``, ``t_end`` and ``ok`` are None until it ended; ``busy``: the
        tenants with work here, queued or in flight, when it was issued)."""
        with self._cv:
            return [dict(e) for e in self._log[max(0, since - self._logged):]]

    def pool_status(self) -> dict:
        """This island's tenants (queued, running, device time, share, bytes, positions used),
        bytes of all live arrays here, launches, scheduler tasks and accounts, executables."""
        import jax

        with self._cv:
            tenants = list(self._tenants.values())
            total = sum(t.device_seconds for t in tenants)
            rows = [t.status(total) for t in tenants]
            launches, accounts = self._logged + len(self._log), len(self._scheduler.shares())
            queued, running = len(self._scheduler.queued), len(self._scheduler.running)
        live = sum(int(a.nbytes) for a in jax.live_arrays())
        return {"island": self.island, "devices": len(self.ops.devices),
                "platform": self.ops.devices[0].platform, "pid": os.getpid(),
                "pool": self.pool, "policy": self._scheduler.policy.value,
                "tenants": rows, "bytes": live, "launches": launches,
                "queued": queued, "running": running, "accounts": accounts,
                "executables": len(self.ops.shared)}

    def changed(self, seen: int = -1, timeout: float = 1.0) -> int:
        """How many times what ``pool_status`` shows has changed (a tenant came or went, an
        operation was issued or ended, buffers were freed), once that count is past ``seen``
        or after ``timeout`` seconds: a reader waits here between status reads."""
        with self._cv:
            self._watchers += 1
            try:
                self._cv.wait_for(lambda: self._changes > seen, timeout)
            finally:
                self._watchers -= 1
            return self._changes

    def _changed(self, wake_all: bool = False) -> None:
        """Under the lock: count a change; wake whoever waits in ``changed`` (``wake_all``:
        every waiter on the lock, for what else the change concerns)."""
        self._changes += 1
        if wake_all or self._watchers:
            self._cv.notify_all()

    # --- tenants ---------------------------------------------------------------------------
    def register(self, name: str, weight: float = 1.0, key: str | None = None) -> dict:
        """A new tenant: its id and the secret its later calls pass (``key``: ``Tenant.key``)."""
        if not isinstance(name, str) or not name or not isinstance(key, str | None):
            raise ValueError(f"a tenant name must be a non-empty string, got {name!r} ({key!r})")
        if not (isinstance(weight, int | float) and 0 < weight < float("inf")):
            raise ValueError(f"a tenant weight must be a finite number > 0, got {weight!r}")
        with self._cv:
            tenant = Tenant(next(self._ids), name, float(weight), now(), key=key or "")
            self._tenants[tenant.secret] = tenant
            self._changed()
        threading.Thread(target=self._complete_loop, args=(tenant,),
                         name=f"pool-tenant{tenant.id}", daemon=True).start()
        return {"tenant": tenant.id, "secret": tenant.secret}

    def renew(self, secret: str) -> None:
        """The tenant is alive (its controller's ``KeepAlive``): its lease runs from now."""
        with self._cv:
            self._tenant(secret)

    def unregister(self, secret: str, after: int = -1) -> None:
        """The tenant leaves once its messages up to ``after`` came: its work and buffers go."""
        with self._cv:
            tenant = self._tenant(secret)
            self._cv.wait_for(lambda: tenant.next > after or tenant.dropped, 30.0)
            self._drop(tenant)

    def _tenant(self, secret: str) -> Tenant:
        """Under the lock: the tenant with ``secret``, refreshing its lease."""
        tenant = self._tenants.get(secret) if isinstance(secret, str) else None
        if tenant is None:
            raise TenantRefused(
                f"island {self.island} of pool {self.pool!r} has no tenant with this secret: "
                f"it was never registered here, or the pool dropped it (it unregistered, or "
                f"was silent for more than its {self.lease:g} s lease). Attach again: "
                f"pw.Controller(backend='ray', pool={self.pool!r}, address=...).")
        tenant.last = now()
        return tenant

    def _drop(self, tenant: Tenant) -> None:
        """Under the lock: cancel the tenant's queued work, free its buffers, forget it."""
        if tenant.dropped:
            return
        self._tenants.pop(tenant.secret, None)
        tenant.dropped = True
        events: list = []
        if tenant.head is not None:
            events.append(Cancel(task=tenant.head.task))
            self._items.pop(tenant.head.task, None)
            tenant.head = None
        kept = deque()
        for entry in self._issue:  # launched, not issued: their devices are free again
            owner, item, _ = entry
            if owner is not tenant:
                kept.append(entry)
            elif item is not None and item.compute:
                self._items.pop(item.task, None)
                events.append(Ended(task=item.task, seconds=0.0))
        self._issue = kept
        tenant.forget()
        if events:
            self._post(*events)
        if not tenant.running and not tenant.issuing:
            tenant.issued.put(None)
        self._changed(wake_all=True)

    def _lease_loop(self) -> None:
        tick, period, seen = threading.Event(), min(0.25, self.lease / 4), now()
        while not tick.wait(period):
            with self._cv:  # time this process did not run (stopped, starved) is no silence
                t = now()
                credit, seen = max(0.0, t - seen - 2 * period), t  # (calls waited for it too)
                for tenant in self._tenants.values():
                    tenant.last += credit
                for tenant in [x for x in self._tenants.values() if t - x.last > self.lease]:
                    self._drop(tenant)

    # --- a tenant's messages in, records out -----------------------------------------------
    def submit(self, secret: str, seq: int, ops: list) -> None:
        """Queue the tenant's message ``seq`` (taken in its sequence order)."""
        with self._cv:
            tenant = self._tenant(secret)
            tenant.accept(seq, ops)
            self._post(*self._advance(tenant))

    def poll(self, secret: str, timeout: float) -> list[dict]:
        """The tenant's completion records made since its last poll (waits up to
        ``timeout`` for one)."""
        with self._cv:
            tenant = self._tenant(secret)
            if self._cv.wait_for(lambda: tenant.records or tenant.dropped, timeout):
                linger(self._cv, tenant.records, lambda: tenant.running)
            out, tenant.records = tenant.records, []
            self._tenant(secret)  # a long poll counts at its end too
            return out

    def buffers(self, secret: str, after: int = -1) -> dict[int, int]:
        """The tenant's live buffer ids and their bytes, once its message ``after`` has been
        issued (so the frees it carries are done)."""
        with self._cv:
            tenant = self._tenant(secret)
            self._cv.wait_for(lambda: tenant.done >= after or tenant.dropped)
            return {bid: int(a.nbytes) for bid, a in tenant.buffers.items()}

    def fetch(self, secret: str, bid: int):
        """One of the tenant's buffers as a host array."""
        with self._cv:
            buffers = self._tenant(secret).buffers
        return to_host(self.ops.arg(buffers, bid, None))

    def executables(self, secret: str) -> list[str]:
        with self._cv:  # (the tenant's keys: compiled ones are shared, ``ops.content_key``)
            return sorted(self._tenant(secret).executables)

    def deliver(self, secret: str, bid: int, value, error: str | None, t_src: float) -> None:
        """Another island's ``send`` for the tenant with ``secret`` arrives (a tenant gone
        meanwhile is ignored: its buffers went with it)."""
        with self._cv:
            tenant = self._tenants.get(secret)
            if tenant is not None:
                tenant.incoming[bid] = (value, error, t_src)
                self._recv_ready(tenant)

    def source_lost(self, secret: str, island: int, generation: int) -> None:
        """The tenant saw ``island`` die: its ``recv`` from there fails, not waits."""
        with self._cv:
            tenant = self._tenant(secret)
            tenant.lost.add((island, generation))
            self._recv_ready(tenant)

    # --- the scheduler ---------------------------------------------------------------------
    def _advance(self, tenant: Tenant) -> list:
        """Under the lock: hand the tenant's next operation to the scheduler, if it has none
        there (frees and message ends go straight to the executor, in order)."""
        while tenant.head is None and tenant.pending:
            op = tenant.pending.popleft()
            kind = op[0]
            if kind in ("free", "mark"):
                self._issue.append((tenant, None, op))
                self._cv.notify_all()
                continue
            compute = kind == "run"
            devices = compute_positions(op) if compute else self._copy_devices(op)
            item = Item(next(self._task_ids), tenant, op, compute, devices)
            self._items[item.task] = item
            tenant.head = item
            after = () if tenant.last_compute not in self._items else (tenant.last_compute,)
            item.waiting = kind == "recv" and not tenant.can_recv(op)
            return [Submit(task=item.task, devices=tuple(devices), client=tenant.client,
                           cost_key=tenant.cost_key(op[2]) if compute else None,
                           ready=not item.waiting, after=after if compute else (),
                           copy=not compute)]
        return []

    def _copy_devices(self, op: tuple) -> frozenset[int]:
        layout = {"put": 4, "reshard": 4, "recv": 3}.get(op[0])
        return frozenset(op[layout][0]) if layout is not None else self._every

    def _recv_ready(self, tenant: Tenant) -> None:
        head = tenant.head
        if head is not None and head.waiting and tenant.can_recv(head.op):
            head.waiting = False
            self._post(Ready(task=head.task))

    def _post(self, *events) -> None:
        """Under the lock: feed the scheduler; its launches go to the executor, in order."""
        while events:
            more: list = []
            for decision in self._scheduler.handle(*events):
                item = self._items[decision.task]
                tenant = item.tenant
                tenant.head = None
                if type(decision) is Launch and item.compute:
                    tenant.last_compute = item.task
                else:
                    del self._items[item.task]
                if type(decision) is not Launch:  # its record carries the refusal, in order
                    item.refused = decision.reason
                tenant.in_flight += 1
                self._issue.append((tenant, item, item.op))
                more += self._advance(tenant)  # a launch lets its next operation join
            events = tuple(more)
        self._cv.notify_all()

    # --- the executor: issues launches in decision order -----------------------------------
    def _issue_loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._issue)
                tenant, item, op = self._issue.popleft()
                if op[0] == "mark":
                    tenant.done = op[1]
                    self._cv.notify_all()
                    continue
                tenant.issuing = True
            t_launch = now()
            try:
                if item is not None and item.refused is not None:
                    raise RuntimeError(f"island {self.island} refused {op[0]}: {item.refused}")
                out = self.ops.issue(op, t_launch, tenant.buffers, tenant.executables,
                                     tenant.arrived, self._deliverer)
            except Exception as e:  # noqa: BLE001 - the record carries it to the tenant
                out = self.ops.failed(op, e, t_launch)
            with self._cv:
                tenant.issuing = False
                self._changed()  # (a free, or buffers made)
                if tenant.dropped:  # dropped while this was issued: its outputs go too
                    tenant.buffers.clear()
                if out is None:  # a free
                    if tenant.dropped and not tenant.running:
                        tenant.issued.put(None)
                    continue
                entry = {"seq": self._logged + len(self._log), "tenant": tenant.name,
                         "tenant_id": tenant.id, "client": op[9] if op[0] == "run" else None,
                         "name": op[8] if op[0] == "run" else op[0],
                         "kind": "compute" if op[0] == "run" else op[0],
                         "devices": sorted(item.devices), "t_launch": out[3],
                         "t_start": None, "t_end": None, "ok": None,
                         "busy": sorted(t.name for t in self._tenants.values() if t.has_work())}
                self._log.append(entry)
                if len(self._log) > _LOG_KEEP:
                    half = _LOG_KEEP // 2
                    self._logged += half
                    del self._log[:half]
                tenant.running += 1
                tenant.issued.put((out, item, entry))
            out = op = item = None  # an idle executor keeps no value alive

    def _deliverer(self, op: tuple):
        _, _, _, island, _, secret = op
        peer = self._peers.get(island)
        if peer is None:
            import ray

            peer = self._peers[island] = ray.get_actor(f"island-{island}",
                                                       namespace=namespace(self.pool))
        return lambda bid, value, error, t_src: peer.deliver.remote(secret, bid, value, error,
                                                                    t_src)

    # --- one completion thread per tenant --------------------------------------------------
    def _complete_loop(self, tenant: Tenant) -> None:
        while (got := tenant.issued.get()) is not None:
            out, item, entry = got
            record = self.ops.complete(out)
            out = got = None  # drop the arrays: a freed buffer goes once its last user ended
            with self._cv:
                entry.update((k, record[k]) for k in ("t_start", "t_end", "ok"))
                tenant.running -= 1
                tenant.in_flight -= 1
                if item.compute and item.refused is None:
                    seconds = record["t_end"] - record["t_start"]
                    tenant.ended(item.devices, seconds)
                    del self._items[item.task]
                    self._post(Ended(task=item.task, seconds=seconds))
                if not tenant.dropped:
                    tenant.records.append(record)
                elif not tenant.running and not tenant.issuing:
                    break
                item = entry = None  # an idle tenant's thread keeps no operation of its own
                self._changed(wake_all=True)
        with self._cv:  # it left and its work has all ended: its account goes too
            self._post(tenant.farewell())
            self._changed()


# --- a pool's islands on the connected Ray cluster ---------------------------------------
def named_islands(pool: str) -> dict[int, str]:
    """Pool ``pool``'s island actors' names on the connected cluster, by island number."""
    import ray

    ns = namespace(pool)
    return {int(a["name"].rsplit("-", 1)[1]): a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == ns and a["name"].startswith("island-")}


def create_islands(pool: str, sizes: tuple[int, ...], platform: str = "cpu",
                   lease: float = DEFAULT_LEASE) -> list[dict]:
    """Start pool ``pool``'s island actors (detached: they outlive this process) on the Ray
    cluster this process is connected to; returns each one's ``info()``."""
    import ray

    check_name(pool)
    sizes = tuple(sizes)
    if not sizes or not all(isinstance(n, int) and n > 0 for n in sizes):
        raise DeviceSetupError(f"islands must be device counts > 0, got {sizes!r}; e.g. (4, 4).")
    if platform not in ("cpu", "gpu"):
        raise DeviceSetupError(f"platform must be 'cpu' or 'gpu', got {platform!r}.")
    if not lease > 0:
        raise DeviceSetupError(f"lease must be a positive number of seconds, got {lease!r}.")
    existing = sorted(named_islands(pool).values())
    if existing:
        raise DeviceSetupError(
            f"pool {pool!r} already has island actors on this Ray cluster ({existing}); stop "
            f"it first (python -m pwkernel.pool stop --name {pool}) or pick another name.")
    actors = []
    try:
        for i, n in enumerate(sizes):
            opts: dict = {"name": f"island-{i}", "namespace": namespace(pool),
                          "lifetime": "detached", "max_concurrency": POOL_CONCURRENCY,
                          "max_restarts": 0, "num_cpus": 0, "num_gpus": n * (platform == "gpu")}
            actors.append(ray.remote(PoolIslandActor).options(**opts).remote(
                i, n, platform, pool, float(lease), sizes))
        infos = ray.get([a.info.remote() for a in actors], timeout=300)
        ray.get([a.peers.remote({j: b for j, b in enumerate(actors) if j != i})
                 for i, a in enumerate(actors)], timeout=60)
    except BaseException as e:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if isinstance(e, ray.exceptions.RayError | TimeoutError):
            raise DeviceSetupError(f"pool {pool!r}: its island actors did not start: {e}") \
                from None
        raise
    return infos


def find_islands(pool: str) -> list:
    """Pool ``pool``'s live island actors on the connected Ray cluster, island 0 first."""
    import ray

    names = named_islands(pool)
    if not names:
        raise DeviceSetupError(
            f"no pool named {pool!r} on this Ray cluster (no actors in namespace "
            f"{namespace(pool)!r}). Start it with `python -m pwkernel.pool start --name {pool} "
            "--islands 4,4`, or check the name and the address.")
    return [ray.get_actor(names[i], namespace=namespace(pool)) for i in sorted(names)]


def destroy_islands(pool: str) -> None:
    """Kill pool ``pool``'s island actors (their tenants' work and buffers go with them)."""
    import ray

    for actor in find_islands(pool):
        ray.kill(actor, no_restart=True)

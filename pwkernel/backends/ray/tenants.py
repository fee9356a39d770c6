"""What a pool's island keeps per tenant (``tenancy.py``): its secret, its queue of operations
in its own order, its buffers and executables (its own namespace of ids), its records and its
device time. Touched only under the island actor's lock, except ``buffers`` and
``executables``, which the actor's executor thread fills as it issues the tenant's work."""

from __future__ import annotations

import queue
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ...runtime.scheduler import ClientSpec, Forget


class TenantRefused(PermissionError):
    """A call with a secret the island does not know (never registered, or dropped)."""


@dataclass(eq=False, slots=True)
class Item:
    """One operation of one tenant, as the island's scheduler knows it (task ``task``)."""

    task: int
    tenant: Tenant
    op: tuple
    compute: bool
    devices: frozenset[int]
    waiting: bool = False  # a recv whose value has not arrived: not ready
    refused: str | None = None  # the scheduler's reason, when it rejected it


@dataclass(eq=False)
class Tenant:
    id: int
    name: str
    weight: float
    last: float  # when it last called (its lease runs from there)
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    # One controller's name for itself on every island of the pool (its rows are one tenant),
    # where its id differs from island to island; "" when it gave none.
    key: str = ""
    messages: dict[int, list] = field(default_factory=dict)  # seq -> ops, arrived early
    next: int = 0  # the next message to take
    pending: deque = field(default_factory=deque)  # its operations not yet at the scheduler
    head: Item | None = None  # its operation at the scheduler, not yet launched
    last_compute: int | None = None  # task id of its last computation launched
    done: int = -1  # its messages issued so far
    buffers: dict[int, Any] = field(default_factory=dict)
    executables: dict[str, Any] = field(default_factory=dict)
    incoming: dict[int, tuple] = field(default_factory=dict)  # bid -> (value, error, t_src)
    lost: set = field(default_factory=set)  # (island, generation) that will send nothing
    records: list = field(default_factory=list)
    issued: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    in_flight: int = 0  # launched, record not made
    running: int = 0  # issued, record not made
    issuing: bool = False  # the executor is issuing one of its operations now
    device_seconds: float = 0.0
    positions: set = field(default_factory=set)  # device positions its computations used
    cost_keys: set = field(default_factory=set)  # its computations' keys at the scheduler
    dropped: bool = False

    def __post_init__(self) -> None:
        self.client = ClientSpec(f"tenant-{self.id}", self.weight)

    def accept(self, seq: int, ops: list) -> None:
        """Message ``seq``: its operations join the queue in sequence order, each message
        followed by a mark (issued: ``done`` moves on)."""
        self.messages[seq] = ops
        while self.next in self.messages:
            self.pending.extend(self.messages.pop(self.next))
            self.pending.append(("mark", self.next))
            self.next += 1

    def cost_key(self, name: str) -> tuple:
        """The scheduler's key for the device time of its computation ``name``."""
        key = (self.id, name)
        self.cost_keys.add(key)
        return key

    def farewell(self) -> Forget:
        """Gone, its work all ended: the scheduler forgets its account and estimates (a pool
        that saw thousands of tenants come and go schedules as fast as a new one)."""
        return Forget(client=self.client.name, cost_keys=tuple(self.cost_keys))

    def can_recv(self, op: tuple) -> bool:
        """Has a ``recv``'s value arrived (or its source island been lost)?"""
        _, _, bid, _, island, generation = op[:6]  # (a recv may carry more after these)
        return bid in self.incoming or (island, generation) in self.lost

    def arrived(self, bid: int, island: int, generation: int) -> tuple | None:
        return self.incoming.pop(bid, None)

    def ended(self, devices: frozenset[int], seconds: float) -> None:
        self.device_seconds += seconds * len(devices)
        self.positions |= devices

    def forget(self) -> None:
        """Dropped: its queued work, buffers, executables and records go now."""
        self.messages.clear()
        self.pending.clear()
        self.buffers.clear()
        self.executables.clear()
        self.incoming.clear()
        self.records.clear()

    def has_work(self) -> bool:
        """Work queued here or in flight (a tenant without is idle, not behind)."""
        return bool(self.in_flight or self.head is not None or self.messages or any(
            op[0] not in ("free", "mark") for op in self.pending))

    def status(self, total: float) -> dict:
        queued = (self.head is not None) + sum(op[0] not in ("free", "mark")
                                              for op in self.pending)
        queued += sum(len(ops) for ops in self.messages.values())
        return {"name": self.name, "tenant": self.id, "key": self.key or None,
                "weight": self.weight, "queued": queued,
                "running": self.in_flight, "device_seconds": self.device_seconds,
                "share": self.device_seconds / total if total else 0.0,
                "bytes": held_bytes(self.buffers.values()),
                "devices": sorted(self.positions)}


def held_bytes(arrays) -> int:
    """Bytes of ``arrays`` still held: a buffer a computation donated is gone from the
    devices at once, while its id stays until the controller frees it (when its futures go),
    so it counts no more."""
    return sum(int(a.nbytes) for a in list(arrays) if not _deleted(a))


def _deleted(a) -> bool:
    is_deleted = getattr(a, "is_deleted", None)
    return bool(is_deleted()) if is_deleted is not None else False

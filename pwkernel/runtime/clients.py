"""The gang scheduler's accounts of its clients: who submitted what, and how much device time
each has been charged, for the proportional-share policy.

Proportional share is stride scheduling: each client has a pass value (its virtual time),
advanced by device-seconds / weight; under ``share`` the client with the lowest pass goes
next. A launch is charged an estimate (the last durations of the same computation, a running
mean by ``cost_key``) and corrected when it ends, **at the weight it was submitted with**: a
client's weight may change while its work waits or runs (the same name submitting with
another weight, from another thread or between submissions), and charging or settling it at
the new weight would make its pass drift from the device time it used at the weight it asked
for. So the scheduler keeps with each computation its client's weight when it was submitted,
and hands it to ``charge`` and ``settle``.

A client that becomes active starts at the pass of what has run (``vtime``); a guess charged
for a computation never seen yet moves no one's start (a guess far too big would otherwise
keep a newcomer waiting until the other had used all of it). So does a client whose queued work
only waited for its inputs (nothing of its ready, nothing running: ``rejoin``): it was not
competing meanwhile, and starting from its old pass would let its backlog run back to back for
as long as it waited.

Pure bookkeeping, like the scheduler that owns it: no JAX, no thread, no clock.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from .events import ClientSpec


@dataclass(slots=True)
class ClientAccount:
    """One client's state in one island's scheduler (one per client name)."""

    weight: float = 1.0
    passes: float = 0.0  # stride scheduling's pass value, in device-seconds / weight
    guessed: float = 0.0  # of ``passes``: charges of running tasks whose cost is unknown
    active: int = 0      # queued + running tasks
    running: int = 0     # launched computations not ended yet (copies never count)
    device_seconds: float = 0.0
    # (key, task) of its ready tasks, sorted by key; keys are unique (each is, or ends with,
    # the task's ``seq``), so two tasks are never compared. The scheduler keeps this list.
    ready: list = field(default_factory=list)


#: estimates kept, those settled last: each run of a ``%%pathways`` cell is a new function
#: (a new ``cost_key``), so keeping every one would grow with every cell run
ESTIMATES = 1024


@dataclass(slots=True)
class ClientLedger:
    """Every client's account, the virtual time, and the estimates of device time."""

    clients: dict[str, ClientAccount] = field(default_factory=dict)
    sole: ClientAccount | None = None  # the client, while there is only one
    estimates: dict[Hashable, float] = field(default_factory=dict)
    vtime: float = 0.0  # the settled pass of the latest launch: where a returning client starts
    # device set -> how many ready tasks (of every client) need it: a scheduling pass stops
    # once each meets the devices it reserved (a slice's many blocked calls are not walked
    # again at every end: that was quadratic in a program's independent calls)
    ready_sets: dict[frozenset[int], int] = field(default_factory=dict)

    def client(self, spec: ClientSpec) -> ClientAccount:
        """``spec``'s account, made on its first use; its weight becomes ``spec.weight`` (for
        what is submitted from now on: what waits or runs keeps the weight it was submitted
        at)."""
        client = self.clients.get(spec.name)
        if client is None:
            client = self.clients[spec.name] = ClientAccount()
            self.sole = client if len(self.clients) == 1 else None
        if spec.weight != client.weight:
            client.weight = max(float(spec.weight), 1e-9)
        if client.active == 0:  # a client returning from idle starts at the current time
            client.passes = max(client.passes, self.vtime)
        return client

    def joined(self, devices: frozenset[int]) -> None:
        """A task on ``devices`` joined a client's ready list."""
        self.ready_sets[devices] = self.ready_sets.get(devices, 0) + 1

    def left(self, devices: frozenset[int]) -> None:
        """A task on ``devices`` left a client's ready list (launched or dropped)."""
        n = self.ready_sets[devices] - 1
        if n:
            self.ready_sets[devices] = n
        else:
            del self.ready_sets[devices]

    def blocked(self, reserved: set[int]) -> bool:
        """Every ready task needs one of the ``reserved`` devices: a pass launches no more."""
        return all(not reserved.isdisjoint(s) for s in self.ready_sets)

    def rejoin(self, client: ClientAccount) -> None:
        """``client`` had nothing ready and nothing running, and now has a computation ready:
        it competes again from the pass of what has run, as a newcomer does."""
        if client.passes < self.vtime:
            client.passes = self.vtime

    def estimate(self, cost_key: Hashable, devices: int) -> float:
        """Device-seconds a computation is expected to take: the running mean of its
        ``cost_key``'s ends; never seen, the mean of all, or a second per device."""
        known = self.estimates.get(cost_key)
        if known is not None:
            return known
        known = self.estimates.values()
        return sum(known) / len(known) if known else float(devices)

    def charge(self, client: ClientAccount, cost_key: Hashable, devices: int,
               weight: float) -> tuple[float, float]:
        """A launch of ``client``'s, submitted at ``weight``: charge its estimate now. Returns
        ``(charged, guessed)`` (``guessed``: the same when the computation was never seen,
        else 0), to be handed back to ``settle`` with the same weight when it ends."""
        settled = client.passes - client.guessed  # (a guess is no one's starting point)
        if settled > self.vtime:
            self.vtime = settled
        charged = self.estimates.get(cost_key)  # (``estimate``'s usual case, inline)
        guessed = 0.0
        if charged is None:
            charged = guessed = self.estimate(cost_key, devices)
            client.guessed += charged / weight
        client.passes += charged / weight
        return charged, guessed

    def settle(self, client: ClientAccount, cost_key: Hashable, actual: float, charged: float,
               guessed: float, weight: float) -> None:
        """A launch ended after ``actual`` device-seconds: correct its charge, at the weight
        it was charged with (its submission's), and learn its cost."""
        client.passes += (actual - charged) / weight
        client.guessed -= guessed / weight
        client.device_seconds += actual
        if cost_key is not None:
            old = self.estimates.pop(cost_key, None)  # (re-inserted: the newest last)
            self.estimates[cost_key] = actual if old is None else 0.5 * (old + actual)
            if len(self.estimates) > ESTIMATES:  # forget the one settled longest ago
                del self.estimates[next(iter(self.estimates))]

    def forget(self, name: str, cost_keys: tuple = ()) -> bool:
        """Client ``name`` is gone for good (a pool's tenant that left): drop its account and
        the estimates of ``cost_keys``, so that what is kept, and what a scheduling pass
        reads, does not grow with every client there ever was. A client with work queued or
        running is kept (False)."""
        client = self.clients.get(name)
        if client is not None and client.active:
            return False
        self.clients.pop(name, None)
        for key in cost_keys:
            self.estimates.pop(key, None)
        self.sole = next(iter(self.clients.values())) if len(self.clients) == 1 else None
        return True

    def shares(self) -> dict[str, float]:
        """Each client's fraction of the device-seconds charged so far."""
        total = sum(c.device_seconds for c in self.clients.values())
        return {n: (c.device_seconds / total if total else 0.0) for n, c in self.clients.items()}

"""The per-island gang scheduler, as a pure state machine.

Events go in (``handle``), decisions come out; there is no JAX, no thread and no clock here, so
the same policy code drives the real runtime, synchronous unit tests and a simulator.

The guarantee: all devices of a computation are given to it together (a gang), and launch
decisions come out in one sequence, so any two computations sharing devices run in the same
order on each of them, which is what keeps collectives from deadlocking. A device runs one
computation at a time: a computation may be launched onto a device that is still busy only when
everything in flight there is its own ancestor (it produces the computation's inputs), so the
device runs them in launch order anyway; this is what lets the control plane run ahead of the
data plane along a chain (``depth`` bounds how far). With ``program_ahead`` (the Ray backend,
whose islands receive a program's nodes in one message), a computation may also queue behind
in-flight computations of its own ``group`` (its program run): the whole program is enqueued on
its devices at once, in gang order. Among the computations that are ready, the policy picks the
order:

- ``fifo``: submission order (the paper's evaluation).
- ``priority``: higher ``priority`` first, then submission order.
- ``share``: proportional share of device time between clients by ``weight`` (stride
  scheduling: each client has a pass value advanced by device-seconds / weight; the lowest pass
  goes next). A launch is charged an estimate (the last durations of the same computation) and
  corrected when it finishes.

A ready computation that cannot start (its devices are busy, or its outputs would exceed the
memory budget) reserves its devices: later computations may use other devices (backfill) but
never jump ahead of it on its own, so nothing starves.

With a memory budget, copies onto the island (``Submit(copy=True)``: uploads and transfers) are
admitted here too, in the same order: a copy needs only memory, never its devices to itself, so
it is launched as soon as its bytes fit and is done with the scheduler at once (its memory stays
counted until ``MemoryFreed``). The scheduler never decides that waiting is hopeless; what
``waiting_for_memory`` reports lets the runtime tell (see ``runtime.budget``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class Policy(StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"
    SHARE = "share"

    @classmethod
    def parse(cls, value: Policy | str) -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown scheduling policy {value!r}; expected one of "
                f"{[p.value for p in cls]}, e.g. ctl.policy = 'share'."
            ) from None


# --- events (in) ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """A computation joins the island's queue. ``memory`` is bytes it adds on each device."""

    task: int
    devices: tuple[int, ...]
    client: str = "default"
    weight: float = 1.0
    priority: int = 0
    cost_key: Hashable = None
    memory: int = 0
    ready: bool = False
    after: tuple[int, ...] = ()  # tasks of this island whose outputs it reads
    group: Hashable = None  # its program run (see ``GangScheduler.program_ahead``)
    copy: bool = False  # a copy onto the island: it needs only ``memory`` (see the module doc)


@dataclass(frozen=True, slots=True)
class Ready:
    """All inputs of ``task`` exist, or are being computed by ``after`` (in-flight tasks of
    this island it may queue behind)."""

    task: int
    after: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """``task`` completed (or failed) after running ``seconds`` on its devices."""

    task: int
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Cancel:
    """Drop ``task`` if it has not started; a running computation cannot be preempted."""

    task: int


@dataclass(frozen=True, slots=True)
class MemoryFreed:
    device: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class SetPolicy:
    policy: Policy


# --- decisions (out) -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Launch:
    task: int


@dataclass(frozen=True, slots=True)
class Reject:
    task: int
    reason: str


@dataclass(slots=True)
class _Task:
    id: int
    seq: int
    devices: frozenset[int]
    client: str
    priority: int
    cost_key: Hashable
    memory: int
    ready: bool
    after: tuple[int, ...] = ()
    charged: float = 0.0
    group: Hashable = None
    copy: bool = False


@dataclass(slots=True)
class _Client:
    weight: float = 1.0
    passes: float = 0.0  # stride scheduling's pass value, in device-seconds / weight
    active: int = 0      # queued + running tasks
    device_seconds: float = 0.0


@dataclass
class GangScheduler:
    """One island's scheduler. ``devices``: the island's device ids; ``memory_budget``: bytes
    per device or None for no limit."""

    devices: Iterable[int]
    policy: Policy = Policy.FIFO
    memory_budget: int | None = None
    depth: int = 32  # computations in flight on one device (a chain launched ahead)
    program_ahead: bool = False  # may queue behind in-flight computations of its own group
    _tasks: dict[int, _Task] = field(default_factory=dict)
    _ready: dict[int, _Task] = field(default_factory=dict)  # ready, not yet launched
    _busy: dict[int, list[int]] = field(default_factory=dict)  # device -> in flight, in order
    _ancestors: dict[int, frozenset[int]] = field(default_factory=dict)  # in flight -> its own
    _memory: dict[int, int] = field(default_factory=dict)
    _clients: dict[str, _Client] = field(default_factory=dict)
    _estimates: dict[Hashable, float] = field(default_factory=dict)
    _seq: int = 0
    _vtime: float = 0.0

    def __post_init__(self) -> None:
        self.devices = tuple(self.devices)
        self.policy = Policy.parse(self.policy)
        self._memory = {d: 0 for d in self.devices}

    # --- the one entry point ---------------------------------------------------------------
    def handle(self, *events) -> list[Launch | Reject]:
        """Apply ``events`` in order and return the decisions they lead to, in order."""
        out: list[Launch | Reject] = []
        changed = False  # could anything launch now that could not before?
        for event in events:
            match event:
                case Submit():
                    out.extend(self._submit(event))
                    changed |= event.ready
                case Ready(task=t, after=after):
                    task = self._tasks.get(t)
                    if task is not None and not task.ready:
                        task.ready, task.after = True, tuple(after) or task.after
                        self._ready[t] = task
                        changed = True
                case Finished(task=t, seconds=s):
                    self._finish(t, s)
                    changed = True
                case Cancel(task=t):
                    if self._ready.pop(t, None) is not None or (
                            t in self._tasks and not self._tasks[t].ready):
                        self._drop(self._tasks.pop(t))
                        changed = True
                case MemoryFreed(device=d, nbytes=n):
                    self._memory[d] = max(0, self._memory[d] - n)
                    changed = True
                case SetPolicy(policy=p):
                    self.policy = Policy.parse(p)
                    changed = True
                case _:
                    raise TypeError(f"GangScheduler cannot handle {event!r}")
        if changed:
            out.extend(self._schedule())
        return out

    # --- queries ---------------------------------------------------------------------------
    @property
    def running(self) -> tuple[int, ...]:
        """Launched and not yet finished, oldest first."""
        return tuple(sorted(self._ancestors, key=lambda t: self._tasks[t].seq))

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(sorted((t for t in self._tasks if t not in self._ancestors),
                            key=lambda t: self._tasks[t].seq))

    def memory_in_use(self) -> dict[int, int]:
        return dict(self._memory)

    def waiting_for_memory(self) -> list[tuple[int, frozenset[int], int]]:
        """``(task, devices, bytes)`` of each ready computation or copy that is next on its
        devices and waits only for memory, in policy order."""
        out: list[tuple[int, frozenset[int], int]] = []
        reserved: set[int] = set()
        for t in sorted(self._ready.values(), key=self._key):
            if t.devices & reserved:
                continue
            reserved |= t.devices
            if self._devices_free(t) and not self._fits_memory(t):
                out.append((t.id, t.devices, t.memory))
        return out

    def shares(self) -> dict[str, float]:
        """Each client's fraction of the device-seconds charged so far."""
        total = sum(c.device_seconds for c in self._clients.values())
        return {n: (c.device_seconds / total if total else 0.0) for n, c in self._clients.items()}

    # --- transitions -----------------------------------------------------------------------
    def _submit(self, ev: Submit) -> list[Reject]:
        devices = frozenset(ev.devices)
        unknown = devices - set(self.devices)
        if unknown or not devices:
            return [Reject(ev.task, f"devices {sorted(unknown) or '[]'} are not on this island "
                                    f"(its devices: {list(self.devices)})")]
        if self.memory_budget is not None and ev.memory > self.memory_budget:
            return [Reject(ev.task, f"needs {ev.memory} bytes per device but the memory budget "
                                    f"is {self.memory_budget}; raise memory_budget or split "
                                    "the work into smaller pieces")]
        client = self._clients.setdefault(ev.client, _Client())
        client.weight = max(float(ev.weight), 1e-9)
        if client.active == 0:  # a client returning from idle starts at the current time
            client.passes = max(client.passes, self._vtime)
        client.active += 1
        task = _Task(ev.task, self._seq, devices, ev.client, ev.priority, ev.cost_key, ev.memory,
                     ev.ready, tuple(ev.after), group=ev.group, copy=ev.copy)
        self._tasks[ev.task] = task
        if ev.ready:
            self._ready[ev.task] = task
        self._seq += 1
        return []

    def _finish(self, task: int, seconds: float) -> None:
        t = self._tasks.pop(task, None)
        if t is None:
            return
        for d in t.devices:
            queue = self._busy.get(d)
            if queue and task in queue:
                queue.remove(task)
        self._ancestors.pop(task, None)
        actual = max(seconds, 0.0) * len(t.devices)
        client = self._clients[t.client]
        client.passes += (actual - t.charged) / client.weight
        client.device_seconds += actual
        client.active -= 1
        if t.cost_key is not None:
            old = self._estimates.get(t.cost_key)
            self._estimates[t.cost_key] = actual if old is None else 0.5 * (old + actual)

    def _drop(self, t: _Task) -> None:
        self._clients[t.client].active -= 1

    def _key(self, t: _Task) -> tuple:
        if self.policy is Policy.PRIORITY:
            return (-t.priority, t.seq)
        if self.policy is Policy.SHARE:
            return (self._clients[t.client].passes, t.seq)
        return (t.seq,)

    def _fits_memory(self, t: _Task) -> bool:
        if self.memory_budget is None or not t.memory:
            return True
        return all(self._memory[d] + t.memory <= self.memory_budget for d in t.devices)

    def _estimate(self, t: _Task) -> float:
        if t.cost_key in self._estimates:
            return self._estimates[t.cost_key]
        known = self._estimates.values()
        return sum(known) / len(known) if known else float(len(t.devices))

    def _schedule(self) -> list[Launch]:
        out: list[Launch] = []
        while True:
            chosen = None
            reserved: set[int] = set()
            candidates = self._ready.values()
            if len(candidates) > 1:
                candidates = sorted(candidates, key=self._key)
            for t in candidates:
                if t.devices & reserved:
                    continue
                if not self._devices_free(t) or not self._fits_memory(t):
                    reserved |= t.devices
                    continue
                chosen = t
                break
            if chosen is None:
                return out
            self._launch(chosen)
            out.append(Launch(chosen.id))

    def _in_flight_ancestors(self, t: _Task) -> frozenset[int]:
        out: set[int] = set()
        for a in t.after:
            if a in self._ancestors:
                out.add(a)
                out |= self._ancestors[a]
        return frozenset(out)

    def _devices_free(self, t: _Task) -> bool:
        # Free, or busy only with t's own ancestors (or its own program's computations, with
        # program_ahead), and not too deep. A copy never needs its devices to itself.
        if t.copy:
            return True
        ancestors = None
        same_group = self.program_ahead and t.group is not None
        for d in t.devices:
            queue = self._busy.get(d)
            if queue:
                if len(queue) >= self.depth:
                    return False
                if same_group and all(self._tasks[q].group == t.group for q in queue):
                    continue
                if ancestors is None:
                    ancestors = self._in_flight_ancestors(t)
                if not ancestors.issuperset(queue):
                    return False
        return True

    def _launch(self, t: _Task) -> None:
        del self._ready[t.id]
        if t.copy:  # it takes its memory and is done here: it never occupies the devices
            del self._tasks[t.id]
            self._drop(t)
            if self.memory_budget is not None:
                for d in t.devices:
                    self._memory[d] += t.memory
            return
        self._ancestors[t.id] = self._in_flight_ancestors(t)
        for d in t.devices:
            self._busy.setdefault(d, []).append(t.id)
            if self.memory_budget is not None:
                self._memory[d] += t.memory
        client = self._clients[t.client]
        self._vtime = max(self._vtime, client.passes)
        t.charged = self._estimate(t)
        client.passes += t.charged / client.weight

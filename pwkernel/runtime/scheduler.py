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
  scheduling: the lowest pass value goes next); the clients' accounts, what a launch is
  charged and how its end corrects it live in ``runtime/clients.py``.

A ready computation that cannot start (its devices are busy, or its outputs would exceed the
memory budget) reserves its devices: later computations may use other devices (backfill) but
never jump ahead of it on its own, so nothing starves (but for ``Backfill``: see events.py).

A program's computations on one island arrive in one event (``SubmitProgram``), each naming the
computations of the same program it reads from directly (``waits``): such a computation becomes
ready the moment its producers are *launched*, inside this state machine, so one event can
launch a whole chain (up to ``depth``) without a round trip per node.

The order is kept incrementally: each client's ready computations sit in a list sorted by the
policy's key (binary insertion), merged by a scheduling pass that stops once every device is
reserved. These lists are the only record of what is ready, and each device's queue of
computations in flight (``_busy``) the only record of what runs.

With a memory budget, copies onto the island (``Submit(copy=True)``: uploads and transfers) are
admitted here too, in the same order, once their bytes fit (counted until ``MemoryFreed``); a
computation fits once its bytes less its ``credit`` (counted buffers it donates) do, and is
counted so: the donated bytes' own ``MemoryFreed``, later, settles what it owes. Whether
waiting is hopeless is the runtime's call (``waiting_for_memory``, ``runtime.budget``).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from .clients import ClientAccount, ClientLedger
from .events import (  # noqa: F401 - the scheduler's vocabulary, re-exported
    Backfill,
    Cancel,
    ClientSpec,
    Ended,
    Finished,
    Forget,
    Launch,
    MemoryFreed,
    NodeSpec,
    Policy,
    Ready,
    Reject,
    SetPolicy,
    Submit,
    SubmitProgram,
)


@dataclass(slots=True, eq=False)
class _Task:
    id: int
    seq: int
    devices: frozenset[int]
    client: ClientAccount  # its client's state (one per client name)
    priority: int
    cost_key: Hashable
    memory: int
    after: tuple[int, ...] = ()  # task ids less ``base`` (a program node's ``after`` as is)
    base: int = 0
    group: Hashable = None
    pending: int = 0  # conditions before it is ready: its Ready event, producers to launch
    external: bool = False  # still waits for its Ready event
    dependents: list | None = None  # tasks whose ``waits`` name this one
    copy: bool = False  # a copy onto the island: it needs only memory
    credit: int = 0  # of ``memory``: counted bytes it donates, given back as it launches
    # the weight its client had in the event that submitted it: what its launch is charged
    # at and its end settled at, whatever weight the name is given meanwhile
    weight: float = 1.0
    # set when it launches (``ClientLedger.charge``), handed back when it ends: its estimate,
    # and the same if it was never seen yet (else 0)
    charged: float = field(init=False, repr=False)
    guessed: float = field(init=False, repr=False)


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
    _busy: dict[int, list[int]] = field(default_factory=dict)  # device -> in flight, in order
    _memory: dict[int, int] = field(default_factory=dict)
    _owed: dict[int, int] = field(default_factory=dict)  # device -> credit not yet given back
    _ledger: ClientLedger = field(default_factory=ClientLedger)  # clients, estimates, vtime
    _seq: int = 0

    def __post_init__(self) -> None:
        self.devices = tuple(self.devices)
        self._device_set = frozenset(self.devices)
        self.policy = Policy.parse(self.policy)
        self._memory = {d: 0 for d in self.devices}
        self._owed = {d: 0 for d in self.devices}
        self._busy = {d: [] for d in self.devices}
        self._clients = self._ledger.clients  # (name -> account; read on every pass)

    # --- the one entry point ---------------------------------------------------------------
    def handle(self, *events) -> list[Launch | Reject]:
        """Apply ``events`` in order and return the decisions they lead to, in order."""
        out: list[Launch | Reject] = []
        changed = False  # could anything launch now that could not before?
        for event in events:
            kind = type(event)  # by frequency; exact types: events are final dataclasses
            if kind is Ended:
                self._end(event.task, event.seconds)
                changed = True
            elif kind is Ready:
                task = self._tasks.get(event.task)
                if task is not None and task.external:
                    task.external = False
                    if event.after:
                        task.after, task.base = tuple(event.after), 0
                    task.credit += event.credit
                    task.pending -= 1
                    if task.pending == 0:
                        self._make_ready(task)
                        changed = True
            elif kind is SubmitProgram:
                changed |= self._submit_program(event, out)
            elif kind is Submit:
                changed |= self._submit(event, out)
            elif kind is MemoryFreed:
                self._freed(event.device, event.nbytes)
                changed = True
            elif kind is Cancel:  # (one launched and not ended is in its devices' queues)
                task = self._tasks.get(event.task)
                if task is not None and not any(task.id in self._busy[d] for d in task.devices):
                    self._drop(task)
                    changed = True
            elif kind is SetPolicy:
                self._set_policy(Policy.parse(event.policy))
                changed = True
            elif kind is Forget:
                self._ledger.forget(event.client, event.cost_keys)
            elif kind is Backfill:
                self._backfill(out)
                changed = True
            else:
                raise TypeError(f"GangScheduler cannot handle {event!r}")
        if changed:  # a pass; with one client, its list is the order (its dependents join it)
            sole = self._ledger.sole
            if sole is None:
                self._schedule(out)
            elif sole.ready:
                self._pass_one(sole.ready, out)
        return out

    # --- queries ---------------------------------------------------------------------------
    @property
    def running(self) -> tuple[int, ...]:
        """Launched and not yet ended, oldest first."""
        return tuple(sorted(self._launched(), key=lambda t: self._tasks[t].seq))

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(sorted(set(self._tasks) - self._launched(), key=lambda t: self._tasks[t].seq))

    def _launched(self) -> set[int]:
        return {t for queue in self._busy.values() for t in queue}

    def busy(self, devices: Iterable[int]) -> bool:
        """Whether a computation is in flight (launched, not ended) on any of ``devices``."""
        return any(self._busy[d] for d in devices)

    def memory_in_use(self) -> dict[int, int]:
        return dict(self._memory)

    def waiting_for_memory(self) -> list[tuple[int, frozenset[int], int]]:
        """``(task, devices, bytes)`` of each ready computation or copy that is next on its
        devices and waits only for memory, in policy order."""
        out, reserved = [], set()
        for t in self._in_order():
            if t.devices & reserved:
                continue
            reserved |= t.devices
            if self._devices_free(t) and not self._fits_memory(t):
                out.append((t.id, t.devices, t.memory - t.credit))
        return out

    def _in_order(self) -> list[_Task]:
        """The ready tasks in policy order now (a snapshot: for queries, not scheduling)."""
        share = self.policy is Policy.SHARE
        keyed = [((c.passes, key) if share else key, t)
                 for c in self._clients.values() for key, t in c.ready]
        return [t for _, t in sorted(keyed)]

    def shares(self) -> dict[str, float]:
        """Each client's fraction of the device-seconds charged so far."""
        return self._ledger.shares()

    # --- transitions -----------------------------------------------------------------------
    def _submit(self, ev: Submit, out: list) -> bool:
        devices, island, budget = frozenset(ev.devices), self._device_set, self.memory_budget
        if not (devices and devices <= island and (budget is None or ev.memory <= budget)):
            out.append(Reject.refusing(ev.task, devices, ev.memory, self.devices, budget))
            return False
        client = self._ledger.client(ev.client)
        client.active += 1
        task = _Task(ev.task, self._seq, devices, client, ev.client.priority, ev.cost_key,
                     ev.memory, tuple(ev.after), 0, ev.group, copy=ev.copy, credit=ev.credit,
                     weight=client.weight)
        self._seq += 1
        self._tasks[ev.task] = task
        if ev.ready:
            self._make_ready(task)
            return True
        task.pending, task.external = 1, True
        return False

    def _submit_program(self, ev: SubmitProgram, out: list) -> bool:
        client = self._ledger.client(ev.client)
        priority, group, weight = ev.client.priority, ev.group, client.weight
        tasks, base, seq, ready = self._tasks, ev.base, self._seq, False
        island, budget = self._device_set, self.memory_budget
        for spec in ev.nodes:
            tid, devices = base + spec.index, spec.devices
            if not (devices and devices <= island and (budget is None or spec.memory <= budget)):
                out.append(Reject.refusing(tid, devices, spec.memory, self.devices, budget))
                continue
            task = _Task(tid, seq, devices, client, priority, spec.cost_key, spec.memory,
                         spec.after, base, group, credit=spec.credit, weight=weight)
            seq += 1
            pending = 0
            for w in spec.waits:  # (one refused above is not among tasks: its dependents
                pending += 1      # wait for the runtime to cancel them)
                producer = tasks.get(base + w)
                if producer is not None:
                    if producer.dependents is None:
                        producer.dependents = [task]
                    else:
                        producer.dependents.append(task)
            if spec.external:
                pending += 1
                task.external = True
            task.pending = pending
            tasks[tid] = task
            if not pending:
                self._make_ready(task)
                ready = True
        client.active += seq - self._seq  # (one per task taken)
        self._seq = seq
        return ready

    def _key(self, t: _Task) -> tuple[int, int] | int:  # (its place in its client's list)
        return (-t.priority, t.seq) if self.policy is Policy.PRIORITY else t.seq

    def _make_ready(self, t: _Task) -> None:
        key = (-t.priority, t.seq) if self.policy is Policy.PRIORITY else t.seq
        client = t.client
        ready = client.ready
        if not ready and not client.running:  # its work waited for inputs: no credit banked
            self._ledger.rejoin(client)
        if not ready or ready[-1][0] < key:
            ready.append((key, t))
        else:
            bisect.insort(ready, (key, t))
        self._ledger.joined(t.devices)

    def _unready(self, t: _Task) -> None:
        ready = t.client.ready
        i = bisect.bisect_left(ready, (self._key(t), t))
        if i < len(ready) and ready[i][1] is t:
            del ready[i]
            self._ledger.left(t.devices)

    def _set_policy(self, policy: Policy) -> None:
        self.policy = policy
        for client in self._clients.values():
            client.ready = sorted((self._key(t), t) for _, t in client.ready)  # (keys unique)

    def _end(self, task: int, seconds: float) -> None:
        t = self._tasks.get(task)
        if t is None:
            return
        for d in t.devices:  # (a launched task is in the queue of each of its devices)
            queue = self._busy[d]
            if queue and queue[0] == task:  # (ends come in launch order: the usual case)
                del queue[0]
            elif task in queue:
                queue.remove(task)
            else:  # (the first device already: nothing has changed)
                raise ValueError(f"Ended(task={task}): task {task} was never launched, so it "
                                 f"cannot end; take a task that will not run out with "
                                 f"Cancel(task={task}).")
        del self._tasks[task]
        actual = (seconds if seconds > 0.0 else 0.0) * len(t.devices)
        client = t.client
        client.active -= 1
        client.running -= 1
        self._ledger.settle(client, t.cost_key, actual, t.charged, t.guessed, t.weight)

    def _drop(self, t: _Task) -> None:
        del self._tasks[t.id]
        self._unready(t)
        t.client.active -= 1
        t.pending = -1  # never ready, whichever of its producers launches

    def _freed(self, device: int, nbytes: int) -> None:
        """Bytes freed on ``device``: first what launches were let in on (their credit, taken
        off when they launched) comes back, then the count goes down by the rest."""
        owed = self._owed[device]
        if owed:
            settled = min(owed, nbytes)
            self._owed[device] = owed - settled
            nbytes -= settled
        self._memory[device] = max(0, self._memory[device] - nbytes)

    def _fits_memory(self, t: _Task) -> bool:
        if self.memory_budget is None or not t.memory:
            return True
        return all(self._memory[d] + t.memory - t.credit <= self.memory_budget for d in t.devices)

    def _schedule(self, out: list) -> None:
        """Passes over the ready computations in policy order, launching each that can start
        and reserving the devices of each that cannot, until one pass launches nothing (of
        several clients; ``handle`` passes over the one client's list itself)."""
        while True:
            clients = [c for c in self._clients.values() if c.ready]
            if not clients:
                return
            if len(clients) == 1:
                self._pass_one(clients[0].ready, out)
                return
            if not self._pass_many(clients, out):
                return

    def _pass_one(self, ready: list, out: list) -> None:
        reserved: set[int] | None = None
        i = skipped = 0
        while i < len(ready):
            t = ready[i][1]
            if reserved is not None and not reserved.isdisjoint(t.devices):
                i += 1
                skipped += 1  # (a look at every ready set costs no more than these skips)
                if skipped >= len(self._ledger.ready_sets):
                    if self._ledger.blocked(reserved):
                        return
                    skipped = 0
                continue
            if not self._devices_free(t) or (self.memory_budget is not None
                                             and not self._fits_memory(t)):
                if reserved is None:
                    reserved = set()
                reserved |= t.devices
                if len(reserved) == len(self.devices):
                    return
                i += 1
                continue
            del ready[i]
            self._ledger.left(t.devices)
            self._launch(t, out)  # its dependents join the list after position i

    def _pass_many(self, clients: list[ClientAccount], out: list) -> bool:
        """The clients' lists merged by the policy's order. Under ``share`` a launch changes
        its client's place: True asks for another pass."""
        share = self.policy is Policy.SHARE
        everything = len(self.devices)
        cursor = dict.fromkeys(map(id, clients), 0)
        reserved, skipped = set(), 0
        while True:
            best, best_rank = None, None
            for c in clients:
                i, ready = cursor[id(c)], c.ready
                if reserved:  # what reserved devices block stays blocked all pass; skipping it
                    while i < len(ready) and not reserved.isdisjoint(ready[i][1].devices):
                        i += 1  # here (lists are in rank order) spares a look at every client
                        skipped += 1  # (as in _pass_one)
                        if skipped >= len(self._ledger.ready_sets):
                            if self._ledger.blocked(reserved):
                                return False
                            skipped = 0
                    cursor[id(c)] = i
                if i < len(ready):
                    rank = (c.passes, ready[i][0]) if share else ready[i][0]
                    if best is None or rank < best_rank:
                        best, best_rank = c, rank
            if best is None:
                return False
            i = cursor[id(best)]
            t = best.ready[i][1]
            if not self._devices_free(t) or not self._fits_memory(t):
                reserved |= t.devices
                cursor[id(best)] = i + 1
                if len(reserved) == everything:
                    return False
                continue
            del best.ready[i]
            self._ledger.left(t.devices)
            self._launch(t, out)
            if share:
                return True

    def _backfill(self, out: list) -> None:
        """One pass in policy order in which what waits only for memory reserves nothing
        (``Backfill``): launches stay one sequence, so the gang order holds."""
        reserved: set[int] = set()
        for t in self._in_order():
            if not reserved.isdisjoint(t.devices):
                continue
            if not self._devices_free(t):
                reserved |= t.devices
            elif self._fits_memory(t):
                self._unready(t)
                self._launch(t, out)

    def _is_ancestor(self, a: int, t: _Task) -> bool:
        """Does ``t`` read ``a``'s outputs, directly or through computations of this island
        still known here? (A link through one already ended is missed: ``t`` then waits,
        which is safe.)"""
        if a - t.base in t.after:  # (``_devices_free`` has this first look inline)
            return True
        tasks, seen = self._tasks, set()
        todo = [t.base + x for x in t.after]
        while todo:
            x = todo.pop()
            if x == a:
                return True
            if x not in seen:
                seen.add(x)
                xt = tasks.get(x)
                if xt is not None:
                    todo += [xt.base + y for y in xt.after]
        return False

    def _devices_free(self, t: _Task) -> bool:
        # Free, or busy only with t's own ancestors (or its own program's computations, with
        # program_ahead), and not too deep. A copy never needs its devices to itself.
        # Everything queued on a device is an ancestor of what was launched after it there
        # (that is how it got there), so without program_ahead the last one decides for all.
        if t.copy:
            return True
        for d in t.devices:
            queue = self._busy[d]
            if queue:
                if len(queue) >= self.depth:
                    return False
                if not self.program_ahead:
                    last = queue[-1]
                    if last - t.base not in t.after and not self._is_ancestor(last, t):
                        return False
                    continue
                if t.group is not None and all(self._tasks[q].group == t.group for q in queue):
                    continue
                if not all(self._is_ancestor(q, t) for q in queue):
                    return False
        return True

    def _launch(self, t: _Task, out: list) -> None:
        """``t`` starts (its caller took it out of its client's ready list, and the count)."""
        tid = t.id
        if self.memory_budget is not None:
            # Counted net of its credit: XLA reuses what it donates for its outputs, so the
            # count never reads above the budget for a launch that fit; the donated bytes'
            # own give-back, later, settles what is owed (``_freed``).
            credit = min(t.credit, t.memory)
            for d in t.devices:
                self._memory[d] += t.memory - credit
                self._owed[d] += credit
        if t.copy:  # it takes its memory and is done here: it never occupies the devices
            del self._tasks[tid]
            t.client.active -= 1
            out.append(Launch(task=tid))
            return
        for d in t.devices:
            self._busy[d].append(tid)
        t.client.running += 1
        t.charged, t.guessed = self._ledger.charge(t.client, t.cost_key, len(t.devices),
                                                   t.weight)
        out.append(Launch(task=tid))
        if t.dependents:
            for dep in t.dependents:  # (a dropped one stays below zero)
                dep.pending -= 1
                if not dep.pending:
                    self._make_ready(dep)

"""One island's gang scheduler, fed from any thread, and the order its launches leave in.

``IslandQueue`` owns an island's ``GangScheduler`` (the pure state machine) and the tasks it
has queued. Any thread may post events; the decisions are taken under the island's lock and
handed to the executor in exactly the order the scheduler made them: one thread at a time
drains them (whoever finds nobody draining), and a thread that posts while another drains
just leaves its launches to it. No lock is held while the executor launches, and a launch that
leads to more launches on the same island (a chain, an end seen at once) adds them to the
queue instead of recursing.

The queue knows tasks only by their ids and their runs, not a controller: its tasks may come
from any number of clients. It changes no task's state itself: it asks the task for the move
(``tasks.py``), and the task's run asks its own owner for what follows (a copy admitted, work
in flight counted). Each computation it launches joins its device set's launch order
(``ends.py``), in decision order, so ends are reported in that order whatever the backend.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any

from . import budget
from .ends import EndOrder
from .errors import MemoryBudgetError, MemoryWaitWarning
from .events import (
    Backfill,
    Cancel,
    Ended,
    Launch,
    MemoryFreed,
    Policy,
    Ready,
    SetPolicy,
    Submit,
    SubmitProgram,
)
from .objects import BufferRecord
from .scheduler import GangScheduler
from .tasks import ProgramRun, Task, TaskState

if TYPE_CHECKING:
    from .executor import Executor
    from .resources import Island

_log = logging.getLogger("pwkernel")
_get_ident = threading.get_ident


class IslandQueue:
    """One island's scheduler and its queued tasks (see the module docstring)."""

    def __init__(self, island: Island, executor: Executor, policy, memory_budget):
        self.island = island
        self.executor = executor
        self.scheduler = GangScheduler(island.device_ids, policy, memory_budget,
                                       program_ahead=executor.program_ahead)
        self._lock = threading.RLock()
        self._tasks: dict[int, Task] = {}
        self._handling = False
        self._deferred: list = []
        self._todo: list[Task] = []
        self._draining = False
        # the thread draining now, and the ends it reported meanwhile (without a memory
        # budget): its drain loop hands them to the scheduler together, between launches
        self._drainer: int | None = None
        self._ends: list[Ended] = []
        self._gathers = memory_budget is None
        self._paused = 0
        self.ends = EndOrder()  # launch order per device set, for reporting ends
        # under a budget, the heads found waiting for memory only the user can free (by
        # task id), those already told of (``MemoryWaitWarning``), and what to tell next
        self._on_user: dict[int, budget.Waiting] = {}
        self._told: set[int] = set()
        self._tell: tuple[str, list[int]] | None = None

    # --- what the dispatcher and the task life post ----------------------------------------
    def submit_program(self, tasks: list[Task], event: SubmitProgram,
                       ready: list[Task]) -> None:
        """A run's computations on this island, with those whose inputs are already there."""
        t, mine, ended = self.executor.now(), self._tasks, None
        with self._lock:
            for task in tasks:
                if not task.enqueue():  # a failure on another island spread to it first
                    ended = [task] if ended is None else ended + [task]
                task.t_submit = t
                mine[task.id] = task
        if ready:
            self.post(event, *map(self._ready, ready))
        else:
            self.post(event)
        if ended:  # the scheduler knows the whole program; it forgets those at once
            self.cancel(*ended)

    def submit(self, task: Task, event: Submit) -> None:
        """One computation whose inputs exist (sequential dispatch)."""
        with self._lock:
            task.t_submit = self.executor.now()
            self._tasks[task.id] = task
        self.post(event)

    def ready(self, task: Task) -> None:
        self.post(self._ready(task))

    def _ready(self, task: Task) -> Ready:
        """The event saying ``task``'s inputs are there, with its ``argument_credit``."""
        # Its producers of other runs matter only if one is still in flight on its devices:
        # it is ready, so they launched (and are in their devices' queues) before now, and
        # no other ancestor of it can join those queues any more.
        node = task.node
        after = task.run.after(task) if node.foreign and self.scheduler.busy(node.devices) \
            else ()
        return Ready(task=task.id, after=after, credit=self.argument_credit(task))

    def argument_credit(self, task: Task) -> int:
        """Under a memory budget, the counted bytes of the arguments ``task`` donates, given
        back when it launches (``Ready.credit``, ``Submit.credit``); else 0."""
        node = task.node
        return task.run.argument_credit(node) if (
            node.donated_args and self.scheduler.memory_budget is not None) else 0

    def ended(self, task: Task, seconds: float) -> None:
        """A launched computation ended: its devices are free. Seen by the thread draining
        this island (a launch that completed at once), the end joins its drain loop's next
        step with the others seen meanwhile: one scheduler pass for them all, not one each.
        Under a memory budget it goes at once (an idle check must see the devices free)."""
        if self._drainer == _get_ident():  # (set only without a budget)
            self._ends.append(Ended(task=task.id, seconds=seconds))  # (only this thread's)
            return
        self.post(Ended(task=task.id, seconds=seconds))

    def cancel(self, *tasks: Task) -> list[Task]:
        """Drop those of ``tasks`` not yet launched, all in one step of the scheduler (so
        dropping one cannot let another of them launch); returns the ones dropped."""
        dropped = []
        with self._lock:
            for task in tasks:
                if self._tasks.pop(task.id, None) is not None:
                    task.drop()
                    dropped.append(task)
        if dropped:
            self.post(*[Cancel(task=task.id) for task in dropped])
        return dropped

    def release_memory(self, devices, nbytes: int) -> None:
        if nbytes and self.scheduler.memory_budget is not None:
            self.post(*(MemoryFreed(device=d, nbytes=nbytes) for d in devices))

    def set_policy(self, policy: Policy) -> None:
        self.post(SetPolicy(policy=policy))

    def backfill(self) -> bool:
        """Nothing runs anywhere and work waits for memory: launch ready work that fits past
        what waits (``Backfill``). True if something launched."""
        if self.scheduler.memory_budget is None:
            return False
        return self.post(Backfill()) > 0

    # --- the one place decisions are taken -------------------------------------------------
    def post(self, *events) -> int:
        """Feed events to the scheduler and hand its launches to the executor, in order.
        Returns how many launches they led to (0 when left to the ``post`` under way)."""
        with self._lock:
            if self._handling:  # re-entered from a GC finalizer freeing memory mid-handle
                self._deferred.extend(events)
                return 0
            self._handling = True
            try:
                decisions = self.scheduler.handle(*events)
                while self._deferred:
                    more, self._deferred = self._deferred, []
                    decisions += self.scheduler.handle(*more)
            finally:
                self._handling = False
            rejects = copies = None  # (a decision or two at a time, mostly: nothing hoisted)
            launches, lines = 0, self.ends.lines
            for decision in decisions:
                task = self._tasks.pop(decision.task)
                if type(decision) is Launch:
                    launches += 1
                    node = task.node
                    if node.is_compute:
                        line = lines.get(node.devices)  # (a Line with nothing in it is falsy)
                        task.launch(line if line is not None else self.ends.line(node.devices))
                        self._todo.append(task)
                        if self.scheduler.memory_budget is not None:
                            task.run.owner.work_began()
                    else:  # a copy admitted under the memory budget
                        task.launch(None)
                        copies = [task] if copies is None else copies + [task]
                elif task.drop():  # (False: a failure upstream ended it already)
                    if rejects is None:
                        rejects = []
                    rejects.append((task, decision.reason))
            drain = self._claim() if self._todo else False  # (mostly nothing waits)
        if rejects:
            for task, reason in rejects:
                what = task.node.name if task.node.is_compute else (
                    f"the copy {task.node.name} onto devices {list(task.node.devices)}")
                task.run.fail(task, MemoryBudgetError(
                    f"{what} on island {self.island.id}: {reason}"), dropped=True)
        if copies:
            for task in copies:
                task.run.owner.start_copy(task)
        if drain:
            self._drain()
        return launches

    def pause(self) -> None:
        """Take decisions but launch nothing until ``resume()`` (while a run is submitted to
        every island, so no launch reaches an island that does not know the run yet)."""
        with self._lock:
            self._paused += 1

    def resume(self) -> None:
        with self._lock:
            self._paused -= 1
            drain = self._claim()
        if drain:
            self._drain()

    def _claim(self) -> bool:
        """Under the lock: become the thread that drains, if launches wait and nobody does."""
        if self._todo and not self._draining and not self._paused:
            self._draining = True
            return True
        return False

    def _drain(self) -> None:
        launch, island = self.executor.launch, self.island.id
        interrupted, me = None, _get_ident()
        while True:
            try:
                if self._ends:  # (appended by this thread only: see ``ended``)
                    ends, self._ends = self._ends, []
                    self.post(*ends)  # (what they launch joins ``_todo``: this loop's)
                with self._lock:
                    todo = self._todo
                    if not todo:
                        if self._ends:  # (a post above saw more of them at once)
                            continue
                        self._draining = False
                        self._drainer = None
                        break
                    self._todo = []
                    # (one launch's end is posted at once: nothing to gather it with)
                    self._drainer = me if len(todo) > 1 and self._gathers else None
                launch(island, todo)
            except BaseException as e:  # noqa: BLE001 - keep draining; raise it after
                if isinstance(e, Exception):
                    _log.exception("island %s: launching failed", island)
                else:
                    interrupted = e
        if interrupted is not None:
            raise interrupted

    # --- the memory budget -----------------------------------------------------------------
    def memory_stuck(self, dispatcher, freed_by_user: frozenset[int] = frozenset()
                     ) -> tuple[ProgramRun, MemoryBudgetError] | None:
        """When nothing runs or is in flight anywhere: the program run to fail because work
        here waits for memory that only work which cannot run would free (``runtime.budget``),
        with its error; None when nothing here is stuck. ``freed_by_user``: runs whose work
        waits on another island for memory the user can free (``waits_for_user``): what they
        pin here goes once it runs."""
        live = None  # futures held here are dropped after the lock: a free posts events
        try:
            with self._lock:
                facts = self._memory_facts(dispatcher)
                if facts is None:
                    return None
                limit, heads, in_use, held, runs, live = facts
                found = budget.stuck(heads, limit, in_use, held,
                                     {t.run.id for t in self._tasks.values()}, freed_by_user)
                if found is None:
                    return None
                head, victim_id = found
                victim = runs[victim_id]
                text = budget.message(head, f"program {victim.name!r} (run {victim.id}, "
                                            f"client {victim.client!r})", limit, in_use, held)
                return victim, MemoryBudgetError(text)
        finally:
            del live

    def waits_for_user(self, dispatcher) -> set[int]:
        """When nothing runs anywhere and work here waits for memory that the user's frees
        would make (back-pressure: it waits for them): the runs with work queued here, which
        may go on once it has. Else none."""
        live = None
        try:
            with self._lock:
                facts = self._memory_facts(dispatcher)
                if facts is None:
                    self._tell = None
                    return set()
                limit, heads, in_use, held, _, live = facts
                fits = [w for w in heads if budget.fits_once_user_frees(w, limit, in_use, held)]
                self._on_user = {w.task: w for w in fits}
                self._told &= self._on_user.keys()  # one no longer waiting: its wait is over
                new = [w for w in fits if w.task not in self._told]
                self._tell = (budget.wait_message(new[0], limit, in_use, held, len(fits) - 1),
                              [w.task for w in fits]) if new else None
                return {t.run.id for t in self._tasks.values()} if fits else set()
        finally:
            del live

    def tell_user(self) -> None:
        """Nothing is stuck anywhere: what waits here for memory waits for the user's frees.
        Say so (``MemoryWaitWarning``) for heads not told of yet: once per wait, not per
        look."""
        with self._lock:
            tell, self._tell = self._tell, None
            if tell is not None:
                self._told.update(tell[1])
        if tell is not None:
            try:
                warnings.warn(tell[0], MemoryWaitWarning, stacklevel=1)
            except Exception:  # noqa: BLE001 - a filter made it an error: the runtime goes on
                _log.warning("%s", tell[0])

    def _memory_facts(self, dispatcher):
        """(budget, waiting heads, memory in use, live buffers, runs by id, the store's live
        futures) when work here waits for memory and nothing runs anywhere; else None.
        Called under the island's lock."""
        limit = self.scheduler.memory_budget
        waiting = self.scheduler.waiting_for_memory() if limit is not None else []
        if not waiting or not dispatcher.idle():
            return None
        runs = {r.id: r for r in dispatcher.all_runs()}
        runs |= {t.run.id: t.run for t in self._tasks.values()}
        live = dispatcher.store.live()
        mine = set(self.island.device_ids)
        held = _held(self.island.id, runs.values(), live,
                     lambda nbytes: self.island.id if mine & nbytes.keys() else None)
        heads = []
        for tid, devices, nbytes in waiting:
            run = self._tasks[tid].run
            heads.append(budget.Waiting(self._tasks[tid].node.name, self.island.id, devices,
                                        nbytes, run.id, run.name, run.client, tid))
        return limit, heads, self.scheduler.memory_in_use(), held, runs, live

    # --- queries ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            on_user = self._on_user
            if on_user:  # (those of them still waiting for memory)
                waiting = {tid for tid, _, _ in self.scheduler.waiting_for_memory()}
                on_user = {t: w for t, w in on_user.items() if t in waiting}
            return {"running": len(self.scheduler.running), "queued": len(self.scheduler.queued),
                    "memory_reserved": self.scheduler.memory_in_use(),
                    "waiting_for_memory": tuple(on_user.values())}


def _held(island: int, runs, live, island_of) -> list[budget.Held]:
    """Every buffer on ``island`` with whether only the runtime can free it: the object
    store's (pinned while their program runs, or while a node not yet ended reads them) and
    the values runs keep in their slots (always pinned: no user holds them)."""
    reading: dict[int, dict[int, str]] = {}  # id(future) -> the runs reading it
    out: list[budget.Held] = []
    for run in runs:
        if run.values is None:
            continue
        for task in list(run.tasks):
            if task.state not in (TaskState.ENDED, TaskState.CANCELLED):
                for s in task.node.distinct:
                    fut = run.futures.get(s)
                    if fut is not None:
                        reading.setdefault(id(fut), {})[run.id] = run.name
        for nbytes in run.internal_bytes():
            if island_of(nbytes) == island:
                out.append(budget.Held(BufferRecord(nbytes, run.name, run.id, run.client, island,
                                                    True), True))
    ids = {r.id for r in runs}
    for rec, f in live:
        if rec.island == island:
            readers = () if rec.program_id in ids else tuple(sorted(reading.get(id(f), {}).items()))
            out.append(budget.Held(rec, rec.program_id in ids or bool(readers), readers,
                                   None if f is None else f.name))
    return out

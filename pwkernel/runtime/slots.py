"""A run's values: one slot per value of its graph, when each ended, who makes it, and the
arguments given as futures arriving.

``RunSlots`` is the part of a ``ProgramRun`` (``tasks.py``) that holds and answers questions
about values; it changes no task's state. Only the values the user sees (the program's
outputs, and futures passed in) are ``Future``s; the rest live in ``values`` until their last
reader ends, or (where a launch holds its inputs) until it launches: ``LET_GO`` then marks the
slot, so its end gives the bytes back without deleting anything.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import jax

from .objects import Future

if TYPE_CHECKING:
    from .plan import Plan, PlanNode

#: a slot whose value its run let go of once its last reader launched (``RunSlots.let_go``)
LET_GO = object()
_OVER = ("done", "cancelled")  # the states a task leaves RUNNING for (``tasks.TaskState``)


class ArgumentGroup:
    """A run's arguments given as futures of one producer still pending (a state of many
    leaves is one group): their slots and futures side by side, and the one of them its
    producer launches and resolves last (``watched``: when it has, all of them have)."""

    __slots__ = ("watched", "slots", "futures")

    def __init__(self, watched: Future):
        self.watched = watched
        self.slots: list[int] = []
        self.futures: list[Future] = []


class RunSlots:
    """The values of one run, by slot (see the module docstring). ``ProgramRun`` adds
    ``owner``, ``parallel`` and ``waiting`` (the count of inputs each node still waits for)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        n = plan.nslots
        self.values: list[Any] | None = [None] * n  # None once the run is over
        self.t_done: list[float | None] = [None] * n  # when each slot's value ended
        self.errors: dict[int, BaseException] = {}
        self.futures: dict[int, Future] = {}
        self.refs = list(plan.refs)
        self.tasks: list = []  # its Tasks (tasks.py), by node index; [] once it is over
        self.lock = threading.Lock()  # the run's: slot writes and task moves happen under it
        self._changed: threading.Condition | None = None  # made when someone waits on a value
        self._waiters = 0
        self._parked: dict[int, Any] = {}  # completions waiting for their inputs' ends
        self.given: set[int] | None = None  # made values a launch consumed (donated)

    def slot_error(self, slots) -> BaseException | None:
        """The error of the first of ``slots`` that failed, if any."""
        errors = self.errors
        if errors:
            for s in slots:
                if s in errors:
                    return errors[s]
        return None

    def slots_ended(self, slots, timeout: float | None = 0.0) -> float | None:
        """When the last of ``slots`` ended; None if one has not (after waiting up to
        ``timeout`` seconds; None waits as long as it takes)."""
        t_done = self.t_done
        latest = 0.0
        for s in slots:
            t = t_done[s]
            if t is None:
                break
            latest = t if t > latest else latest
        else:
            return latest
        if timeout == 0.0:
            return None
        with self.lock:
            if self._changed is None:
                self._changed = threading.Condition(self.lock)
            self._waiters += 1
            try:
                ok = self._changed.wait_for(lambda: all(t_done[s] is not None for s in slots),
                                            timeout)
            finally:
                self._waiters -= 1
        return max((t_done[s] for s in slots), default=0.0) if ok else None

    def producers(self, task, running: bool = True):
        """The computations whose outputs ``task`` reads, on any island (through transfers,
        and through arguments made by other runs): not yet ended, or (``running=False``) also
        those that have (one may have ended before its outputs' errors are recorded)."""
        todo = list(makers(task))
        seen: set[int] = set()
        while todo:
            t = todo.pop()
            if (running and t.has_ended) or t.id in seen:
                continue
            seen.add(t.id)
            if t.node.is_compute:
                yield t
            else:
                todo.extend(makers(t))

    def after(self, task) -> tuple[int, ...]:
        """The computations on ``task``'s island, still running, whose outputs it reads: it
        may queue behind them on its devices."""
        island = task.node.island
        return tuple(t.id for t in self.producers(task) if t.node.island == island)

    def slot_makers(self, slots, out: list, running: bool = True) -> None:
        """Append the tasks that make ``slots`` (each once in a row: a state of many leaves
        has one producer for all of them); with ``running``, only those not ended."""
        producer, tasks, futures, last = self.plan.producer, self.tasks, self.futures, None
        get = futures.get
        for s in slots:
            p = producer[s]
            if p >= 0:
                t = tasks[p] if tasks else None
            else:  # (a future's done() is asked only of a producer not just appended)
                fut = get(s)
                if fut is None:
                    continue
                t = fut.producer
                if t is None or t is last or (running and fut.done()):
                    continue
            if t is not None and t is not last:
                out.append(t)
                last = t

    def internal_bytes(self, counted: dict[int, tuple] | None = None) -> list[dict[int, int]]:
        """Bytes on each device of every value it keeps that is not a future (alive until
        its last reader ends). Read under the run's lock: a launch holds its outputs and marks
        the values it consumed in one step (``_hold_outputs``), and a read between the two
        counted a donated sum twice (a pipeline stage's rise read 2 MiB for 1).

        ``counted``: what the object store counted just before (``ObjectStore.memory``). A
        future a launch consumed (donated) is marked so only after the lock, once its outputs
        are held here (``_consume_donated``): one the store counted is taken back (its bytes,
        negative), read in the same step as the outputs that reuse its buffer."""
        plan, out = self.plan, []
        with self.lock:
            values, given = self.values, self.given or ()
            if values is None:
                return out
            for s, value in enumerate(values):
                p = plan.producer[s]
                if value is not None and p >= 0 and s not in self.futures and s not in given:
                    node = plan.nodes[p]
                    out.append(node.out_nbytes[node.outputs.index(s)])
            if counted and self.futures:
                self._take_back(counted, out)
        return out

    def _take_back(self, counted: dict[int, tuple], out: list) -> None:
        """Under the lock: the bytes, negative, of each future in ``counted`` that a launch
        whose outputs are held consumed, not yet marked ``donated`` (``internal_bytes``)."""
        futures = self.futures
        for task in self.tasks:
            node = task.node
            if task.has_outputs and node.donates:
                for s in self.consumed(node):
                    fut = futures.get(s)
                    if fut is not None and not fut.donated:
                        mine = counted.get(id(fut))
                        if mine is not None and mine[0] is fut:
                            del counted[id(fut)]  # (taken back once)
                            out.append({d: -n for d, n in mine[1].items()})

    def count_arrived(self, slots, gates_only: bool = False) -> list:
        """Count ``slots`` for the nodes that wait on them; returns those now complete.
        ``gates_only``: only for the donating nodes a reader's first output gates (the reader
        failed: its readers fail, what it gates may go)."""
        plan = self.plan
        counts = [] if gates_only else [plan.notify if self.parallel else plan.consumers]
        if plan.gates:  # (empty in a plan where nothing donates what an earlier node reads)
            counts.append(plan.gates)
        waiting, tasks, go = self.waiting, self.tasks, []
        with self.lock:
            for slot in slots:
                for readers in counts:
                    for c in readers[slot]:
                        waiting[c] -= 1
                        if not waiting[c]:
                            go.append(tasks[c])
        return go

    def on_launch(self, task, fn) -> bool:
        """Call ``fn()`` once ``task`` has launched, or ended without (failed, cancelled);
        False (``fn`` never called) if it has already. ``ProgramRun`` tells them
        (``tell_launched``) once its outputs are held, or it has left RUNNING."""
        with self.lock:
            if task.has_outputs or task.state.value in _OVER:
                return False
            if task.waiters is None:
                task.waiters = []
            task.waiters.append(fn)
            return True

    def tell_launched(self, task) -> None:
        """``task``'s waiters (``on_launch``), once."""
        with self.lock:
            waiters, task.waiters = task.waiters, None
        for fn in waiters or ():
            fn()

    def after_launch(self, index: int, earlier: RunSlots, task, release) -> None:
        """Node ``index`` waits for one more arrival (before the run starts): ``task`` of
        ``earlier`` (a run, maybe this one) launching or ending, which calls ``release(self,
        index)``: an earlier reader of what it donates (``read_order.py``), an earlier
        ordered computation (``effects_order.py``)."""
        with self.lock:
            self.waiting[index] += 1
        if not earlier.on_launch(task, partial(release, self, index)):
            self.count_released(index)  # launched already (never the last arrival)

    def count_released(self, index: int) -> list:
        """One arrival ``after_launch`` added came; returns ``[its task]`` if that completes
        it."""
        with self.lock:
            self.waiting[index] -= 1
            return [] if self.waiting[index] or not self.tasks else [self.tasks[index]]

    def inputs_arrived(self, group: ArgumentGroup) -> None:
        """Program arguments given as futures (an ``ArgumentGroup``) were launched (or
        resolved). A group's futures have one producer: they launch, resolve and fail
        together (``intake.take_arguments``), so one of them answers for all."""
        if group.watched.error is not None:
            return  # (failed: its end counts nothing as arrived)
        with self.lock:
            values = self.values
            if values is None:
                return
            came = []
            for slot, fut in zip(group.slots, group.futures, strict=True):
                if values[slot] is None:
                    values[slot] = fut.peek()
                    came.append(slot)
        if came:  # (none: its end was seen first and counted them, ``inputs_ended``)
            self.owner.arrived(self, *came)

    def inputs_ended(self, group: ArgumentGroup) -> None:
        """Program arguments given as futures (an ``ArgumentGroup``) resolved: their end
        times, or their errors. A value that arrives here first (the end was seen in another
        thread before the launch's hook ran here) is counted here: each slot once, by
        whichever of the two fills it."""
        failed, came = [], []
        first = group.watched  # (one producer: one end, one error; see ``inputs_arrived``)
        error, t = first.error, first.t_done
        with self.lock:
            values, errors, t_done = self.values, self.errors, self.t_done
            if values is None:
                return
            for slot, fut in zip(group.slots, group.futures, strict=True):
                if error is not None:
                    errors[slot] = error
                    failed.append(slot)
                elif values[slot] is None:
                    values[slot] = fut.peek()
                    came.append(slot)
                t_done[slot] = t
            if self._waiters:
                self._changed.notify_all()
            unparked = self._unpark() if self._parked else None
        if unparked:
            resume(unparked)
        for slot in failed:
            self.spread(slot, errors[slot])
        if not self.parallel:
            self.owner.arrived(self, *(s for s in group.slots if s not in failed))
        elif came:  # (its launch hook finds them filled and counts none)
            self.owner.arrived(self, *came)

    def park(self, task) -> float | None:
        """When ``task``'s inputs ended; None if one has not: then ``task`` is parked, and
        the end of its last input reports it (``ends.py``)."""
        slots, t_done, latest = task.node.inputs, self.t_done, 0.0
        for s in slots:  # (slots_ended, inline: this runs per computation)
            t = t_done[s]
            if t is None:
                break
            if t > latest:
                latest = t
        else:
            return latest
        with self.lock:
            t = self.slots_ended(slots)
            if t is None:
                self._parked[task.id] = task
            return t

    def _unpark(self) -> list[tuple[Any, float]]:
        """Under the lock: the parked tasks whose inputs have all ended now."""
        out = []
        for tid, task in list(self._parked.items()):
            t = self.slots_ended(task.node.inputs)
            if t is not None:
                del self._parked[tid]
                out.append((task, t))
        return out

    def let_go(self, node: PlanNode) -> None:
        """Under the lock, ``node`` launched: drop the values this run made that no other
        reader left needs and no future shows (``LET_GO`` takes their place). The launch holds
        their buffers until it has run, then XLA frees them, as it does an intermediate
        ``jax.jit``'s caller dropped; the last reader's end gives their counted bytes back."""
        refs, futures, values, donated = self.refs, self.futures, self.values, node.donated_slots
        for s in node.internal:  # (a donated one is the launch's: ``consumed`` reads it)
            if refs[s] == 1 and s not in futures and s not in donated and values[s] is not None:
                values[s] = LET_GO

    def _release_inputs(self, node: PlanNode) -> None:
        """The task has ended: inputs only runs of this program read are freed after their
        last reader (the user's values and futures are the object store's business)."""
        refs, futures, makers, dropped = self.refs, self.futures, self.plan.makers, None
        with self.lock:
            values, given = self.values, self.given or ()
            if values is None:
                return  # the run is over: its values went with it
            for s in node.internal:  # (made by this run: not an argument or a constant)
                refs[s] -= 1
                if not refs[s] and s not in futures:
                    value, values[s] = values[s], None
                    made = (None, 0) if s in given else makers[s]  # (None: given back)
                    if dropped is None:
                        dropped = [(value, *made)]
                    else:
                        dropped.append((value, *made))
        if dropped:
            self._free(dropped)

    def _free(self, dropped: list[tuple]) -> None:
        """Delete internal values' buffers and give their reserved memory back to the
        islands' schedulers (outside the run's lock: that may launch work)."""
        owner = self.owner
        budget = owner.memory_budget is not None  # (without one, nothing counts bytes)
        for value, producer, k in dropped:
            if value is None:
                continue
            if value is not LET_GO and hasattr(value, "delete"):
                try:
                    value.delete()
                except Exception:  # already deleted or donated: nothing left to free
                    pass
            if budget and producer is not None:
                nbytes = producer.out_nbytes[k]
                owner.release_memory(producer.island, list(nbytes),
                                     max(nbytes.values(), default=0))

    def consumed(self, node: PlanNode) -> tuple[int, ...]:
        """The slots ``node`` donated whose buffers its launch consumed: all of them when XLA
        reuses each (``PlanNode.reused``), else those not left valid: a ``jax.Array`` no
        output could take stays the caller's (``jax.jit`` warns that some donated buffers
        were not usable); a backend's handle is consumed as its backend says."""
        if node.reused:
            return node.donated_slots
        values, out = self.values, []
        for s in node.donated_slots if values is not None else ():
            value = values[s]
            is_deleted = getattr(value, "is_deleted", None)
            if value is not None and (is_deleted is None or is_deleted()):
                out.append(s)
        return tuple(out)

    def moved_and_consumed(self, node: PlanNode, consumed: tuple[int, ...]) -> list:
        """The caller's ``jax.Array``s that ``node``'s consumed donated slots were moved from
        (``PlanNode.moved``), as ``jax.jit``'s move consumes them: where the move could reuse
        a buffer of the array (a device holds the same block in both layouts: an uncommitted
        ``jnp`` array on the default device, moved to a slice of several devices), the
        donation consumes it with the copy. Only a plain argument (not a future: the
        store's), given once, whose copy the launch did consume."""
        values, futures, out = self.values, self.futures, []
        for s, src in node.moved if values is not None else ():
            value, moved = values[src], values[s]
            if (s in consumed and src not in futures and isinstance(value, jax.Array)
                    and isinstance(moved, jax.Array) and moved.is_deleted()
                    and sum(values[i] is value for i in self.plan.inputs) == 1):
                out.append(value)
        return out

    def taken(self, node: PlanNode) -> tuple[tuple[int, ...], list[tuple]]:
        """Under the lock, as ``node``'s outputs are held: the slots its launch consumed
        (``consumed``), and where the values among them this run made were made
        (``mark_given``: they hold no bytes from now on)."""
        consumed = self.consumed(node)
        return consumed, (self.mark_given(node, consumed) if node.donated_internal else [])

    def mark_given(self, node: PlanNode, consumed: tuple[int, ...]) -> list[tuple]:
        """Under the lock, as ``node``'s outputs are held: the values this run made that its
        launch consumed (donated) and no future shows hold no bytes from now on
        (``internal_bytes``), as XLA reuses their buffers for those outputs; returns where
        each was made (``plan.makers``), for ``give_back``. ``_release_inputs`` later frees
        them without giving anything back."""
        values, made = self.values, []
        if values is None:
            return made
        if self.given is None:
            self.given = set()
        for s in node.donated_internal:
            if values[s] is not None and s not in self.given and s in consumed:
                self.given.add(s)
                made.append(self.plan.makers[s])
        return made

    def give_back(self, made: list[tuple]) -> None:
        """Under a memory budget: the bytes counted for values ``mark_given`` marked go back
        to their islands' schedulers now, not when their last reader ends."""
        for producer, k in made if self.owner.memory_budget is not None else ():
            nbytes = producer.out_nbytes[k]
            self.owner.release_memory(producer.island, list(nbytes),
                                      max(nbytes.values(), default=0))

    def argument_credit(self, node: PlanNode) -> int:
        """Bytes per device a memory budget counts of the arguments ``node`` donates: those
        that are futures the runtime made and no launch consumed yet (``plan._donated``)."""
        futures, credit, room = self.futures, 0, node.credit_room
        for s, nbytes in node.donated_args:
            fut = futures.get(s)
            if fut is not None and fut.producer is not None and not fut.donated:
                credit += nbytes
        return credit if room is None or credit < room else room


def makers(task) -> list:
    """The tasks that make ``task``'s inputs, ended or not (each once in a row), found once
    per task while it has not ended (a run's plan and its argument futures fix them; an
    ended task keeps none, so no chain of past steps' tasks stays alive through it)."""
    out = task.makers
    if out is None:
        out = []
        task.run.slot_makers(task.node.distinct, out, running=False)
        task.makers = out
        if task.has_ended:  # (its end came meanwhile; it clears this after its move)
            task.makers = None
    return out


def resume(unparked: list[tuple[Any, float]]) -> None:
    """Report the parked completions whose inputs have ended (outside the run's lock)."""
    for task, t_inputs in unparked:
        line = task.line
        if line is None:
            task.report_end(t_inputs)
        else:
            line.pump()

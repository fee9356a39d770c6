"""A run's values: one slot per value of its graph, when each ended, who makes it, and the
arguments given as futures arriving.

``RunSlots`` is the part of a ``ProgramRun`` (``tasks.py``) that holds and answers questions
about values; it changes no task's state. Only the values the user sees (the program's
outputs, and futures passed in) are ``Future``s; the rest live in ``values`` until their last
reader ends.
"""

from __future__ import annotations

import functools
import operator
import threading
from itertools import chain, compress, filterfalse, repeat, starmap
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from .batch import MANY, exhaust, not_none
from .errors import ControllerClosedError, ProgramError
from .objects import Columns, Future

if TYPE_CHECKING:
    from .graph import Graph
    from .plan import Plan, PlanNode

_order_of = operator.attrgetter("order")
_made_here = functools.partial(operator.le, 0)  # a slot's producer: a node of this plan


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
        ends = list(map(t_done.__getitem__, slots))
        if None not in ends:
            return max(max(ends, default=0.0), 0.0)
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
        todo: list = []
        self.slot_makers(task.node.distinct, todo, running)
        seen: set[int] = set()
        while todo:
            t = todo.pop()
            if (running and t.has_ended) or t.id in seen:
                continue
            seen.add(t.id)
            if t.node.is_compute:
                yield t
            else:
                t.run.slot_makers(t.node.distinct, todo, running)

    def after(self, task) -> tuple[int, ...]:
        """The computations on ``task``'s island, still running, whose outputs it reads: it
        may queue behind them on its devices."""
        island = task.node.island
        return tuple(t.id for t in self.producers(task) if t.node.island == island)

    def slot_makers(self, slots, out: list, running: bool = True) -> None:
        """Append the tasks that make ``slots`` (each once: a state of many leaves has one
        producer for all of them); with ``running``, only those not ended. The slots are
        read in C-level passes (no Python work per slot): this run's own producers first,
        then those of the futures given as arguments."""
        if len(slots) < MANY:  # (one by one: cheaper so)
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
            return
        producer = list(map(self.plan.producer.__getitem__, slots))
        tasks = self.tasks
        made = map(tasks.__getitem__, filter(_made_here, producer)) if tasks else ()
        given = filter(not_none, map(self.futures.get, compress(slots, map(
            operator.lt, producer, repeat(0)))))
        out.extend(dict.fromkeys(chain(made, Future.producers_of(given, running))))

    def internal_bytes(self) -> list[dict[int, int]]:
        """Bytes on each device of every value it keeps that is not a future (alive until
        its last reader ends)."""
        values, plan, out = self.values, self.plan, []
        if values is None:
            return out
        for s, value in enumerate(list(values)):
            p = plan.producer[s]
            if value is not None and p >= 0 and s not in self.futures:
                node = plan.nodes[p]
                out.append(node.out_nbytes[node.outputs.index(s)])
        return out

    def count_arrived(self, slots) -> list:
        """Count ``slots`` for the nodes that wait on them; returns those now complete."""
        readers = self.plan.notify if self.parallel else self.plan.consumers
        waiting, tasks, go = self.waiting, self.tasks, []
        with self.lock:
            for slot in slots:
                for c in readers[slot]:
                    waiting[c] -= 1
                    if not waiting[c]:
                        go.append(tasks[c])
        return go

    def inputs_arrived(self, group) -> None:
        """Program arguments given as futures, ``(slot, future)`` pairs, were launched (or
        resolved). Many are read in columns (``Future.columns``): no Python work per leaf."""
        with self.lock:
            values = self.values
            if values is None:
                return
            if len(group) < MANY:
                came = []
                for slot, fut in group:
                    if fut.error is None and values[slot] is None:
                        values[slot] = fut.peek()
                        came.append(slot)
            else:
                slots, futs = zip(*group, strict=True)
                cols = Future.columns(futs)
                came = list(compress(slots, _fill(values, slots, cols)))
        if came:  # (none: its end was seen first and counted them, ``inputs_ended``)
            self.owner.arrived(self, *came)

    def inputs_ended(self, group) -> None:
        """Program arguments given as futures, ``(slot, future)`` pairs, resolved: their end
        times, or their errors (many read in columns, as ``inputs_arrived``). A value that
        arrives here first (the end was seen in another thread before the launch's hook ran
        here) is counted here: each slot once, by whichever of the two fills it."""
        failed, came = [], None
        with self.lock:
            values, errors, t_done = self.values, self.errors, self.t_done
            if values is None:
                return
            if len(group) < MANY:
                for slot, fut in group:
                    error = fut.error
                    if error is not None:
                        errors[slot] = error
                        failed.append(slot)
                    elif values[slot] is None:
                        values[slot] = fut.peek()
                        if came is None:
                            came = [slot]
                        else:
                            came.append(slot)
                    t_done[slot] = fut.t_done
            else:
                slots, futs = zip(*group, strict=True)
                cols = Future.columns(futs)
                for slot, error in compress(zip(slots, cols.errors, strict=True),
                                            map(not_none, cols.errors)):
                    errors[slot] = error
                    failed.append(slot)
                fresh = _fill(values, slots, cols)
                if any(fresh):
                    came = list(compress(slots, fresh))
                exhaust(starmap(t_done.__setitem__, zip(slots, cols.t_done, strict=True)))
            if self._waiters:
                self._changed.notify_all()
            unparked = self._unpark() if self._parked else None
        if unparked:
            resume(unparked)
        for slot in failed:
            self.spread(slot, errors[slot])
        if not self.parallel:
            self.owner.arrived(self, *filterfalse(set(failed).__contains__,
                                                  next(zip(*group, strict=True))))
        elif came:  # (its launch hook finds them filled and counts none)
            self.owner.arrived(self, *came)

    def park(self, task) -> float | None:
        """When ``task``'s inputs ended; None if one has not: then ``task`` is parked, and
        the end of its last input reports it (``ends.py``)."""
        slots = task.node.inputs
        ends = list(map(self.t_done.__getitem__, slots))  # (slots_ended, inline: this runs
        if None not in ends:                              # per computation)
            return max(max(ends, default=0.0), 0.0)
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

    def _release_inputs(self, node: PlanNode) -> None:
        """The task has ended: inputs only runs of this program read are freed after their
        last reader (the user's values and futures are the object store's business)."""
        refs, futures, makers, dropped = self.refs, self.futures, self.plan.makers, None
        with self.lock:
            values = self.values
            if values is None:
                return  # the run is over: its values went with it
            for s in node.releases:
                refs[s] -= 1
                if not refs[s] and s not in futures:
                    made = makers[s]
                    if made is not None:  # made by this run (not an argument or a constant)
                        value, values[s] = values[s], None
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
            if hasattr(value, "delete"):
                try:
                    value.delete()
                except Exception:  # already deleted or donated: nothing left to free
                    pass
            if budget:
                nbytes = producer.out_nbytes[k]
                owner.release_memory(producer.island, list(nbytes),
                                     max(nbytes.values(), default=0))


def _fill(values: list, slots, cols: Columns) -> list[bool]:
    """Put each future's value (``Future.columns``) in its slot where the slot has none and
    the future no error; returns where it did."""
    fresh = list(map(operator.and_, map(operator.is_, cols.errors, repeat(None)),
                     map(operator.is_, map(values.__getitem__, slots), repeat(None))))
    exhaust(starmap(values.__setitem__, compress(zip(slots, cols.values, strict=True), fresh)))
    return fresh


def resume(unparked: list[tuple[Any, float]]) -> None:
    """Report the parked completions whose inputs have ended (outside the run's lock)."""
    for task, t_inputs in unparked:
        line = task.line
        if line is None:
            task.report_end(t_inputs)
        else:
            line.pump()


def take_arguments(run: RunSlots, graph: Graph, leaves: list, store) -> dict:
    """Put a run's arguments and constants in their slots; returns the arguments still
    pending, by the task making them: a state of many leaves is one group, ``[watched,
    (slot, future), ...]``, watched on the one of its futures its producer resolves last.
    Many futures are read in columns (``_take_futures``): no Python work per leaf; fewer
    than ``MANY`` leaves go one by one here, which costs less for them."""
    plan, pending = run.plan, {}
    values, futures, t_done, parallel = run.values, run.futures, run.t_done, run.parallel
    if len(leaves) >= MANY:
        given = list(map(isinstance, leaves, repeat(Future)))
        for slot, leaf in compress(zip(plan.inputs, leaves, strict=True),
                                   map(operator.not_, given)):
            _put_array(run, graph, slot, leaf)
        if any(given):
            _take_futures(run, list(compress(plan.inputs, given)),
                          list(compress(leaves, given)), store, pending)
    else:
        checked = group = None  # the last producer whose futures were checked, its group
        for slot, leaf in zip(plan.inputs, leaves, strict=True):
            if not isinstance(leaf, Future):
                _put_array(run, graph, slot, leaf)
                continue
            producer = leaf.producer
            if producer is None or producer is not checked:  # (one run, one store)
                held_by = leaf.store
                if held_by is not store and held_by is not None:
                    _refuse_foreign(leaf)
                checked = producer
            futures[slot] = leaf
            if leaf.done():
                if leaf.error is not None:
                    run.errors[slot] = leaf.error
                else:
                    values[slot] = leaf.peek()
                t_done[slot] = leaf.t_done
            else:
                group = _join(pending, group, slot, leaf)
                if parallel:
                    values[slot] = leaf.peek()  # launched already, or None
    for slot, const in plan.consts:
        values[slot] = const
        t_done[slot] = 0.0
    return pending


def _put_array(run: RunSlots, graph: Graph, slot: int, leaf) -> None:
    """An argument given as an array (or a host value, made one)."""
    run.values[slot] = leaf if isinstance(leaf, jax.Array) else np.asarray(
        leaf, graph.values[slot].dtype)
    run.t_done[slot] = 0.0


def _take_futures(run: RunSlots, slots: list, futs: list, store, pending: dict) -> None:
    """The arguments given as futures (in ``slots``), read in columns; pending ones are
    grouped into ``pending`` by their producer."""
    values, t_done = run.values, run.t_done
    cols = Future.columns(futs)
    if any(map(operator.is_not, cols.stores, repeat(store))):
        for leaf, held_by in zip(futs, cols.stores, strict=True):
            if held_by is not store and held_by is not None:
                _refuse_foreign(leaf)
    run.futures.update(zip(slots, futs, strict=True))
    ended = list(map(operator.not_, cols.pending))
    if run.parallel or not any(cols.pending):  # (launched already, or None)
        exhaust(starmap(values.__setitem__, zip(slots, cols.values, strict=True)))
    else:
        exhaust(starmap(values.__setitem__, compress(zip(slots, cols.values, strict=True),
                                                     ended)))
    if any(ended):  # resolved already: a value (or an error) and an end time
        exhaust(starmap(t_done.__setitem__, compress(zip(slots, cols.t_done, strict=True),
                                                     ended)))
        for slot, error in compress(zip(slots, cols.errors, strict=True),
                                    map(not_none, cols.errors)):  # (only resolved ones fail)
            run.errors[slot] = error
            values[slot] = None
    if not any(cols.pending):
        return
    makers = dict.fromkeys(compress(cols.producers, cols.pending))
    if len(makers) == 1 and None not in makers:  # (a state: one producer, one group)
        pending[next(iter(makers))] = [max(compress(futs, cols.pending), key=_order_of),
                                       *compress(zip(slots, futs, strict=True), cols.pending)]
        return
    group = None
    for slot, leaf in compress(zip(slots, futs, strict=True), cols.pending):
        group = _join(pending, group, slot, leaf)


def _join(pending: dict, group: list | None, slot: int, leaf: Future) -> list:
    """Add a pending argument to its producer's group in ``pending`` (``group``: the last
    one joined, most often the same producer's); returns its group."""
    producer = leaf.producer
    if producer is None or group is None or group[1][1].producer is not producer:
        key = leaf if producer is None else producer
        group = pending.get(key)
        if group is None:
            group = pending[key] = [leaf]
    group.append((slot, leaf))
    if leaf.order > group[0].order:
        group[0] = leaf
    return group


def _refuse_foreign(leaf: Future) -> None:
    """A future of another controller's store was passed to a program: say what to pass."""
    if leaf.store.closed:
        raise ControllerClosedError(
            "a future from a closed controller was passed to a program; its buffer is gone. "
            "Pass fut.result() (a jax.Array) or rerun the program that made it.")
    raise ProgramError("a future from another controller was passed to a program; pass "
                       "fut.result() to move the value across.")

"""A task's whole life, in one place: the runs of programs and the states of their nodes.

A ``ProgramRun`` is one submission of a plan. Its values live in slots (one list entry per
value of the graph); only the values the user sees (the program's outputs, and futures passed
in) are ``Future``s. Each node is a ``Task`` that moves through

    WAITING --(inputs there)--> QUEUED --(scheduler: Launch)--> RUNNING --> DONE
        \\________________________\\______________________________________--> CANCELLED

A transfer skips QUEUED (it needs no devices to itself) unless a memory budget makes its
destination's scheduler admit its bytes first. Every task leaves through one path,
``ProgramRun._end``: a task that ran comes there from its executor (``Task.ended``), one that
never ran (cancelled, rejected, or fed by a failed input) from ``ProgramRun.fail``. That path
records the trace, tells the island's scheduler, resolves or fails the outputs, spreads a
failure to every dependent with the same exception, frees inputs nobody needs any more, and
counts the run down.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .deferred import soon
from .errors import CancelledError
from .objects import Future
from .trace import EventKind

if TYPE_CHECKING:
    from .dispatcher import Dispatcher
    from .plan import Plan, PlanNode

_COMPUTE, _TRANSFER = EventKind.COMPUTE.value, EventKind.TRANSFER.value


class TaskState(StrEnum):
    WAITING = "waiting"      # inputs not all launched (parallel) or resolved (sequential)
    QUEUED = "queued"        # with the island scheduler
    RUNNING = "running"      # launched on its devices (or its copy started)
    DONE = "done"
    CANCELLED = "cancelled"  # never ran: cancelled, rejected, or an input failed


@dataclass(frozen=True)
class ClientSpec:
    name: str = "default"
    weight: float = 1.0
    priority: int = 0


class Task:
    """One node of one run: what an executor launches and reports the end of.

    Executors call ``launched(values)`` once the outputs exist as values that may still be
    computing, and ``ended(t_start, t_end, error, values)`` exactly once when the task ran
    (computations on one device set in launch order)."""

    __slots__ = ("id", "node", "run", "state", "t_submit", "t_launch", "has_outputs")

    def __init__(self, tid: int, node: PlanNode, run: ProgramRun):
        self.id = tid
        self.node = node
        self.run = run
        self.state = TaskState.WAITING
        self.t_submit = self.t_launch = 0.0
        self.has_outputs = False

    @property
    def is_compute(self) -> bool:
        return self.node.is_compute

    def inputs(self) -> list:
        """The input values (arrays, or a backend's handles), in the node's order."""
        values = self.run.values
        return [values[s] for s in self.node.inputs]

    def input_error(self) -> BaseException | None:
        """The error of the first failed input, if any."""
        return self.run.slot_error(self.node.inputs)

    def inputs_ended(self, timeout: float | None = 0.0) -> float | None:
        """When the last input was seen to end; None if one has not ended (after waiting up
        to ``timeout`` seconds; None waits as long as it takes)."""
        return self.run.slots_ended(self.node.inputs, timeout)

    def launched(self, values) -> None:
        self.run.launched(self, values)

    def expedite(self, timeout: float | None = None) -> None:
        """Someone waits for this task's outputs: its executor may let that thread see the
        end itself (``Executor.expedite``, optional) rather than hand it over."""
        run = self.run
        expedite = getattr(run.dispatcher.executor, "expedite", None)
        if expedite is not None and (self.state is TaskState.RUNNING or (
                run.dispatcher.virtual and self.state is not TaskState.DONE)):
            expedite(self, timeout)

    def ended(self, t_start: float, t_end: float, error: BaseException | None = None,
              values=None) -> None:
        self.run.ended(self, t_start, t_end, error, values)

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.node.name!r}, {self.state.value})"


class ProgramRun:
    """One submission of a program: its tasks and values, and the ownership label of its
    buffers. ``wait()`` until every node finished, failed or was cancelled; ``cancel()``."""

    _ids = itertools.count()

    def __init__(self, dispatcher: Dispatcher, plan: Plan, client: ClientSpec, parallel: bool):
        self.id = next(self._ids)
        self.base = self.id << 24  # task ids: base + node index
        self.name = plan.graph.name
        self.client = client.name
        self.client_spec = client
        self.dispatcher = dispatcher
        self.plan = plan
        self.parallel = parallel
        n = plan.nslots
        self.values: list[Any] = [None] * n
        self.t_done: list[float | None] = [None] * n
        self.errors: dict[int, BaseException] = {}
        self.futures: dict[int, Future] = {}
        self.refs = list(plan.refs)
        self.waiting = list(plan.external if parallel else plan.n_inputs)
        base = self.base
        self.tasks = [Task(base + p.index, p, self) for p in plan.nodes]
        self.t_submit = dispatcher.now()
        self._remaining = self._unended = len(self.tasks)
        self._lock = threading.Lock()
        self._changed: threading.Condition | None = None  # made when someone waits on a value
        self._waiters = 0
        self._finished = False
        self._done: threading.Event | None = None  # made when someone waits on the run

    # --- the user's side -------------------------------------------------------------------
    def done(self) -> bool:
        return self._finished

    @property
    def ended_all(self) -> bool:
        """Every node has ended (the run may still be freeing its last values)."""
        return not self._unended

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every node has finished, failed or been cancelled."""
        if self._finished:
            return True
        if self.dispatcher.virtual:  # a simulated clock moves while someone waits
            return self.dispatcher.executor.settle(self.done, timeout)
        with self._lock:
            if self._finished:
                return True
            if self._done is None:
                self._done = threading.Event()
            done = self._done
        return done.wait(timeout)

    def cancel(self, reason: str = "cancelled", error: BaseException | None = None) -> int:
        """Drop every node not yet launched, failing it with ``error`` (by default a
        ``CancelledError``); returns how many were dropped. Each island drops the run's nodes
        in one step of its scheduler, so dropping one never lets another of them launch."""
        if error is None:
            error = CancelledError(f"program {self.name!r} (run {self.id}) was {reason} "
                                   "before this computation ran")
        queued: dict[int, list[Task]] = {}
        dropped = []
        with self._lock:
            for t in self.tasks:
                if t.state is TaskState.WAITING:  # with no scheduler yet
                    t.state = TaskState.CANCELLED
                    dropped.append(t)
                elif t.state is TaskState.QUEUED:
                    queued.setdefault(t.node.island, []).append(t)
        islands = self.dispatcher.islands
        for island, tasks in queued.items():
            dropped += islands[island].cancel(*tasks)
        for task in dropped:
            soon(self.fail, task, error, True)
        self.dispatcher.check_memory_when_idle()  # the queue's head may have changed
        return len(dropped)

    def __repr__(self) -> str:
        state = "done" if self.done() else f"{self._remaining} nodes left"
        return f"ProgramRun(id={self.id}, name={self.name!r}, client={self.client!r}, {state})"

    # --- values ----------------------------------------------------------------------------
    def slot_error(self, slots) -> BaseException | None:
        errors = self.errors
        if errors:
            for s in slots:
                if s in errors:
                    return errors[s]
        return None

    def slots_ended(self, slots, timeout: float | None = 0.0) -> float | None:
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
        with self._lock:
            if self._changed is None:
                self._changed = threading.Condition(self._lock)
            self._waiters += 1
            try:
                ok = self._changed.wait_for(lambda: all(t_done[s] is not None for s in slots),
                                            timeout)
            finally:
                self._waiters -= 1
        return max((t_done[s] for s in slots), default=0.0) if ok else None

    def inputs_arrived(self, group) -> None:
        """Program arguments given as futures, ``(slot, future)`` pairs, were launched (or
        resolved)."""
        with self._lock:
            values = self.values
            if values is None:
                return
            came = []
            for slot, fut in group:
                if fut._error is None and values[slot] is None:
                    values[slot] = fut._peek()
                    came.append(slot)
        self.dispatcher.arrived(self, *came)

    def inputs_ended(self, group) -> None:
        """Program arguments given as futures, ``(slot, future)`` pairs, resolved: their end
        times, or their errors."""
        failed = []
        with self._lock:
            values, errors, t_done = self.values, self.errors, self.t_done
            if values is None:
                return
            for slot, fut in group:
                error = fut._error
                if error is not None:
                    errors[slot] = error
                    failed.append(slot)
                elif values[slot] is None:
                    values[slot] = fut._peek()
                t_done[slot] = fut.t_done
            if self._waiters:
                self._changed.notify_all()
        for slot in failed:
            self._spread(slot, errors[slot])
        if not self.parallel:
            self.dispatcher.arrived(self, *(s for s, _ in group if s not in failed))

    def after(self, task: Task) -> tuple[int, ...]:
        """The computations on ``task``'s island, still running, whose outputs it reads: it
        may queue behind them on its devices."""
        island = task.node.island
        return tuple(t.id for t in self.producers(task) if t.node.island == island)

    def producers(self, task: Task, running: bool = True):
        """The computations whose outputs ``task`` reads, on any island (through transfers,
        and through arguments made by other runs): not yet ended, or (``running=False``) also
        those that have (one may be DONE before its outputs' errors are recorded)."""
        todo: list[Task] = []
        self._producers(task.node.distinct, todo, running)
        seen: set[int] = set()
        while todo:
            t = todo.pop()
            if (running and t.state is TaskState.DONE) or t.id in seen:
                continue
            seen.add(t.id)
            if t.node.is_compute:
                yield t
            else:
                t.run._producers(t.node.distinct, todo, running)

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

    def _producers(self, slots, out: list, running: bool = True) -> None:
        """Append the tasks that make ``slots`` (each once in a row: a state of many leaves
        has one producer for all of them)."""
        producer, tasks, futures, last = self.plan.producer, self.tasks, self.futures, None
        for s in slots:
            p = producer[s]
            if p >= 0:
                t = tasks[p] if tasks else None
            else:
                fut = futures.get(s)
                t = None if fut is None or (running and fut.done()) else fut.producer
            if t is not None and t is not last:
                out.append(t)
                last = t

    # --- a task's life ---------------------------------------------------------------------
    def launched(self, task: Task, values) -> None:
        """``task``'s outputs exist (maybe still computing): what counts them may go."""
        node = task.node
        with self._lock:
            if task.has_outputs:
                return
            task.has_outputs = True
            slots = self.values
            for s, v in zip(node.outputs, values, strict=True):
                slots[s] = v
        futures = self.futures
        for s, v in zip(node.outputs, values, strict=True):
            fut = futures.get(s)
            if fut is not None:
                fut._set_launched(v)
        if self.parallel:
            notify = self.plan.notify
            for s in node.outputs:
                if notify[s]:
                    self.dispatcher.arrived(self, s)

    def ended(self, task: Task, t_start: float, t_end: float, error: BaseException | None,
              values=None) -> None:
        """A task that ran has ended (its executor saw it): the one way out, for both kinds."""
        node = task.node
        fresh = False
        if values is not None and not task.has_outputs:
            with self._lock:  # launched and ended at once: its futures resolve in _end (that
                if not task.has_outputs:  # fires their launch hooks); only slots are set here
                    task.has_outputs = fresh = True
                    slots = self.values
                    for s, v in zip(node.outputs, values, strict=True):
                        slots[s] = v
        if self.errors:
            upstream = self.slot_error(node.inputs)
            if upstream is not None:
                error = upstream
        self._end(task, True, error, t_start, t_end)
        if fresh and self.parallel and node.notifies and error is None:
            notify = self.plan.notify  # consumers counted its launch: now, with its end known
            for s in node.outputs:
                if notify[s]:
                    self.dispatcher.arrived(self, s)

    def fail(self, task: Task, error: BaseException, settled: bool = False) -> None:
        """``task`` will not run (cancelled, rejected, or an input failed): it ends now with
        ``error``, and so, through its outputs, does everything that depends on it.
        ``settled``: the scheduler already dropped it (rejected)."""
        if not settled:
            if task.state is TaskState.QUEUED:
                if not self.dispatcher.islands[task.node.island].cancel(task):
                    return  # launched meanwhile: it ends by itself
            else:
                with self._lock:
                    if task.state is not TaskState.WAITING:
                        return
                    task.state = TaskState.CANCELLED
        task.state = TaskState.CANCELLED
        t = self.dispatcher.now()
        self._end(task, False, error, t, t)

    def _end(self, task: Task, ran: bool, error, t_start: float, t_end: float) -> None:
        node = task.node
        dispatcher = self.dispatcher
        if ran:
            task.state = TaskState.DONE
            if dispatcher.trace.enabled:
                self.record(task, t_start, t_end, error)
        values, futures = self.values, self.futures
        spread, dropped = [], []
        with self._lock:
            for k, s in enumerate(node.outputs):
                self.t_done[s] = t_end
                if error is not None:
                    self.errors[s] = error
                    values[s] = None
                    spread.append(s)
                elif s not in futures and not self.refs[s]:
                    dropped.append(self._take(s, node, k))  # nobody reads it
            if self._waiters:
                self._changed.notify_all()
            self._unended -= 1  # (not among ctl.runs() once its last outputs resolve)
        if ran:
            queue = dispatcher.islands[node.island]
            if node.is_compute:  # its devices are free: what waited may launch (its outputs'
                queue.finished(task, t_end - t_start)  # ends are known by then)
            if error is not None:  # the memory its outputs reserved (under a budget)
                queue.release_memory(node.devices, node.memory)
        if dropped:
            self._free(dropped)
        if futures:
            made = [(fut, values[s], node.out_nbytes[k]) for k, s in enumerate(node.outputs)
                    if (fut := futures.get(s)) is not None]
            if error is not None:
                for fut, _, _ in made:
                    fut._set_exception(error, t_end)
            elif made:  # computations and copies alike reserved their outputs' memory when
                Future._set_results(made, t_end, True)  # launched
        for s in spread:
            self._spread(s, error)
        if error is None and not self.parallel:
            for s in node.outputs:
                dispatcher.arrived(self, s)
        if node.inputs:
            self._release_inputs(node)
        with self._lock:  # (another task's end may still be freeing values: the last to
            self._remaining -= 1  # finish its own bookkeeping closes the run)
            finished = self._remaining == 0
        if finished:  # keep nothing alive: the run stays reachable from its futures
            dispatcher.run_ended(self)
            self.tasks = []
            self.values = None
            self.futures = {}
            values = futures = fut = made = None  # nor does this frame, once the run is done
            with self._lock:
                self._finished = True
                done = self._done
            if done is not None:
                done.set()
        if ran and dispatcher.memory_budget is not None:  # in flight until its frees are
            dispatcher.settled()  # done: an idle check must not count what it is freeing

    def _spread(self, slot: int, error: BaseException) -> None:
        """Every task reading ``slot`` that has not started fails with ``error``."""
        tasks = self.tasks
        if not tasks:
            return  # the run is over
        for c in self.plan.consumers[slot]:
            task = tasks[c]
            if task.state in (TaskState.WAITING, TaskState.QUEUED):
                soon(self.fail, task, error)

    def _release_inputs(self, node: PlanNode) -> None:
        """The task is over: inputs only runs of this program read are freed after their last
        reader (the user's values and futures are the object store's business)."""
        refs, plan, dropped = self.refs, self.plan, []
        with self._lock:
            for s in node.distinct:
                refs[s] -= 1
                if not refs[s] and s not in self.futures and plan.producer[s] >= 0 \
                        and self.values is not None:
                    producer = plan.nodes[plan.producer[s]]
                    dropped.append(self._take(s, producer, producer.outputs.index(s)))
        if dropped:
            self._free(dropped)

    def _take(self, slot: int, producer: PlanNode, k: int) -> tuple:
        """Take an internal value out of its slot (under the run's lock), to be freed."""
        value, self.values[slot] = self.values[slot], None
        return value, producer, k

    def _free(self, dropped: list[tuple]) -> None:
        """Delete internal values' buffers and give their reserved memory back to the
        islands' schedulers (outside the run's lock: that may launch work)."""
        for value, producer, k in dropped:
            if value is None:
                continue
            if hasattr(value, "delete"):
                try:
                    value.delete()
                except Exception:  # already deleted or donated: nothing left to free
                    pass
            nbytes = producer.out_nbytes[k]
            self.dispatcher.islands[producer.island].release_memory(
                list(nbytes), max(nbytes.values(), default=0))

    def record(self, task: Task, t_start: float, t_end: float, error) -> None:
        """Append the task's span to the trace (plain strings: this runs per computation)."""
        node, g, status = task.node, task.node.node, "ok" if error is None else "error"
        where = (0, None, None, (), None) if node.is_compute else (
            g.nbytes, g.src, g.dst, g.src_devices, g.link)
        self.dispatcher.trace.record(
            _COMPUTE if node.is_compute else _TRANSFER, node.name, self.name, self.id,
            self.client, node.island, node.devices, task.t_submit, t_start, t_end, status,
            *where, g.id)

"""Parallel and sequential asynchronous dispatch, and the island executors.

This is the one place that launches work on devices.

Submitting a program creates its output futures at once (their shapes are known). Then:

- ``parallel`` dispatch does the host-side work of every node up front: looks up the
  executable, registers dependencies on its input futures, and hands computations to their
  island's scheduler before any predecessor has run. A node becomes ready as soon as its inputs
  are *launched*: JAX accepts arrays that are still being computed as inputs, so the node is
  enqueued on its devices behind its producers and the devices run it the moment its data
  arrives (the control plane runs ahead of the data plane).
- ``sequential`` dispatch is the baseline the paper measures against: a node's host-side work
  starts only after its inputs exist. Completions are reported to one dispatcher thread (the
  client), which then prepares and submits the node.

Launching happens in whichever thread made the scheduler decide (the submitting thread, or the
one that saw a predecessor launch or finish); waiting for completion happens on the island's
watcher threads, which report ``Finished`` to the scheduler, resolve the output futures and
record the trace. Launches that a launch unlocks are run in a loop, not by recursion.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jax
import numpy as np

from . import budget
from . import scheduler as sch
from .errors import CancelledError, MemoryBudgetError
from .graph import ComputeNode, Graph
from .objects import Future, ObjectStore, resolved, shard_bytes
from .trace import EventKind, LinkKind, Trace
from .transfer import TransferEngine

_now = time.perf_counter
_local = threading.local()
_COMPUTE, _TRANSFER = EventKind.COMPUTE.value, EventKind.TRANSFER.value


class DispatchMode(StrEnum):
    PARALLEL = "parallel"
    SEQUENTIAL = "sequential"

    @classmethod
    def parse(cls, value) -> DispatchMode:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown dispatch mode {value!r}; expected 'parallel' or "
                             "'sequential', e.g. ctl.dispatch = 'sequential'.") from None


class TaskState(StrEnum):
    WAITING = "waiting"      # inputs not all launched (parallel) or resolved (sequential)
    QUEUED = "queued"        # with the island scheduler / about to be copied
    RUNNING = "running"      # launched on its devices
    DONE = "done"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ClientSpec:
    name: str = "default"
    weight: float = 1.0
    priority: int = 0


def _soon(fn, *args) -> None:
    """Run ``fn(*args)`` now, or after the current one if this thread is already inside one:
    launches that unlock launches, and failures cascading down long chains, stay flat."""
    pending = getattr(_local, "pending", None)
    if pending is not None:
        pending.append((fn, args))
        return
    _local.pending = pending = [(fn, args)]
    try:
        while pending:
            f, a = pending.pop(0)
            f(*a)
    finally:
        _local.pending = None


class Task:
    """One node of one submitted program."""

    _ids = itertools.count()

    def __init__(self, node, run: ProgramRun, inputs: list[Future], outputs: list[Future]):
        self.id = next(self._ids)
        self.node = node
        self.run = run
        self.inputs: list[Future] | None = inputs
        self.outputs = outputs
        self.waiting = len(inputs)
        self.state = TaskState.WAITING
        self.exe = None
        self.t_submit = self.t_launch = 0.0
        self._lock = threading.Lock()

    @property
    def is_compute(self) -> bool:
        return isinstance(self.node, ComputeNode)

    def input_arrived(self) -> bool:
        """Count one launched (or resolved) input; True when this was the last one."""
        with self._lock:
            self.waiting -= 1
            return self.waiting == 0

    def after(self) -> tuple[int, ...]:
        """The computations on this task's island whose outputs it reads, through transfers."""
        out, todo = [], list(self.inputs)
        while todo:
            producer = todo.pop().producer
            if producer is None or producer.state is TaskState.DONE:
                continue
            if producer.is_compute:
                out.append(producer.id)
            elif producer.inputs:
                todo.extend(producer.inputs)
        return tuple(out)


class ProgramRun:
    """One submission of a program: its tasks, and the ownership label of its buffers."""

    _ids = itertools.count()

    def __init__(self, dispatcher: Dispatcher, name: str, client: ClientSpec):
        self.id = next(self._ids)
        self.name = name
        self.client = client.name
        self.client_spec = client
        self.dispatcher = dispatcher
        self.tasks: list[Task] = []
        self.t_submit = _now()
        self._remaining = 0
        self._lock = threading.Lock()
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every node has finished, failed or been cancelled."""
        return self._done.wait(timeout)

    def cancel(self, reason: str = "cancelled") -> int:
        """Cancel every node that has not been launched; returns how many were cancelled."""
        return self.dispatcher.cancel(self, reason)

    def _task_ended(self) -> None:
        with self._lock:
            self._remaining -= 1
            finished = self._remaining == 0
        if finished:
            self.tasks = []
            self.dispatcher._run_ended(self)
            self._done.set()

    def __repr__(self) -> str:
        state = "done" if self.done() else f"{self._remaining} nodes left"
        return f"ProgramRun(id={self.id}, name={self.name!r}, client={self.client!r}, {state})"


class IslandExecutor:
    """One island's gang scheduler, and the worker threads that launch its computations and
    see them end. ``program_ahead``: see ``GangScheduler`` (a backend that sends an island a
    program's nodes together turns it on)."""

    program_ahead = False

    def __init__(self, island, dispatcher: Dispatcher, policy, memory_budget):
        self.island = island
        self.dispatcher = dispatcher
        self.scheduler = sch.GangScheduler([d.id for d in island.devices], policy, memory_budget,
                                           program_ahead=self.program_ahead)
        self._lock = threading.RLock()
        self._tasks: dict[int, Task] = {}
        self._handling = False
        self._deferred: list = []
        self._last_end: dict[int, float] = {}
        self._watch_lock = threading.Lock()
        self._watchers: dict[tuple[int, ...], _Watcher] = {}
        self._closing = False
        self._workers = ThreadPoolExecutor(len(island.devices),
                                           thread_name_prefix=f"pw-island{island.id}")

    def submit(self, task: Task, ready: bool) -> None:
        """Hand a computation to the scheduler; or, under a memory budget, a copy onto this
        island (ready: its source is launched), admitted when its bytes fit."""
        client = task.run.client_spec
        node = task.node
        with self._lock, task._lock:
            if task.state is not TaskState.WAITING:
                return
            task.state = TaskState.QUEUED
            task.t_submit = _now()
            self._tasks[task.id] = task
            if task.is_compute:
                event = sch.Submit(task.id, node.devices, client.name, client.weight,
                                   client.priority, (id(node.fn), node.signature),
                                   task.exe.memory, ready, task.after() if ready else (),
                                   task.run.id)
            else:
                event = sch.Submit(task.id, node.devices, client.name, client.weight,
                                   client.priority, memory=copy_bytes(task), ready=True,
                                   group=task.run.id, copy=True)
        self.post(event)

    def cancel(self, *tasks: Task) -> list[Task]:
        """Drop those of ``tasks`` not yet launched, all in one step of the scheduler (so
        dropping one cannot let another of them launch); returns the ones dropped."""
        dropped, events = [], []
        with self._lock:
            for task in tasks:
                with task._lock:
                    if task.state not in (TaskState.WAITING, TaskState.QUEUED):
                        continue
                    task.state = TaskState.CANCELLED
                dropped.append(task)
                if self._tasks.pop(task.id, None) is not None:
                    events.append(sch.Cancel(task.id))
            decided = self._decide(events) if events else None
        if decided:
            self._act(*decided)
        return dropped

    def post(self, *events) -> None:
        """Feed events to the scheduler and act on its decisions (from any thread)."""
        with self._lock:
            decided = self._decide(events)
        if decided:
            self._act(*decided)

    def _decide(self, events) -> tuple[list, list, list] | None:
        """Under the island's lock: the scheduler's decisions on ``events``, as the tasks to
        launch, the copies to start and the tasks rejected."""
        if self._handling:  # re-entered from a GC finalizer freeing memory mid-handle
            self._deferred.extend(events)
            return None
        self._handling = True
        try:
            decisions = self.scheduler.handle(*events)
            while self._deferred:
                more, self._deferred = self._deferred, []
                decisions += self.scheduler.handle(*more)
        finally:
            self._handling = False
        launches, copies, rejects = [], [], []
        for decision in decisions:
            task = self._tasks.pop(decision.task)
            if isinstance(decision, sch.Launch):
                task.state = TaskState.RUNNING
                if not task.is_compute:
                    copies.append(task)
                elif self._accept(task):
                    launches.append(task)
                if task.is_compute:
                    self.dispatcher.began()
            else:
                task.state = TaskState.CANCELLED
                rejects.append((task, decision.reason))
        return launches, copies, rejects

    def _act(self, launches: list, copies: list, rejects: list) -> None:
        """Outside the island's lock: launch, start copies, fail the rejected."""
        for task, reason in rejects:
            what = task.node.name if task.is_compute else (
                f"the copy {task.node.name} onto devices {list(task.node.devices)}")
            self.dispatcher.fail(task, MemoryBudgetError(
                f"{what} on island {self.island.id}: {reason}"), settled=True)
        for task in copies:
            _soon(self.dispatcher._transfer, task, True)
        for task in launches:
            if task.exe.asynchronous:  # launch now, from this thread: it returns at once
                _soon(self._launch, task)
            else:  # it may run synchronously (host callbacks): a worker launches it
                self._spawn(task)

    def memory_stuck(self) -> tuple[ProgramRun, MemoryBudgetError] | None:
        """When nothing runs or is in flight anywhere: the program run to fail because work
        here waits for memory that only work which cannot run would free (``runtime.budget``),
        with its error; None when nothing here is stuck."""
        live = None  # futures held here are dropped after the lock: a free posts events
        try:
            with self._lock:
                budget_ = self.scheduler.memory_budget
                waiting = self.scheduler.waiting_for_memory() if budget_ is not None else []
                if not waiting or not self.dispatcher.idle():
                    return None
                runs = {r.id: r for r in self.dispatcher.active_runs()}
                runs |= {t.run.id: t.run for t in self._tasks.values()}
                reading = {id(f) for r in runs.values() for t in list(r.tasks)
                           if (ins := t.inputs) for f in ins}
                live = self.dispatcher.store.live()
                held = [budget.Held(rec, rec.program_id in runs or id(f) in reading)
                        for rec, f in live if rec.island == self.island.id]
                heads = []
                for tid, devices, nbytes in waiting:
                    task = self._tasks[tid]
                    run = task.run
                    heads.append(budget.Waiting(task.node.name, self.island.id, devices,
                                                nbytes, run.id, run.name, run.client))
                in_use = self.scheduler.memory_in_use()
                found = budget.stuck(heads, budget_, in_use, held,
                                     {t.run.id for t in self._tasks.values()})
                if found is None:
                    return None
                head, victim_id = found
                victim = runs[victim_id]
                text = budget.message(head, f"program {victim.name!r} (run {victim.id}, "
                                            f"client {victim.client!r})", budget_, in_use, held)
                return victim, MemoryBudgetError(text)
        finally:
            del live

    def _accept(self, task: Task) -> bool:
        """Called under the island's lock for each launch, in decision order; True: launch it
        here (after the lock is released). A backend that launches elsewhere queues it."""
        return True

    def _work(self, task: Task) -> None:
        """A worker launches ``task`` (one that may run synchronously), and whatever its launch
        unlocks: the rest of a chain, on any island, with the copies between them."""
        _soon(self._launch, task)

    def _watch(self, entry: tuple) -> None:
        """Queue a launched computation to be seen ending, by the watcher of its devices: one
        thread per device set, in launch order. A computation is seen to end only after those
        launched before it on its devices, and waits only for its producers, launched before
        it: so no wait can go in a circle, and a slow gang does not delay the others."""
        devices = entry[1].node.devices
        with self._watch_lock:
            watcher = None if self._closing else self._watchers.get(devices)
            if watcher is None and not self._closing:
                watcher = self._watchers[devices] = _Watcher(
                    f"pw-island{self.island.id}-watch-{'.'.join(map(str, devices))}")
        if watcher is None:  # closing: no new threads; see it end here, waiting only for data
            entry[0]._finish(*entry[1:], observe_inputs=False)
        else:
            watcher.put(entry)

    def _spawn(self, task: Task) -> None:
        try:
            self._workers.submit(self._work, task)
        except RuntimeError:  # closing: the pool takes no more work, so do it here
            self._work(task)

    def _launch(self, task: Task) -> None:
        task.t_launch = _now()
        try:
            outs = task.exe.compiled(*[f._peek() for f in task.inputs])
        except BaseException as e:  # noqa: BLE001 - a failed launch fails its futures
            self._watch((self, task, None, e))
            return
        outputs = task.outputs  # the watcher may finish the task as soon as it is queued
        self._watch((self, task, outs, None))  # queued before any consumer can be launched
        for fut, value in zip(outputs, outs, strict=True):
            fut._set_launched(value)

    def _finish(self, task: Task, outs, error, observe_inputs: bool = True) -> None:
        if error is None:
            try:
                jax.block_until_ready(outs)
            except BaseException as e:  # noqa: BLE001
                error = e
        if observe_inputs:  # producers are observed first: their t_done is known
            for fut in task.inputs:
                fut.wait()
            fut = None  # hold no input past the task's end: it may be freed then
        t_end = _now()
        devices = task.node.devices
        last = self._last_end
        t_start = max(task.t_launch, max((f.t_done for f in task.inputs), default=0.0),
                      max((last.get(d, 0.0) for d in devices), default=0.0))
        for d in devices:
            last[d] = t_end
        self._ended(task, outs, t_start, t_end, error)

    def _ended(self, task: Task, outs, t_start: float, t_end: float, error) -> None:
        """A computation that ran: record it, free its devices, then resolve its outputs (or
        fail them, and through them its dependents, with the first upstream error)."""
        task.state = TaskState.DONE
        error = _upstream(task, error)
        self.dispatcher.record(task, EventKind.COMPUTE, t_start, t_end, error)
        self.post(sch.Finished(task.id, t_end - t_start))
        if error is not None:
            self.release_memory(task.node.devices, task.exe.memory if task.exe else 0)
            self.dispatcher.fail(task, error, settled=True)
        else:
            self.dispatcher.complete(task, outs, t_end, task.exe.out_nbytes)
        self.dispatcher.settled()

    def release_memory(self, devices, nbytes: int) -> None:
        if nbytes and self.scheduler.memory_budget is not None:
            self.post(*(sch.MemoryFreed(d, nbytes) for d in devices))

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"running": len(self.scheduler.running), "queued": len(self.scheduler.queued),
                    "memory_reserved": self.scheduler.memory_in_use()}

    def shutdown(self) -> None:
        self._workers.shutdown(wait=True)
        with self._watch_lock:
            self._closing = True
            watchers = list(self._watchers.values())
        for watcher in watchers:
            watcher.close()


class _Watcher:
    """A thread that sees the computations launched on one device set end, in launch order."""

    def __init__(self, name: str):
        self._queue: collections.deque = collections.deque()
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, entry: tuple) -> None:
        with self._changed:
            self._queue.append(entry)
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                executor, *launched = self._queue.popleft()
            executor._finish(*launched)

    def close(self) -> None:
        """Finish what is queued, then stop."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()


def copy_bytes(task: Task) -> int:
    """Bytes a copy's output takes on each of its devices (the most on any one)."""
    out = task.outputs[0]
    return max(shard_bytes(out.shape, out.dtype, out.sharding).values(), default=0)


def _upstream(task: Task, error):
    """A computation fed by a failed input fails with that input's own error."""
    if error is None:
        return None
    for fut in task.inputs:
        if fut._error is not None:
            return fut._error
    return error


class Dispatcher:
    """Turns a submitted graph into tasks, and moves tasks through their lives.

    ``future_class``: the futures it makes (a backend may hand out its own subclass)."""

    future_class: type[Future] = Future

    def __init__(self, store: ObjectStore, trace: Trace, transfers: TransferEngine,
                 mode: DispatchMode = DispatchMode.PARALLEL):
        self.store = store
        self.trace = trace
        self.transfers = transfers
        self.mode = DispatchMode.parse(mode)
        self.islands: dict[int, IslandExecutor] = {}
        self.runs: dict[int, ProgramRun] = {}
        self._runs_lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        # Work in flight: submissions being prepared, launched computations and started
        # copies not yet ended, nodes queued for the sequential dispatcher. When it drops to
        # zero, work waiting for memory is checked for being stuck (``runtime.budget``).
        self._active = 0
        self._active_lock = threading.Lock()

    # --- submission ------------------------------------------------------------------------
    def submit(self, graph: Graph, leaves: list, client: ClientSpec,
               mode: DispatchMode | None = None) -> list[Future]:
        run = ProgramRun(self, graph.name, client)
        vals: dict[int, Future] = {}
        for vid, leaf in zip(graph.inputs, leaves, strict=True):
            vals[vid] = leaf if isinstance(leaf, Future) else resolved(
                leaf if isinstance(leaf, jax.Array) else np.asarray(leaf, graph.values[vid].dtype))
        for vid, const in graph.consts.items():
            vals[vid] = resolved(const)
        for node in graph.nodes:
            compute = isinstance(node, ComputeNode)
            task = Task(node, run, [vals[v] for v in (node.inputs if compute else (node.input,))],
                        [])
            for vid in node.outputs if compute else (node.output,):
                spec = graph.values[vid]
                fut = self.future_class(spec.shape, spec.dtype, spec.sharding, name=node.name,
                                        island=spec.island, run=run, store=self.store)
                fut.producer = task
                task.outputs.append(fut)
                vals[vid] = fut
            run.tasks.append(task)
        outputs = [vals[v] for v in graph.outputs]
        run._remaining = len(run.tasks)
        with self._runs_lock:
            self.runs[run.id] = run
        self.began()
        _soon(self._prepare, run.tasks, (mode or self.mode) is DispatchMode.PARALLEL)
        return outputs

    def _prepare(self, tasks: list[Task], parallel: bool) -> None:
        """Parallel dispatch: every node's host-side work, before anything is launched (the
        launches this unlocks run after, from the ``_soon`` loop). Sequential: only watch."""
        try:
            if parallel:
                for task in tasks:
                    if task.is_compute:
                        task.exe = task.node.fn.executable(task.node.signature)
                        self.islands[task.node.island].submit(task, ready=False)
            for task in tasks:
                self._watch_inputs(task, parallel)
        finally:
            self.settled()

    def _watch_inputs(self, task: Task, parallel: bool) -> None:
        def arrived(fut: Future) -> None:
            if fut._error is not None:
                _soon(self.fail, task, fut._error)
            elif task.input_arrived():
                _soon(self._go, task, parallel)

        inputs = task.inputs
        if inputs is None:
            return  # already failed (rejected when submitted)
        if not inputs:
            self._go(task, parallel)
        for fut in inputs:
            (fut._on_launch if parallel else fut._hook)(arrived)

    def _go(self, task: Task, parallel: bool) -> None:
        """All inputs are there (launched, or resolved in sequential mode)."""
        if not parallel:
            self._sequential(task)
        elif task.is_compute:
            if task.inputs is None:
                return  # failed or cancelled meanwhile
            self.islands[task.node.island].post(sch.Ready(task.id, task.after()))
        else:
            self._admit(task)

    def _admit(self, task: Task) -> None:
        """Start a copy now; under a memory budget, once its destination admits its bytes."""
        island = self.islands[task.node.dst]
        if island.scheduler.memory_budget is None:
            self._transfer(task)
        else:
            island.submit(task, ready=True)

    # --- sequential dispatch: the client prepares a node once its inputs exist -------------
    def _sequential(self, task: Task) -> None:
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, name="pw-dispatch", daemon=True)
            self._thread.start()
        self.began()
        self._queue.put(task)

    def _serve(self) -> None:
        while (task := self._queue.get()) is not None:
            try:
                if task.state is not TaskState.WAITING:
                    continue
                if task.is_compute:
                    task.exe = task.node.fn.executable(task.node.signature)
                    _soon(self.islands[task.node.island].submit, task, True)
                else:
                    _soon(self._admit, task)
            except BaseException as e:  # noqa: BLE001
                self.fail(task, e)
            finally:
                task = None  # an idle dispatcher keeps no task alive
                self.settled()

    # --- transfers -------------------------------------------------------------------------
    def _transfer(self, task: Task, admitted: bool = False) -> None:
        """Copy a value (its source may still be computing): the copy starts at once, from this
        thread, and its consumers can be launched behind it. A transfer thread sees it land;
        those jobs only wait, so waits never go in a circle. ``admitted``: the destination's
        scheduler let it in under the memory budget (it is RUNNING already)."""
        with task._lock:
            if task.state is not (TaskState.RUNNING if admitted else TaskState.WAITING):
                return
            task.state = TaskState.RUNNING
        self.began()
        task.t_submit = _now()
        self.transfers.submit(self._land, task, *self._copy(task))

    def _copy(self, task: Task):
        node = task.node
        task.t_launch = _now()
        try:
            # A copy, never an alias: where source and destination shards share a device
            # (overlapping slices), an alias would die when the source's buffer is freed.
            out = jax.device_put(task.inputs[0]._peek(), task.outputs[0].sharding,
                                 may_alias=False)
        except BaseException as e:  # noqa: BLE001
            return None, e
        if not (self.transfers.dcn is not None and node.link == LinkKind.DCN):
            task.outputs[0]._set_launched(out)  # an emulated link releases it when it lands
        return out, None

    def _land(self, task: Task, out, error) -> None:
        node, src = task.node, task.inputs[0]
        if error is None:
            try:
                out.block_until_ready()
            except BaseException as e:  # noqa: BLE001
                error = e
        src.wait()
        begin, src = max(task.t_launch, src.t_done), None  # the source may be freed at the end
        if error is None:
            self.transfers.hold(node.link, node.src, node.dst, node.nbytes, begin)
        self._landed(task, [out], begin, _now(), error)

    def _landed(self, task: Task, outs, t_start: float, t_end: float, error) -> None:
        """A transfer that ran: record it, then resolve its output (or fail it with the
        source's own error when the source failed)."""
        task.state = TaskState.DONE
        src_error = task.inputs[0]._error
        error = error if src_error is None else src_error
        self.record(task, EventKind.TRANSFER, t_start, t_end, error)
        if error is not None:
            self.islands[task.node.dst].release_memory(task.node.devices, copy_bytes(task))
            self.fail(task, error, settled=True)
        else:
            self.complete(task, outs, t_end)
        self.settled()

    # --- ends of a task's life -------------------------------------------------------------
    def complete(self, task: Task, outs, t_end: float, nbytes=None) -> None:
        task.inputs = None
        # Computations and copies alike reserved their outputs' memory when launched (under a
        # budget): freeing a buffer gives its bytes back to the island's scheduler.
        for i, (fut, value) in enumerate(zip(task.outputs, outs, strict=True)):
            fut._set_result(value, t_end, True, nbytes[i] if nbytes else None)
        task.outputs = ()
        task.run._task_ended()

    def fail(self, task: Task, error: BaseException, settled: bool = False) -> None:
        """Fail ``task`` (an input failed, its computation failed, or it was cancelled): its
        outputs get ``error``, and so, through them, everything that depends on it.
        ``settled``: the task already left the scheduler (it ran, or was rejected)."""
        if not settled and not self._island_of(task).cancel(task):
            return  # launched or ended: it resolves its own outputs
        task.inputs = None
        outputs, task.outputs = task.outputs, ()
        for fut in outputs:
            fut._set_exception(error, _now())
        if outputs:
            task.run._task_ended()

    def cancel(self, run: ProgramRun, reason: str = "cancelled",
               error: BaseException | None = None) -> int:
        """Drop every node of ``run`` not yet launched, failing it with ``error`` (by default a
        ``CancelledError``); returns how many were dropped. Each island drops the run's nodes
        in one step of its scheduler, so dropping one never lets another of them launch."""
        if error is None:
            error = CancelledError(f"program {run.name!r} (run {run.id}) was {reason} before "
                                   "this computation ran")
        by_island: dict[IslandExecutor, list[Task]] = {}
        for t in list(run.tasks):
            if t.outputs and t.state in (TaskState.WAITING, TaskState.QUEUED):
                by_island.setdefault(self._island_of(t), []).append(t)
        dropped = [t for island, ts in by_island.items() for t in island.cancel(*ts)]
        for task in dropped:
            _soon(self.fail, task, error, True)
        self.check_memory_when_idle()  # the queue's head may have changed
        return len(dropped)

    def _island_of(self, task: Task) -> IslandExecutor:
        """The island whose scheduler queues ``task`` (a copy's: its destination)."""
        return self.islands[task.node.island if task.is_compute else task.node.dst]

    # --- work in flight, and work stuck waiting for memory ---------------------------------
    def began(self) -> None:
        with self._active_lock:
            self._active += 1

    def settled(self) -> None:
        with self._active_lock:
            self._active -= 1
            idle = not self._active
        if idle:
            self.check_memory_when_idle()

    def idle(self) -> bool:
        """Nothing is being submitted, running or in flight anywhere."""
        return not self._active

    def check_memory_when_idle(self) -> None:
        if self._active or all(i.scheduler.memory_budget is None
                               for i in self.islands.values()):
            return
        _soon(self._check_memory)

    def _check_memory(self) -> None:
        """Fail a program that waits for memory no running work can free (see
        ``runtime.budget``); then look again, since that may not have been enough."""
        pending = getattr(_local, "pending", None)
        if pending:  # first let the failures and frees queued before this land
            pending.append((self._check_memory, ()))
            return
        for island in list(self.islands.values()):
            found = island.memory_stuck()
            if found is not None:
                run, error = found
                self.cancel(run, error=error)  # which looks again, once its frees landed
                return

    def record(self, task: Task, kind: EventKind, t_start: float, t_end: float, error) -> None:
        trace = self.trace
        if not trace.enabled:
            return
        node, run = task.node, task.run
        status = "ok" if error is None else "error"
        if kind is EventKind.COMPUTE:  # once per computation: plain strings, no enum lookups
            trace.record(_COMPUTE, node.name, run.name, run.id, run.client, node.island,
                         node.devices, task.t_submit, t_start, t_end, status, 0, None, None, (),
                         None, node.id)
        else:
            trace.record(_TRANSFER, node.name, run.name, run.id, run.client, node.dst,
                         node.devices, task.t_submit, t_start, t_end, status, node.nbytes,
                         node.src, node.dst, node.src_devices, node.link, node.id)

    def _run_ended(self, run: ProgramRun) -> None:
        with self._runs_lock:
            self.runs.pop(run.id, None)

    def active_runs(self) -> list[ProgramRun]:
        with self._runs_lock:
            return list(self.runs.values())

    def shutdown(self) -> None:
        for run in self.active_runs():
            run.cancel("stopped by ctl.close()")
        for isl in self.islands.values():
            isl.shutdown()
        self.transfers.shutdown()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

"""Parallel and sequential asynchronous dispatch, and the island executors.

This is the one place that launches work on devices.

Submitting a program creates its output futures at once (their shapes are known). Then:

- ``parallel`` dispatch does the host-side work of every node up front: looks up the
  executable, registers dependencies on its input futures, and hands computations to their
  island's scheduler before any predecessor has run. When the last input of a node resolves,
  the thread that resolved it marks the node ready and the scheduler launches it at once.
- ``sequential`` dispatch is the baseline the paper measures against: a node's host-side work
  starts only after its inputs exist. Completions are reported to one dispatcher thread (the
  client), which then prepares and submits the node.

An ``IslandExecutor`` owns one island's ``GangScheduler`` (a pure state machine) and a pool of
worker threads, one per device. A worker launches a computation, waits for its outputs, reports
``Finished`` and, when the scheduler's next decision is for its island, runs that computation
itself instead of waking another thread.
"""

from __future__ import annotations

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

from . import scheduler as sch
from .errors import CancelledError, MemoryBudgetError
from .graph import ComputeNode, Graph, TransferNode
from .objects import Future, ObjectStore, resolved
from .trace import EventKind, Trace
from .transfer import TransferEngine

_now = time.perf_counter
_local = threading.local()


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
    WAITING = "waiting"      # inputs not all resolved
    QUEUED = "queued"        # handed to the island scheduler / transfer pool
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ClientSpec:
    name: str = "default"
    weight: float = 1.0
    priority: int = 0


def _trampoline(fn, *args) -> None:
    """Run ``fn(*args)`` now, or after the current one if already inside (failure cascades
    through long chains of futures without deep recursion)."""
    pending = getattr(_local, "pending", None)
    if pending is not None:
        pending.append((fn, args))
        return
    _local.pending = pending = [(fn, args)]
    try:
        while pending:
            f, a = pending.pop()
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
        self.t_submit = 0.0
        self._lock = threading.Lock()

    @property
    def is_compute(self) -> bool:
        return isinstance(self.node, ComputeNode)

    def input_done(self, fut: Future) -> bool:
        """Count one resolved input; True when this was the last one."""
        with self._lock:
            self.waiting -= 1
            return self.waiting == 0


class ProgramRun:
    """One submission of a program: its tasks, its outputs and its ownership label."""

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
        """Cancel every node that has not started; returns how many were cancelled."""
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


class _Claim:
    __slots__ = ("island", "task")

    def __init__(self, island: IslandExecutor):
        self.island, self.task = island, None


class IslandExecutor:
    """One island's gang scheduler and its worker threads."""

    def __init__(self, island, dispatcher: Dispatcher, policy, memory_budget):
        self.island = island
        self.dispatcher = dispatcher
        self.scheduler = sch.GangScheduler([d.id for d in island.devices], policy, memory_budget)
        self._lock = threading.RLock()
        self._tasks: dict[int, Task] = {}
        self._handling = False
        self._deferred: list = []
        self._pool = ThreadPoolExecutor(len(island.devices),
                                        thread_name_prefix=f"pw-island{island.id}")

    def submit(self, task: Task, ready: bool) -> None:
        client = task.run.client_spec
        node = task.node
        event = sch.Submit(task.id, node.devices, client.name, client.weight, client.priority,
                           (id(node.fn), node.signature), task.exe.memory, ready)
        with self._lock, task._lock:
            if task.state is not TaskState.WAITING:
                return
            task.state = TaskState.QUEUED
            task.t_submit = _now()
            self._tasks[task.id] = task
        self.post(event)

    def ready(self, task: Task) -> None:
        self.post(sch.Ready(task.id))

    def cancel(self, task: Task) -> bool:
        """Drop ``task`` unless it is running; True if it was dropped."""
        with self._lock, task._lock:
            if task.state not in (TaskState.WAITING, TaskState.QUEUED):
                return False
            task.state = TaskState.CANCELLED
            if self._tasks.pop(task.id, None) is None:
                return True
        self.post(sch.Cancel(task.id))
        return True

    def post(self, *events) -> None:
        """Feed events to the scheduler and act on its decisions (from any thread)."""
        launches, rejects = [], []
        with self._lock:
            if self._handling:  # re-entered from a GC finalizer freeing memory mid-handle
                self._deferred.extend(events)
                return
            self._handling = True
            try:
                decisions = self.scheduler.handle(*events)
                while self._deferred:
                    more, self._deferred = self._deferred, []
                    decisions += self.scheduler.handle(*more)
            finally:
                self._handling = False
            for decision in decisions:
                task = self._tasks[decision.task]
                if isinstance(decision, sch.Launch):
                    task.state = TaskState.RUNNING
                    launches.append(task)
                else:
                    del self._tasks[decision.task]
                    task.state = TaskState.CANCELLED
                    rejects.append((task, decision.reason))
        for task, reason in rejects:
            self.dispatcher.fail(task, MemoryBudgetError(
                f"{task.node.name} on island {self.island.id}: {reason}"), settled=True)
        claim = getattr(_local, "claim", None)
        for task in launches:
            if claim is not None and claim.island is self and claim.task is None:
                claim.task = task
            else:
                self._pool.submit(self._work, task)

    def _work(self, task: Task) -> None:
        claim = _local.claim = _Claim(self)
        try:
            while task is not None:
                self._execute(task)
                task, claim.task = claim.task, None
        finally:
            _local.claim = None

    def _execute(self, task: Task) -> None:
        t_start = _now()
        error = None
        try:
            args = [f._peek() for f in task.inputs]
            outs = task.exe.compiled(*args)
            jax.block_until_ready(outs)
        except BaseException as e:  # noqa: BLE001 - a failed computation fails its futures
            error, outs = e, None
        t_end = _now()
        with self._lock:
            self._tasks.pop(task.id, None)
            task.state = TaskState.DONE
        self.dispatcher.record(task, EventKind.COMPUTE, t_start, t_end, error)
        self.post(sch.Finished(task.id, t_end - t_start))
        if error is not None:
            self.release_memory(task.node.devices, task.exe.memory)
            self.dispatcher.fail(task, error, settled=True)
        else:
            self.dispatcher.complete(task, outs, t_end)

    def release_memory(self, devices, nbytes: int) -> None:
        if nbytes and self.scheduler.memory_budget is not None:
            self.post(*(sch.MemoryFreed(d, nbytes) for d in devices))

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"island": self.island.id, "running": len(self.scheduler.running),
                    "queued": len(self.scheduler.queued),
                    "memory_reserved": self.scheduler.memory_in_use()}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class Dispatcher:
    """Turns a submitted graph into tasks, and moves tasks through their lives."""

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

    # --- submission ------------------------------------------------------------------------
    def submit(self, graph: Graph, leaves: list, client: ClientSpec) -> list[Future]:
        run = ProgramRun(self, graph.name, client)
        vals: dict[int, Future] = {}
        for vid, leaf in zip(graph.inputs, leaves, strict=True):
            vals[vid] = leaf if isinstance(leaf, Future) else resolved(
                leaf if isinstance(leaf, jax.Array) else np.asarray(leaf, graph.values[vid].dtype))
        for vid, const in graph.consts.items():
            vals[vid] = resolved(const)
        for node in graph.nodes:
            outs = node.outputs if isinstance(node, ComputeNode) else (node.output,)
            ins = node.inputs if isinstance(node, ComputeNode) else (node.input,)
            futures = []
            for vid in outs:
                spec = graph.values[vid]
                futures.append(Future(spec.shape, spec.dtype, spec.sharding, name=node.name,
                                      island=spec.island, run=run, store=self.store))
                vals[vid] = futures[-1]
            run.tasks.append(Task(node, run, [vals[v] for v in ins], futures))
        outputs = [vals[v] for v in graph.outputs]
        run._remaining = len(run.tasks)
        with self._runs_lock:
            self.runs[run.id] = run
        parallel = self.mode is DispatchMode.PARALLEL
        for task in run.tasks:
            if parallel:
                self._prepare(task, ready=False)
            self._watch_inputs(task, parallel)
        return outputs

    def _prepare(self, task: Task, ready: bool) -> None:
        """The host-side work for one node: executable, buffers' sizes, the scheduler."""
        node = task.node
        if isinstance(node, ComputeNode):
            task.exe = node.fn.executable(node.signature)
            self.islands[node.island].submit(task, ready)
        elif ready:
            self._start_transfer(task)

    def _watch_inputs(self, task: Task, parallel: bool) -> None:
        def on_input(fut: Future) -> None:
            if fut._error is not None:
                _trampoline(self.fail, task, fut._error)
            elif task.input_done(fut):
                if not parallel:
                    self._sequential(task)
                elif task.is_compute:
                    self.islands[task.node.island].ready(task)
                else:
                    self._start_transfer(task)

        inputs = task.inputs
        if not inputs:
            if parallel:
                if task.is_compute:
                    self.islands[task.node.island].ready(task)
                else:
                    self._start_transfer(task)
            else:
                self._sequential(task)
            return
        for fut in inputs:
            fut._hook(on_input)

    # --- sequential dispatch: the client prepares a node once its inputs exist -------------
    def _sequential(self, task: Task) -> None:
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, name="pw-dispatch", daemon=True)
            self._thread.start()
        self._queue.put(task)

    def _serve(self) -> None:
        while (task := self._queue.get()) is not None:
            if task.state is TaskState.WAITING:
                try:
                    self._prepare(task, ready=True)
                except BaseException as e:  # noqa: BLE001
                    self.fail(task, e)

    # --- transfers -------------------------------------------------------------------------
    def _start_transfer(self, task: Task) -> None:
        with task._lock:
            if task.state is not TaskState.WAITING:
                return
            task.state = TaskState.QUEUED
        task.t_submit = _now()
        self.transfers.submit(self._run_transfer, task)

    def _run_transfer(self, task: Task) -> None:
        with task._lock:
            if task.state is not TaskState.QUEUED:
                return
            task.state = TaskState.RUNNING
        node: TransferNode = task.node
        t_start = _now()
        error = out = None
        try:
            out = self.transfers.move(task.inputs[0]._peek(), task.outputs[0].sharding,
                                      node.link, node.src, node.dst, node.nbytes)
        except BaseException as e:  # noqa: BLE001
            error = e
        t_end = _now()
        task.state = TaskState.DONE
        self.record(task, EventKind.TRANSFER, t_start, t_end, error)
        if error is not None:
            self.fail(task, error, settled=True)
        else:
            self.complete(task, [out], t_end)

    # --- ends of a task's life -------------------------------------------------------------
    def complete(self, task: Task, outs, t_end: float) -> None:
        task.inputs = None
        reserved = task.is_compute  # computations reserved their outputs' memory at launch
        for fut, value in zip(task.outputs, outs, strict=True):
            fut._set_result(value, t_end, reserved)
        task.outputs = ()
        task.run._task_ended()

    def fail(self, task: Task, error: BaseException, settled: bool = False) -> None:
        """Fail ``task`` (its input or its computation failed, or it was cancelled): its
        outputs get ``error``, and so, through them, everything that depends on it.
        ``settled``: the task already left the scheduler (it ran, or was rejected)."""
        if not settled:
            if task.is_compute:
                if not self.islands[task.node.island].cancel(task):
                    return  # already running or ended: it will resolve its own outputs
            else:
                with task._lock:
                    if task.state not in (TaskState.WAITING, TaskState.QUEUED):
                        return
                    task.state = TaskState.CANCELLED
        task.inputs = None
        outputs, task.outputs = task.outputs, ()
        for fut in outputs:
            fut._set_exception(error, _now())
        if outputs:
            task.run._task_ended()

    def cancel(self, run: ProgramRun, reason: str = "cancelled") -> int:
        error = CancelledError(f"program {run.name!r} (run {run.id}) was {reason} before this "
                               "computation ran")
        count = 0
        for task in list(run.tasks):
            if task.outputs and task.state in (TaskState.WAITING, TaskState.QUEUED):
                _trampoline(self.fail, task, error)
                count += task.state is TaskState.CANCELLED
        return count

    def record(self, task: Task, kind: EventKind, t_start: float, t_end: float, error) -> None:
        if not self.trace.enabled:
            return
        node, run = task.node, task.run
        common = dict(kind=kind.value, name=node.name, program=run.name, program_id=run.id,
                      client=run.client, devices=node.devices, t_submit=task.t_submit,
                      t_start=t_start, t_end=t_end, status="ok" if error is None else "error",
                      node_id=node.id)
        if kind is EventKind.COMPUTE:
            self.trace.record(island=node.island, **common)
        else:
            self.trace.record(island=node.dst, nbytes=node.nbytes, src=node.src, dst=node.dst,
                              src_devices=node.src_devices, link=node.link, **common)

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

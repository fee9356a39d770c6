"""Parallel and sequential asynchronous dispatch of program runs.

Submitting a program plans its graph (once per input signature, see ``plan.py``), makes a
``ProgramRun`` and returns its output futures at once (their shapes are known). Then:

- ``parallel`` dispatch does the host-side work of every node up front: each island's
  scheduler gets the run's computations in one event, before any of them has run. A node is
  ready as soon as its inputs are *launched*: JAX accepts arrays that are still being computed
  as inputs, so the node is enqueued on its devices behind its producers and runs the moment
  its data arrives (the control plane runs ahead of the data plane).
- ``sequential`` dispatch is the baseline the paper measures against: a node's host-side work
  starts only after its inputs exist. Completions are reported to one dispatcher thread (the
  client), which then prepares and submits the node.

Launching happens in whichever thread made a scheduler decide (see ``islands.py``); an
executor reports completions to the task (``tasks.py``), where a task's life ends, in the order
``ends.py`` keeps. A run asks this dispatcher for what follows through ``owner.RunOwner``, which
``Dispatcher`` implements; nothing here changes a task's state except by asking the task.
"""

from __future__ import annotations

import queue
import threading
import time
from enum import StrEnum

from . import scheduler as sch
from .deferred import later, soon
from .effects_order import gate as order_effects
from .executor import Executor, NoGroup
from .graph import Graph
from .intake import passed_through, take_arguments
from .islands import IslandQueue
from .objects import Future, ObjectStore
from .plan import Plan, build
from .read_order import gate
from .slots import ArgumentGroup
from .tasks import ClientSpec, ProgramRun, Task, TaskState
from .trace import Trace

_clock = time.perf_counter  # when futures are made (Future.t_created's clock)


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


class Dispatcher:
    """Turns submitted graphs into runs and moves their tasks until they reach an island; the
    owner of its runs (``owner.RunOwner``)."""

    def __init__(self, executor: Executor, store: ObjectStore, trace: Trace,
                 mode: DispatchMode = DispatchMode.PARALLEL, policy="fifo",
                 memory_budget: int | None = None):
        self.executor = executor
        self.now = executor.now  # the clock of every time the runtime keeps
        # A virtual clock (the simulator) moves only when the runtime waits, so host-side
        # work happens in the thread that causes it: no dispatcher thread for sequential runs.
        self.virtual = bool(getattr(executor, "virtual", False))
        self.launch_holds_inputs = bool(getattr(executor, "launch_holds_inputs", False))
        self._submitted = getattr(executor, "submitted", None)  # optional: a run starts
        self._expedite = getattr(executor, "expedite", None)  # optional: a thread waits
        self.store = store
        self.trace = trace
        self.mode = DispatchMode.parse(mode)
        self.islands: dict[int, IslandQueue] = {
            isl.id: IslandQueue(isl, executor, policy, memory_budget) for isl in executor.islands}
        self.runs: dict[int, ProgramRun] = {}  # one dict operation at a time: no lock needed
        self._group = None if isinstance(executor, NoGroup) else executor.group
        self.memory_budget = memory_budget
        # Work in flight, under a memory budget: submissions being prepared, launched
        # computations and started copies not yet ended, nodes queued for the sequential
        # dispatcher. When it drops to zero, work waiting for memory is checked for being
        # stuck (``runtime.budget``).
        self._active = 0
        self._active_lock = threading.Lock()
        self._plan_lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    # --- submission ------------------------------------------------------------------------
    def plan(self, graph: Graph) -> Plan:
        """The graph's plan, built and prepared by the executor on first use."""
        plan = graph.plan
        if plan is None:
            with self._plan_lock:
                plan = graph.plan
                if plan is None:
                    plan = build(graph)
                    self.executor.prepare(plan)
                    graph.plan = plan
        return plan

    def submit(self, graph: Graph, leaves: list, client: ClientSpec,
               mode: DispatchMode | None = None) -> list[Future]:
        """A run of ``graph`` on ``leaves`` for ``client``, in ``mode`` (default: the
        dispatcher's); returns its output futures."""
        plan = graph.plan or self.plan(graph)
        parallel = (mode or self.mode) is DispatchMode.PARALLEL
        run = ProgramRun(self, plan, client, parallel)
        values, futures, store = run.values, run.futures, self.store
        pending = take_arguments(run, graph, leaves, store)
        if plan.donated_inputs:  # it waits for earlier calls reading what it donates
            gate(self.runs, run, self.released)
        if plan.ordered:  # its ordered effects go after those of earlier calls
            order_effects(self.runs, run, self.released)
        outputs = []
        tasks, made, now = run.tasks, Future.output, _clock()
        last, lock = -1, None  # a task's outputs share one lock (``Future.output``)
        for slot, src, shape, dtype, sharding, island, name, weak, order, key in plan.made:
            fut = futures.get(slot)
            if fut is None:
                if src < 0:  # the program returns an argument as it is
                    fut = passed_through(values[slot], weak)
                else:
                    if src != last:
                        last, lock = src, threading.Lock()
                    fut = made(shape, dtype, sharding, name, island, run, store, tasks[src],
                               weak, order, key, now, lock)
                futures[slot] = fut
            outputs.append(fut)
        self.runs[run.id] = run  # one dict operation: atomic without a lock
        if self._submitted is not None:
            self._submitted(run)
        start = self._start_parallel if parallel else self._start_sequential
        self.work_began()
        try:
            if run.values is None:  # another thread's cancel (``ctl.cancel_all()``, a
                pass  # future's) ended the run since it joined ``runs``: nothing to start
            elif self._group is None:
                start(run, pending)
            else:
                with self._group():
                    start(run, pending)
        finally:
            self.work_ended()
        return outputs

    def _start_parallel(self, run: ProgramRun, pending: dict) -> None:
        """Every island gets the run's computations in one event, with those already ready;
        then transfers whose source exists start, and pending arguments are watched."""
        plan, values, waiting, tasks, errors = run.plan, run.values, run.waiting, run.tasks, \
            run.errors
        notify = plan.notify
        ready: list[Task] = []
        with run.lock:  # (an earlier run's launch may count a gated node down meanwhile)
            for slot in plan.sources:
                if notify[slot] and values[slot] is not None and slot not in errors:
                    for c in notify[slot]:
                        waiting[c] -= 1
                        if not waiting[c]:
                            ready.append(tasks[c])
        client = run.client_spec
        several = len(plan.islands) > 1
        if several:  # no launch may reach an island before it knows the run
            for island in plan.islands:
                self.islands[island].pause()
        try:
            for island, specs in plan.islands.items():
                event = sch.SubmitProgram(base=run.base, nodes=specs, client=client,
                                          group=run.id)
                self.islands[island].submit_program(
                    [tasks[s.index] for s in specs], event,
                    [t for t in ready if t.node.is_compute and t.node.island == island]
                    if ready else ready)
            if plan.gated:
                self._gated_ready(run, ready)
        finally:
            if several:
                for island in plan.islands:
                    self.islands[island].resume()
        failed = list(errors.items())  # arguments that failed before this run was made
        for task in ready:
            if not task.node.is_compute:
                self._admit(task)
        for slot, error in failed:
            run.spread(slot, error)
        for group in pending.values():
            group.watched.watch(_Group(group, run.inputs_arrived),
                                _Group(group, run.inputs_ended))

    def _gated_ready(self, run: ProgramRun, ready: list[Task]) -> None:
        """The nodes of ``run`` that wait for earlier runs (a donating one, an ordered one:
        ``read_order.py``, ``effects_order.py``) whose last arrival came from another thread
        before their island knew them (``released`` found them not QUEUED yet): ready now."""
        waiting, tasks, islands = run.waiting, run.tasks, self.islands
        for index in run.plan.gated if tasks else ():
            task = tasks[index]
            if not waiting[index] and task.state is TaskState.QUEUED and task not in ready:
                islands[task.node.island].ready(task)  # (a second Ready is ignored)

    def _start_sequential(self, run: ProgramRun, pending: dict) -> None:
        plan = run.plan
        for slot in plan.sources:
            if run.t_done[slot] is not None and slot not in run.errors:
                self.arrived(run, slot)
        for task in run.tasks:
            if not task.node.n_inputs:
                self._sequential(task)
        for slot, error in list(run.errors.items()):
            run.spread(slot, error)
        for group in pending.values():
            group.watched.hook(_Group(group, run.inputs_ended))

    def arrived(self, run: ProgramRun, *slots: int, gates_only: bool = False) -> None:
        """Values of ``run`` are there: launched (parallel) or resolved (sequential). Count
        them for the nodes that wait for them; those they complete go on. ``gates_only``:
        for the donating nodes they gate only (``plan.py``): their producer failed."""
        if run.tasks and slots:  # (else the run is over: its consumers failed or were cancelled)
            self._go(run, run.count_arrived(slots, gates_only))

    def released(self, run: ProgramRun, index: int) -> None:
        """An earlier run's reader of what node ``index`` of ``run`` donates has launched or
        ended (``read_order.py``)."""
        if run.tasks:
            self._go(run, run.count_released(index))

    def _go(self, run: ProgramRun, ready: list[Task]) -> None:
        """Tasks of ``run`` whose inputs are all there: on to their island, or to be run."""
        for task in ready:
            if not run.parallel:
                self._sequential(task)
            elif task.is_compute:
                if task.state is TaskState.QUEUED:
                    self.islands[task.node.island].ready(task)
            else:
                self._admit(task)

    # --- sequential dispatch: the client prepares a node once its inputs exist -------------
    def _sequential(self, task: Task) -> None:
        if self.virtual:
            self.work_began()
            self._prepare(task)
            return
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, name="pw-dispatch", daemon=True)
            self._thread.start()
        self.work_began()
        self._queue.put(task)

    def _serve(self) -> None:
        while (task := self._queue.get()) is not None:
            self._prepare(task)
            task = None  # an idle dispatcher keeps no run alive

    def _prepare(self, task: Task) -> None:
        """The client's host-side work for one node whose inputs exist, then its submission."""
        run, node = task.run, task.node
        try:
            if not task.is_compute:
                self._admit(task)
                return
            if not task.enqueue():
                return
            # the executable the call was traced with (the one the plan launches): never
            # compiled again here, even if the function's cache was cleared since
            exe = task.graph_node.exe
            client = run.client_spec
            island = self.islands[node.island]
            island.submit(task, sch.Submit(
                task=task.id, devices=node.devices, client=client, cost_key=node.spec.cost_key,
                memory=exe.memory, ready=True, group=run.id,
                credit=node.credit + island.argument_credit(task)))
        except BaseException as e:  # noqa: BLE001
            run.fail(task, e)
        finally:
            self.work_ended()

    # --- transfers -------------------------------------------------------------------------
    def _admit(self, task: Task) -> None:
        """A copy whose source exists (launched, or resolved): start it now, or under a
        memory budget once its destination's scheduler admits its bytes."""
        queue = self.islands[task.node.island]
        if queue.scheduler.memory_budget is None:
            self._transfer(task)
            return
        run, node, client = task.run, task.node, task.run.client_spec
        if not task.enqueue():
            return
        queue.submit(task, sch.Submit(task=task.id, devices=node.devices, client=client,
                                      memory=node.memory, ready=True, group=run.id, copy=True))

    def start_copy(self, task: Task) -> None:
        """The destination's scheduler admitted this copy (it is RUNNING already)."""
        self._transfer(task, admitted=True)

    def _transfer(self, task: Task, admitted: bool = False) -> None:
        """Start a copy (its source may still be computing); its consumers can be launched
        behind it, and the executor reports when it lands."""
        if not task.start_copy(admitted):
            return
        self.work_began()
        task.t_submit = task.t_launch = self.now()
        error = task.input_error()
        if error is not None:
            task.completed(task.t_launch, error)
            return
        self.executor.transfer(task)

    # --- work in flight, and work stuck waiting for memory ---------------------------------
    def work_began(self) -> None:
        """One more piece of work in flight (counted only under a memory budget)."""
        if self.memory_budget is not None:
            with self._active_lock:
                self._active += 1

    def work_ended(self) -> None:
        """One piece of work in flight ended (its frees done)."""
        if self.memory_budget is not None:
            with self._active_lock:
                self._active -= 1
                idle = not self._active
            if idle:
                self.check_memory_when_idle()

    def idle(self) -> bool:
        """Nothing is being submitted, running or in flight anywhere."""
        return not self._active

    def check_memory_when_idle(self) -> None:
        if self._active or self.memory_budget is None:
            return
        soon(self._check_memory)

    def _check_memory(self) -> None:
        """Fail a program that waits for memory no running work can free (see
        ``runtime.budget``); then look again, since that may not have been enough."""
        if later(self._check_memory):  # first let the failures and frees queued before land
            return
        islands = list(self.islands.values())
        # work on one island may wait for the user's frees while pinning memory on another
        freed_by_user = frozenset().union(*(i.waits_for_user(self) for i in islands))
        for island in islands:
            found = island.memory_stuck(self, freed_by_user)
            if found is not None:
                # ready work queued behind what waits may fit, and free that memory as it
                # ends: it goes first (its end looks again); only if none can is a run stopped
                if any(i.backfill() for i in islands):
                    return
                run, error = found
                run.cancel(error=error)  # which looks again, once its frees landed
                return
        for island in islands:  # nothing is stuck: what waits, waits for the user's frees
            island.tell_user()

    # --- the rest of what runs ask (owner.RunOwner) ----------------------------------------
    def run_ended(self, run: ProgramRun) -> None:
        """``run`` is over, bookkeeping included (its values freed, its memory given back)."""
        self.runs.pop(run.id, None)

    def computation_ended(self, task: Task, seconds: float) -> None:
        self.islands[task.node.island].ended(task, seconds)

    def release_memory(self, island: int, devices, nbytes: int) -> None:
        self.islands[island].release_memory(devices, nbytes)

    def drop_queued(self, island: int, tasks) -> list[Task]:
        return self.islands[island].cancel(*tasks)

    def expedite(self, task: Task, timeout: float | None) -> None:
        if self._expedite is not None:
            self._expedite(task, timeout)

    def settle(self, predicate, timeout: float | None) -> bool:
        return self.executor.settle(predicate, timeout)

    # --- runs ------------------------------------------------------------------------------

    def memory(self, counted: dict[int, tuple] | None = None) -> dict[int, int]:
        """Bytes per device of the values running programs keep for their own nodes (those
        that are not futures, so not in the object store, whose ``counted`` they correct)."""
        out: dict[int, int] = {}
        for run in self.all_runs():
            for nbytes in run.internal_bytes(counted):
                for d, n in nbytes.items():
                    out[d] = out.get(d, 0) + n
        return out

    def active_runs(self) -> list[ProgramRun]:
        """Runs with a node not yet ended (what ``ctl.runs()`` shows)."""
        return [r for r in list(self.runs.values()) if not r.nodes_ended]

    def all_runs(self) -> list[ProgramRun]:
        """Every run not yet over, those finishing their last node's bookkeeping included."""
        return list(self.runs.values())

    def shutdown(self) -> None:
        for run in self.all_runs():
            run.cancel("stopped by ctl.close()")
        self.executor.close()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class _Group:
    """A hook on the future of a group of pending arguments that its producer resolves (and
    launches) last: ``fn(group)`` once it fires, when every future of the group has (a node's
    outputs are launched and resolved in the order of its outputs, ``Future.order``)."""

    __slots__ = ("group", "fn")

    def __init__(self, group: ArgumentGroup, fn):
        self.group, self.fn = group, fn

    def __call__(self, _fut) -> None:
        self.fn(self.group)

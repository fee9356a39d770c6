"""A task's whole life, in one place: the runs of programs and the states of their nodes.

A ``ProgramRun`` is one submission of a plan; its values live in slots (``slots.py``). Each
node is a ``Task``, and this module is the only one that changes a task's state (``_MOVES``
lists the moves; every other module asks for one by name)::

    WAITING --enqueue--> QUEUED --launch--> RUNNING --completed, then reported--> ENDED
       | |                  |                  ^
       | +---start_copy-----|------------------+   (a copy needs no devices to itself)
       |                    |
       +------drop----------+------drop------> CANCELLED  (never ran: cancelled, rejected,
                                                           or an input failed)

A transfer skips QUEUED (it needs no devices to itself) unless a memory budget makes its
destination's scheduler admit its bytes first. A backend says only that a launch completed
(``Task.completed``); the runtime reports the end once the rule of ``ends.py`` allows (launch
order per device set, after the inputs' ends). Every task leaves through one path,
``ProgramRun.end``: a task that ran comes there from ``Task.report_end`` (or ``Task.ended``,
the simulator's), one that never ran from ``ProgramRun.fail``. That path records the trace,
tells the island's scheduler, resolves or fails the outputs, spreads a failure to every
dependent with the same exception, frees inputs nobody needs any more, and counts the run
down. What the run needs from its owner it asks through ``owner.RunOwner``, never by reaching
into the dispatcher.
"""

from __future__ import annotations

import itertools
import threading
from enum import StrEnum
from typing import TYPE_CHECKING

from . import interrupts
from .deferred import soon
from .errors import CancelledError, timeout_seconds
from .events import ClientSpec
from .objects import Future
from .slots import RunSlots, makers, resume

if TYPE_CHECKING:
    from .ends import Line
    from .owner import RunOwner
    from .plan import Plan, PlanNode



class TaskState(StrEnum):
    WAITING = "waiting"      # inputs not all launched (parallel) or ended (sequential)
    QUEUED = "queued"        # with the island scheduler
    RUNNING = "running"      # launched on its devices (or its copy started)
    ENDED = "done"           # ran, and its end was reported (the value is the wire name)
    CANCELLED = "cancelled"  # never ran: cancelled, rejected, or an input failed
    DONE = "done"            # the old name of ENDED (an alias)


_WAITING, _QUEUED, _RUNNING = TaskState.WAITING, TaskState.QUEUED, TaskState.RUNNING
_ENDED, _CANCELLED = TaskState.ENDED, TaskState.CANCELLED
#: each state, and the states a task may enter it from (the only moves there are)
_MOVES = {_QUEUED: (_WAITING,), _RUNNING: (_WAITING, _QUEUED), _ENDED: (_RUNNING,),
          _CANCELLED: (_WAITING, _QUEUED)}


class Task:
    """One node of one run: what an executor launches and reports the completion of.

    Executors call ``launched(values)`` once the outputs exist as values that may still be
    computing, and ``completed(t, error, values)`` exactly once when the launch has run (see
    ``runtime/executor.py``)."""

    __slots__ = ("id", "node", "run", "state", "t_submit", "t_launch", "has_outputs", "line",
                 "report", "makers", "waiters")

    def __init__(self, tid: int, node: PlanNode, run: ProgramRun):
        self.id = tid
        self.node = node
        self.run = run
        self.state = _WAITING
        self.t_submit = self.t_launch = 0.0
        self.has_outputs = False
        self.line: Line | None = None  # a launched computation's device set (ends.py)
        self.report: tuple | None = None  # a completion not yet reported as the end
        self.makers: list[Task] | None = None  # who makes its inputs (``slots.makers``)
        self.waiters: list | None = None  # told once it launches or ends (``slots.on_launch``)

    @property
    def is_compute(self) -> bool:
        return self.node.is_compute

    @property
    def graph_node(self):
        """The graph's node it runs (``runtime.graph``: a computation or a copy); ``node`` is
        the plan's record of it."""
        return self.node.node

    @property
    def has_ended(self) -> bool:
        """It ran and its end was reported (a task that never ran is CANCELLED)."""
        return self.state is _ENDED

    # --- what executors read and report ----------------------------------------------------
    def inputs(self) -> list:
        """The input values (arrays, or a backend's handles), in the node's order."""
        return list(map(self.run.values.__getitem__, self.node.inputs))

    def input_error(self) -> BaseException | None:
        """The error of the first failed input, if any."""
        return self.run.slot_error(self.node.inputs)

    def inputs_ended(self, timeout: float | None = 0.0) -> float | None:
        """When the last input was seen to end; None if one has not ended (after waiting up
        to ``timeout`` seconds; None waits as long as it takes)."""
        return self.run.slots_ended(self.node.inputs, timeout)

    def producers(self, running: bool = True):
        """The computations whose outputs it reads (``ProgramRun.producers``)."""
        return self.run.producers(self, running)

    def donates_a_copy(self) -> bool:
        """Whether an input this computation donates is made by a copy (a transfer) that
        has not ended."""
        if all(t.node.is_compute for t in makers(self)):
            return False  # (no copy makes any of its inputs, the usual case: no slot walk)
        run, inputs = self.run, self.node.inputs
        t_done, out = run.t_done, []
        run.slot_makers([s for i in self.node.exe.donated if t_done[s := inputs[i]] is None],
                        out)
        return any(not t.node.is_compute for t in out)

    def launched(self, values) -> None:
        """The outputs exist (maybe still computing): what waits for them may launch."""
        self.run.launched(self, values)

    def completed(self, t: float, error: BaseException | None = None, values=None,
                  t_start: float | None = None) -> None:
        """The launch has run, seen at ``t`` (or failed with ``error``), with its outputs
        ``values`` if ``launched`` did not give them; ``t_start`` if the backend knows when it
        began (else: its launch, its inputs' ends, the previous end on its devices). The end is
        reported now, or as soon as the launches before it on its devices and its inputs have
        ended (``ends.py``), by whichever thread reports the one it waits for."""
        self.report = (t, error, values, t_start)
        line = self.line
        if line is None:
            t_in = self.run.park(self)
            if t_in is not None:
                self.report_end(t_in)
            return
        line.pump()
        if values is not None and not self.has_outputs and self.state is _RUNNING:
            self.run.launched(self, values)  # parked: its consumers need not wait for its end

    def ended(self, t_start: float, t_end: float, error: BaseException | None = None,
              values=None) -> None:
        """The end, with its span, reported now: the older contract, for an executor that
        keeps the order of ends itself (the simulator, whose virtual clock orders them by
        construction, and lets a copy land before its source's end reaches the controller)."""
        line = self.line
        if line is not None:
            line.remove(self)
        self.run.end(self, t_start, t_end, error, values)

    def report_end(self, t_inputs: float) -> None:
        """The completion may be reported now (``ends.py`` said so): its end, with its span."""
        t, error, values, t_start = self.report
        self.report = None
        if t_start is None:
            # it starts not before its launch, its inputs' ends, nor (on its devices) the end
            # of the work before it there (``Line.span``); it ends not before it starts
            t_start = t_inputs if t_inputs > self.t_launch else self.t_launch
            if self.line is not None:
                t_start, t = self.line.span(self.node.devices, t_start, t)
        if t < t_start:
            t = t_start
        self.run.end(self, t_start, t, error, values)

    def expedite(self, timeout: float | None = None) -> None:
        """Someone waits for this task's outputs: its executor may let that thread see the
        end itself (``Executor.expedite``, optional) rather than hand it over. A Ctrl-C kept
        from earlier runtime work is raised first; one meanwhile is held while the ends this
        thread reports are (``interrupts``). Under a virtual clock that is the wait itself,
        so each event is held on its own there and Ctrl-C comes between two events: held
        whole, it came only when the wait ended (never, for a wait that does not)."""
        owner = self.run.owner
        if owner.virtual:
            interrupts.raise_kept()
            if self.state is not _ENDED:
                owner.expedite(self, timeout)
            return
        with interrupts.held:
            if self.state is _RUNNING:
                owner.expedite(self, timeout)

    # --- the moves other modules ask for (the only places a state changes) -----------------
    def move(self, to: TaskState) -> bool:
        """Enter ``to`` if ``_MOVES`` allows it from the state it is in; False if not."""
        if self.state in _MOVES[to]:
            self.state = to
            return True
        return False

    def queued(self, t: float) -> None:
        """Its island's scheduler holds it now (under the island's lock)."""
        self.state = _QUEUED
        self.t_submit = t

    def enqueue(self) -> bool:
        """WAITING -> QUEUED, if it still waits (False: cancelled or started meanwhile)."""
        with self.run.lock:
            return self.move(_QUEUED)

    def launch(self, line: Line | None) -> None:
        """Its scheduler launched it (under the island's lock, in decision order): a
        computation joins ``line``, its device set's launch order."""
        self.state = _RUNNING
        if line is not None:
            self.line = line
            line.add(self)

    def start_copy(self, admitted: bool) -> bool:
        """A copy starts: WAITING -> RUNNING (``admitted``: its scheduler made it RUNNING)."""
        with self.run.lock:
            return self.state is _RUNNING if admitted else self.move(_RUNNING)

    def drop(self) -> bool:
        """It will not run: WAITING or QUEUED -> CANCELLED (False if it had left those)."""
        return self.move(_CANCELLED)

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.node.name!r}, {self.state.value})"


class ProgramRun(RunSlots):
    """One submission of a program: its tasks and values, and the ownership label of its
    buffers. ``wait()`` until every node ended, failed or was cancelled; ``cancel()``."""

    _ids = itertools.count()

    def __init__(self, owner: RunOwner, plan: Plan, client: ClientSpec, parallel: bool):
        super().__init__(plan)
        self.id = next(self._ids)
        self.base = self.id << 24  # task ids: base + node index
        self.name = plan.graph.name
        self.client_spec = client
        self.trace_fields = (self.name, self.id, client.name)  # its part of every event
        self.owner = owner
        self.parallel = parallel
        self.lets_go = getattr(owner, "launch_holds_inputs", False)  # (``_hold_outputs``)
        self.waiting = list(plan.external if parallel else plan.n_inputs)
        base = self.base
        self.tasks = [Task(base + p.index, p, self) for p in plan.nodes]
        self.t_submit = owner.now()
        self._ntasks = self._unended = len(self.tasks)
        self._bookkept = itertools.count(1)  # tasks whose end's bookkeeping is done
        self._ended = False
        self._ended_event: threading.Event | None = None  # made when someone waits on the run

    @property
    def client(self) -> str:
        """The client's name (``client_spec.name``): what records and snapshots show."""
        return self.client_spec.name

    # --- the user's side -------------------------------------------------------------------
    def done(self) -> bool:
        """The run has ended: every node, and its bookkeeping (values freed)."""
        return self._ended

    @property
    def nodes_ended(self) -> bool:
        """Every node has ended (the run may still be freeing its last values)."""
        return not self._unended

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every node has ended, failed or been cancelled."""
        timeout = timeout_seconds(timeout)
        if self._ended:
            return True
        if self.owner.virtual:  # a simulated clock moves while someone waits
            return self.owner.settle(self.done, timeout)
        with self.lock:
            if self._ended:
                return True
            if self._ended_event is None:
                self._ended_event = threading.Event()
            event = self._ended_event
        return event.wait(timeout)

    def cancel(self, reason: str = "cancelled", error: BaseException | None = None) -> int:
        """Drop every node not yet launched, failing it with ``error`` (by default a
        ``CancelledError``); returns how many were dropped. Each island drops the run's nodes
        in one step of its scheduler, so dropping one never lets another of them launch."""
        if error is None:
            error = CancelledError(f"program {self.name!r} (run {self.id}) was {reason} "
                                   "before this computation ran")
        queued: dict[int, list[Task]] = {}
        dropped = []
        with self.lock:
            for t in self.tasks:
                if t.state is _WAITING:  # with no scheduler yet
                    t.drop()
                    dropped.append(t)
                elif t.state is _QUEUED:
                    queued.setdefault(t.node.island, []).append(t)
        owner = self.owner
        for island, tasks in queued.items():
            dropped += owner.drop_queued(island, tasks)
        for task in dropped:
            soon(self.fail, task, error, True)
        owner.check_memory_when_idle()  # the queue's head may have changed
        return len(dropped)

    def __repr__(self) -> str:
        state = "ended" if self.done() else f"{self._unended} nodes left"
        return f"ProgramRun(id={self.id}, name={self.name!r}, client={self.client!r}, {state})"

    # --- a task's life ---------------------------------------------------------------------
    def launched(self, task: Task, values) -> None:
        """``task``'s outputs exist (maybe still computing): what counts them may go."""
        if not self._hold_outputs(task, values):
            return
        node, futures = task.node, self.futures
        if futures:
            Future.set_launched_many(list(map(futures.get, node.outputs)), values)
        if self.parallel and node.notifies:
            self._outputs_arrived(node)
        if task.waiters is not None:  # (none join once its outputs are held)
            self.tell_launched(task)

    def _outputs_arrived(self, node: PlanNode) -> None:
        """Count the outputs of ``node`` (launched, or ended at once) for their readers (and
        for what it gates: its first output's)."""
        notify = self.plan.notify
        came = [s for s in node.outputs if notify[s]]
        if node.gates and not notify[node.outputs[0]]:
            came.append(node.outputs[0])
        if came:
            self.owner.arrived(self, *came)

    def _hold_outputs(self, task: Task, values) -> bool:
        """Put ``task``'s output values in their slots, once (False: they are there already,
        or the run is over); the futures whose buffers it donates are consumed then. Where a
        launch holds its inputs (``RunOwner.launch_holds_inputs``), the values this run made
        that ``task`` is the last to read are let go of here (``slots.LET_GO``)."""
        node = task.node
        with self.lock:
            if task.has_outputs or self.values is None:
                return False
            task.has_outputs = True
            slots = self.values
            for s, v in zip(node.outputs, values, strict=True):
                slots[s] = v
            if self.lets_go and node.internal:
                self.let_go(node)
            taken = self.taken(node) if node.donates else None  # (as its outputs count)
        if node.donates:
            self._consume_donated(node, taken)
        return True

    def _consume_donated(self, node: PlanNode, taken: tuple) -> None:
        """The futures whose buffers ``node`` donated are consumed (its outputs are held);
        what a budget counted for the values it consumed goes back (``taken(node)``'s)."""
        (consumed, made), futures = taken, self.futures
        if futures and consumed:
            Future.consumed_many(list(map(futures.get, consumed)))
        for value in self.moved_and_consumed(node, consumed) if node.moved else ():
            value.delete()  # (the caller's array a copy was moved from: as jax.jit's move)
        if made:
            self.give_back(made)

    def fail(self, task: Task, error: BaseException, dropped: bool = False) -> None:
        """``task`` will not run (cancelled, rejected, or an input failed): it ends now with
        ``error``, and so, through its outputs, does everything that depends on it.
        ``dropped``: it is CANCELLED already, out of its scheduler (cancelled, rejected)."""
        if not dropped:
            if task.state is _QUEUED:
                if not self.owner.drop_queued(task.node.island, [task]):
                    return  # launched meanwhile: it ends by itself
            else:
                with self.lock:
                    if not task.drop():
                        return
        t = self.owner.now()
        self.end(task, t, t, error, ran=False)

    def end(self, task: Task, t_start: float, t_end: float, error: BaseException | None,
            fresh=None, ran: bool = True) -> None:
        """The one way out (see the module docstring): ``task`` ran over ``[t_start, t_end]``
        (its end reported, ``Task.report_end``), or (``ran=False``) it never will. ``fresh``:
        output values it ended with, if it ended at once (put in their slots here unless
        ``launched`` did; its futures resolve here, which fires their launch hooks)."""
        node = task.node
        owner = self.owner
        if ran:
            if self.errors:  # an upstream error wins
                upstream = self.slot_error(node.inputs)
                if upstream is not None:
                    error = upstream
            task.move(_ENDED)
            trace = owner.trace
            if trace.enabled:
                what, where, tail = node.trace  # the fixed fields were made with the plan
                trace.record_span(what, self.trace_fields, where, tail, task.t_submit, t_start,
                                  t_end, "ok" if error is None else "error")
        task.makers = None  # (after the move: see ``slots.makers``)
        values, futures, dropped, unparked = self.values, self.futures, None, None
        counted = task.has_outputs  # (parallel: its outputs' arrival was counted at launch)
        with self.lock:
            if fresh is not None:
                if task.has_outputs or values is None:
                    fresh = None
                else:
                    task.has_outputs = True
            t_done = self.t_done
            if error is not None:
                errors = self.errors
                for s in node.outputs:
                    t_done[s] = t_end
                    errors[s] = error
                    values[s] = None
            else:
                refs = self.refs
                for k, s in enumerate(node.outputs):
                    t_done[s] = t_end
                    if fresh is not None:
                        values[s] = fresh[k]
                    if not refs[s] and s not in futures:  # nobody reads it
                        if dropped is None:
                            dropped = [(values[s], node, k)]
                        else:
                            dropped.append((values[s], node, k))
                        values[s] = None
            if self._waiters:
                self._changed.notify_all()
            if self._parked:
                unparked = self._unpark()
            self._unended -= 1  # (not among ctl.runs() once its last outputs resolve)
            taken = self.taken(node) if fresh is not None and node.donates else None
            waited_on = task.waiters is not None  # (none join once it has left RUNNING)
        if waited_on:
            self.tell_launched(task)
        if ran:
            if node.is_compute:  # its devices are free: what waited may launch (its outputs'
                owner.computation_ended(task, t_end - t_start)  # ends are known by then)
            if error is not None:  # the memory its outputs reserved (under a budget)
                owner.release_memory(node.island, node.devices, node.memory)
        if taken is not None:
            self._consume_donated(node, taken)
        if dropped:
            self._free(dropped)
        if node.internal:  # before its futures resolve: a user who got a result finds the
            self._release_inputs(node)  # inputs only this run read freed (a budget's count)
        if node.returns:  # its outputs the user sees
            made = list(map(futures.__getitem__, node.returns))
            if error is not None:
                for fut in made:
                    fut.set_exception(error, t_end)
            else:  # computations and copies alike reserved their outputs' memory when
                Future.set_results(made, list(map(values.__getitem__, node.returns)),
                                   node.returns_nbytes, t_end, True)  # launched
        if unparked:
            resume(unparked)
        if error is not None:
            for s in node.outputs:
                self.spread(s, error)
            if node.gates and not (self.parallel and counted):  # what it gated may go
                owner.arrived(self, node.outputs[0], gates_only=True)
        elif not self.parallel:
            owner.arrived(self, *node.outputs)
        elif fresh is not None and node.notifies:  # consumers counted no launch: now
            self._outputs_arrived(node)
        # another task's end may still be freeing values: the last to end its own
        # bookkeeping closes the run (the count's next() is one atomic step)
        if next(self._bookkept) == self._ntasks:
            # keep nothing alive: the run stays reachable from its futures. Dropped before
            # the run leaves the dispatcher's runs: ``ctl.wait()`` then ``ctl.memory()`` must
            # not find a buffer the run still held (a donated state's futures, say).
            self.tasks = []
            self.values = None
            self.futures = {}
            values = futures = fut = made = None  # nor does this frame, once the run has ended
            owner.run_ended(self)
            with self.lock:
                self._ended = True
                event = self._ended_event
            if event is not None:
                event.set()
        if ran and owner.memory_budget is not None:  # in flight until its frees are
            owner.work_ended()  # done: an idle check must not count what it is freeing

    def spread(self, slot: int, error: BaseException) -> None:
        """Every task reading ``slot`` that has not started fails with ``error``."""
        tasks = self.tasks
        if not tasks:
            return  # the run is over
        for c in self.plan.consumers[slot]:
            task = tasks[c]
            if task.state is _WAITING or task.state is _QUEUED:
                soon(self.fail, task, error)

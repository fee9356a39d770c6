"""The simulation: programs on a simulated cluster, on a virtual clock, through the real
``GangScheduler`` (one per island; imported and driven, never copied).

A deterministic discrete-event simulation: events sit in one heap ordered by (time, sequence
number), so equal times keep the order they were created in and every run is the same. The
clock and every cost below are the timing model's (``timing.py``, shared with the simulated
executor); this module decides when each is asked for.

What happens to a node (``docs/simulator.md`` has the picture and every parameter):

1. **Client.** Each client does a node's host-side work on its own thread: ``client_per_node``
   plus ``fanout_per_host`` for each host the node touches. Parallel dispatch does this for
   every node when the program is submitted; sequential dispatch only once the client has
   heard (``rpc_latency`` after the end) that all the node's inputs exist.
2. **Scheduler.** ``rpc_latency`` later the node reaches its island's ``GangScheduler``
   (``Submit``); it is ``Ready`` once its inputs are launched (parallel: the control plane
   runs ahead of the data) or at once (sequential). Events that reach an island at the same
   instant go to ``handle`` together.
3. **Hosts.** The scheduler sends a ``Launch`` to each host of the computation, one after
   another on its one thread (``scheduler_per_host`` each), which reaches the host
   ``rpc_latency`` later; the host executor takes ``host_per_node`` per computation, one
   after another; the computation is then queued on its chips, in launch order.
4. **Chips.** Each chip runs its queue in order. A computation starts when it is at the head of
   all its chips' queues (a gang), has arrived on every host, and its inputs exist; it runs
   for its cost. ``Finished`` reaches the scheduler ``rpc_latency`` after the end.
5. **Transfers** start when their source exists and they were issued, and take ``latency +
   bytes / bandwidth`` on their links (ICI ports of the chips, DCN ports of the hosts, or the
   hosts' PCIe), one transfer after another on a shared port.

With ``gang=False`` there is no scheduler: the client sends each computation to its hosts and
every chip runs computations in the order its host received them. A computation with a
collective waits for all its chips; where two chips received two such computations in
opposite orders, each waits for the other forever: ``run`` finds the cycle and raises
``DeadlockError`` naming the chips and computations (see ``deadlock.py``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ...runtime import scheduler as sch
from ...runtime.device_groups import Topology
from ...runtime.dispatcher import DispatchMode
from ...runtime.trace import EventKind, LinkKind, Trace
from .chips import GangQueues, OwnQueues
from .cluster import Cluster
from .deadlock import find_deadlock
from .errors import DeadlockError, SimError
from .program import SimProgram
from .tasks import SimRun, SimTask
from .timing import Timing

_COMPUTE, _TRANSFER = EventKind.COMPUTE.value, EventKind.TRANSFER.value


def _check_client(client, weight, priority, at) -> None:
    """Refuse what the scheduler or the clock would trip over mid-run (a NaN time, a weight
    that shares nothing, a priority that does not compare), as ``ctl.client`` does."""
    if not isinstance(client, str) or not client:
        raise SimError(f"client must be a non-empty string, got {client!r}; e.g. "
                       "submit(program, client='alice').")
    if not _is_real(weight) or not 0 < weight < math.inf:
        raise SimError(f"weight must be a finite number > 0 (its share under policy='share'), "
                       f"got {weight!r}; e.g. weight=2.")
    if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
        raise SimError(f"priority must be an int (higher runs first under "
                       f"policy='priority'), got {priority!r}; e.g. priority=1.")
    if at is not None and (not _is_real(at) or not math.isfinite(at)):
        raise SimError(f"at must be a finite time in seconds on the virtual clock (or None: "
                       f"now), got {at!r}.")


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


class SimIsland(NamedTuple):
    """An island as the views read one (``ctl.islands``): its id and its chips."""

    id: int
    device_ids: tuple[int, ...]


class Simulator:
    """Programs on ``cluster``, on a virtual clock.

    ``policy``: the gang schedulers' (``"fifo"``, ``"priority"``, ``"share"``); ``dispatch``:
    ``"parallel"`` or ``"sequential"``; ``gang=False``: no scheduler, each chip runs work in
    the order its host received it; ``controller="multi"``: multi-controller JAX, every host
    runs the same program and dispatches its own chips (``client_per_node`` on each host, no
    client, no RPC, no scheduler: all hosts see one order); ``network_delay(client, host)``:
    extra seconds a message from that client takes to reach that host (clients sit at
    different places in the network; the scheduler of an island sits with the island's first
    host).

    >>> sim = Simulator(Cluster.preset("tpu-v4", chips=8))                  # doctest: +SKIP
    >>> sim.submit(program, client="alice"); sim.run()                     # doctest: +SKIP
    """

    def __init__(self, cluster: Cluster, policy: sch.Policy | str = "fifo",
                 dispatch: DispatchMode | str = "parallel", gang: bool = True,
                 network_delay: Callable[[str, int], float] | None = None,
                 depth: int = 32, program_ahead: bool = False, trace: Trace | None = None,
                 controller: str = "single"):
        if controller not in ("single", "multi"):
            raise SimError(f"controller must be 'single' (Pathways) or 'multi' (multi-controller "
                           f"JAX), got {controller!r}.")
        if not isinstance(depth, numbers.Integral) or isinstance(depth, bool) or depth < 1:
            raise SimError(f"depth must be an int >= 1 (computations in flight on one chip: a "
                           f"chain launched ahead of the data), got {depth!r}; e.g. depth=32, "
                           "the default, or depth=1 to launch nothing behind a running one.")
        if not isinstance(cluster, Cluster):
            raise SimError(f"Simulator needs a Cluster, got {type(cluster).__name__}. Maybe "
                           "you want Simulator(Cluster.preset('tpu-v4', chips=2048)).")
        self.cluster = cluster
        self.dispatch = DispatchMode.parse(dispatch)
        self.multi = controller == "multi"
        self.gang = bool(gang) and not self.multi
        self.network_delay = network_delay or (lambda client, host: 0.0)
        self.schedulers = {i: sch.GangScheduler(cluster.island_devices(i), policy,
                                                depth=depth, program_ahead=program_ahead)
                           for i in range(len(cluster.islands))}
        # (a run of its own keeps every event: what it measures is counted from them)
        self.trace = Trace(capacity=None) if trace is None else trace
        if self.trace.topology is None:  # (its export groups tracks per host, as the views)
            self.trace.topology = Topology.of(
                ((i, cluster.island_devices(i)) for i in range(len(cluster.islands))),
                cluster.host_of)
        self.timing = Timing(cluster)  # the clock, the client, hosts, schedulers and ports
        self.runs: list[SimRun] = []
        self._tasks: dict[int, SimTask] = {}
        self._pending: dict[int, list] = {}
        self._chips = GangQueues(cluster.num_chips) if self.gang else OwnQueues(cluster.num_chips)
        self.unfinished = 0
        self.last_end = 0.0  # when the last node ended

    # --- public ----------------------------------------------------------------------------
    def submit(self, program: SimProgram, client: str = "default", weight: float = 1.0,
               priority: int = 0, at: float | None = None,
               after: SimRun | None = None) -> SimRun:
        """Submit ``program`` for ``client`` at virtual time ``at`` (default: now).

        ``after``: an earlier run, not yet started, whose last node the program's first nodes
        (those with no inputs) read: a chain of programs, each consuming the previous one's
        output future (the paper's OpByOp)."""
        if not isinstance(program, SimProgram):
            raise SimError(f"submit needs a SimProgram, got {type(program).__name__}. Maybe "
                           "you want from_graph(pw.program(f).trace(*args), cluster).")
        program.check(self.cluster)
        _check_client(client, weight, priority, at)
        at = self.now if at is None else float(at)
        if at < self.now:
            raise SimError(f"cannot submit at t={at} s: the clock is already at {self.now} s.")
        if after is not None and not (isinstance(after, SimRun) and after.id < len(self.runs)
                                      and self.runs[after.id] is after):
            raise SimError(f"after must be a SimRun this simulator's submit returned, got "
                           f"{after!r} (a run of another simulator never ends here). Maybe you "
                           "want to submit the whole chain to one Simulator.")
        if after is not None and (after.tasks[-1].launched or after.tasks[-1].done):
            raise SimError(f"after must be a SimRun of this simulator that has not started, got "
                           f"{after!r}. Maybe you want to submit the whole chain before run().")
        run = SimRun(len(self.runs), program.name, client, at, remaining=len(program.nodes))
        self.runs.append(run)
        devset_of = self.timing.devset
        for node in program.nodes:
            devset = devset_of(node.devices)
            src = devset_of(node.src_devices) if node.src_devices else None
            task = SimTask(len(self._tasks), run, node, devset, src, weight, priority)
            task.rendezvous = self.gang or node.collective
            task.producers = [run.tasks[i] for i in node.inputs]
            if after is not None and not node.inputs:
                task.producers.append(after.tasks[-1])
                task.unlaunched = task.undone = task.unheard = 1
            for p in task.producers:
                p.consumers.append(task)
            run.tasks.append(task)
            self._tasks[task.id] = task
        self.unfinished += len(program.nodes)
        self.timing.at(at, self._start_run, run)
        return run

    def run(self, until: float | None = None) -> float:
        """Run until nothing is left to do (or the clock passes ``until``); returns when the
        last node ended. Raises ``DeadlockError`` when chips wait on each other in a circle,
        ``SimError`` for an ``until`` before the clock (it never goes back)."""
        timing = self.timing
        if until is not None and not until >= timing.now:  # (NaN too: it compares False)
            raise SimError(f"run(until={until!r}) is before the clock, already at "
                           f"{timing.now} s: the clock never goes back. Maybe you want "
                           f"run(until={timing.now} + seconds) or run().")
        heap, step = timing.heap, timing.step
        while heap:
            if until is not None and heap[0][0] > until:
                timing.now = until
                return self.last_end
            step()
        if self.unfinished:
            stuck = [t for t in self._tasks.values() if not t.done]
            queues = self._chips.queues(stuck, self.cluster.num_chips)
            deadlock = find_deadlock(stuck, queues, self.now)
            self._record_frozen(queues)
            raise DeadlockError(deadlock.message(), deadlock)
        return self.last_end

    @property
    def islands(self) -> tuple[SimIsland, ...]:
        """The cluster's islands as the views read a controller's (``pw.ScheduleView(sim)``,
        ``pw.TopologyView(sim)``)."""
        return tuple(SimIsland(i, self.cluster.island_devices(i))
                     for i in range(len(self.cluster.islands)))

    @property
    def host_of(self) -> np.ndarray:
        """The host of every chip: the views can show a row per host."""
        return self.cluster.host_of

    @property
    def now(self) -> float:
        """The virtual clock, in seconds."""
        return self.timing.now

    @property
    def next_time(self) -> float | None:
        """When the next event happens (``None``: nothing left): ``run(until=next_time)``
        advances one instant, for a caller that reacts between events (a client's window)."""
        return self.timing.next_time

    # --- 1. the client ---------------------------------------------------------------------
    def _start_run(self, run: SimRun) -> None:
        host = self.cluster.host
        if not self.multi and (host.client_per_program or host.program_fanout_per_host):
            hosts = set()
            for task in run.tasks:
                hosts.update(task.devset.hosts.tolist())
            self.timing.program_work(run.client, len(hosts))
        for task in run.tasks:
            if self.dispatch is DispatchMode.PARALLEL or not task.producers:
                self._prepare(task)

    def _prepare(self, task: SimTask) -> None:
        """The client's host-side work for ``task``, then its messages leave."""
        host, timing = self.cluster.host, self.timing
        if self.multi:  # each host dispatches its own chips, in the same order everywhere
            if not task.is_compute:
                timing.at(timing.now + host.client_per_node, self._issue, task)
                return
            for h in task.devset.hosts.tolist():
                timing.at(timing.host_dispatch(h), self._host_receive, (task, h))
            return
        client = task.run.client
        done = timing.node_work(client, task.devset.nhosts + (task.src.nhosts if task.src else 0))
        if not task.is_compute:
            timing.at(done + host.rpc_latency, self._issue, task)
        elif self.gang:  # to the island's scheduler, which sits with its first host
            first = sum(self.cluster.islands[:task.island])
            delay = host.rpc_latency + self._network_delay(client, first)
            timing.at(done + delay, self._submit, task)
        else:  # no scheduler: straight to each host
            for h in task.devset.hosts.tolist():
                delay = host.rpc_latency + self._network_delay(client, h)
                timing.at(done + delay, self._host_receive, (task, h))

    def _network_delay(self, client: str, host: int) -> float:
        """``network_delay(client, host)``, refused unless a finite number of seconds >= 0 (a
        negative one delivered a message before it was sent, a NaN broke the event heap's
        order and so every time after it, silently)."""
        d = self.network_delay(client, host)
        if not (_is_real(d) and 0 <= d < math.inf):
            raise SimError(f"network_delay({client!r}, {host}) returned {d!r}; expected the "
                           "extra seconds a message from that client takes to reach that host, "
                           "a finite number >= 0 (0.0: no extra delay), e.g. network_delay="
                           "lambda client, host: 20e-6 if (client, host) == ('bob', 0) else 0.0.")
        return d

    def _heard(self, task: SimTask) -> None:
        """Sequential dispatch: the client hears that ``task`` ended."""
        for c in task.consumers:
            c.unheard -= 1
            if c.unheard == 0:
                self._prepare(c)

    # --- 2. the island's gang scheduler ----------------------------------------------------
    def _submit(self, task: SimTask) -> None:
        task.t_submit = self.timing.now
        task.submitted = True
        ready = self.dispatch is DispatchMode.SEQUENTIAL or task.unlaunched == 0
        node = task.node
        self._post(task.island, sch.Submit(
            task=task.id, devices=node.devices,
            client=sch.ClientSpec(task.run.client, task.weight, task.priority),
            cost_key=(task.run.name, node.id), ready=ready,
            after=self._after(task) if ready else (), group=task.run.id))

    def _post(self, island: int, event) -> None:
        pending = self._pending.get(island)
        if pending is None:
            self._pending[island] = [event]
            self.timing.at(self.timing.now, self._flush, island)
        else:
            pending.append(event)

    def _flush(self, island: int) -> None:
        events = self._pending.pop(island)
        for decision in self.schedulers[island].handle(*events):
            task = self._tasks[decision.task]
            if isinstance(decision, sch.Reject):
                raise SimError(f"island {island}'s scheduler rejected {task.node.name}: "
                               f"{decision.reason}")
            self._launch(task)

    def _after(self, task: SimTask) -> tuple[int, ...]:
        """In-flight computations whose outputs ``task`` reads (through transfers)."""
        out, todo = [], list(task.producers)
        while todo:
            p = todo.pop()
            if p.done:
                continue
            if p.is_compute:
                out.append(p.id)
            else:
                todo.extend(p.producers)
        return tuple(out)

    def _input_launched(self, task: SimTask) -> None:
        for c in task.consumers:
            c.unlaunched -= 1
            if c.unlaunched == 0 and self.dispatch is DispatchMode.PARALLEL:
                if not c.is_compute:
                    self._maybe_issue(c)
                elif c.submitted and self.gang:
                    self._post(c.island, sch.Ready(task=c.id, after=self._after(c)))

    # --- 3. hosts and 4. chips -------------------------------------------------------------
    def _launch(self, task: SimTask) -> None:
        """A launch decision: queue it on its chips now (launch order); it may start once its
        hosts have enqueued it."""
        timing = self.timing
        arrived = timing.send_launch(task.island, timing.now, task.devset.hosts)
        task.launched = True
        task.unarrived = 1
        self._chips.enqueue(task)
        timing.at(arrived, self._arrived, task)
        self._input_launched(task)

    def _host_receive(self, arg) -> None:
        """``gang=False``: host ``h`` takes the computation and queues it on its chips."""
        self.timing.at(self.timing.host_take(arg[1]), self._host_enqueued, arg)

    def _host_enqueued(self, arg) -> None:
        task, h = arg
        if not task.launched:
            task.launched, task.t_submit = True, self.timing.now
            task.unarrived = 0
            self._input_launched(task)
        self._chips.enqueue(task, task.devset.on_host(h))
        self._try_start(task)

    def _arrived(self, task: SimTask) -> None:
        task.unarrived = 0
        self._try_start(task)

    def _try_start(self, task: SimTask) -> None:
        if task.unarrived or task.undone:
            return
        timing = self.timing
        now = timing.now
        if not task.rendezvous:  # gang=False, no collective: each chip runs its own shard
            for d in task.at_head:
                if task.t_start is None:
                    task.t_start = now
                timing.at(now + task.node.seconds, self._shard_end, (task, d))
            task.at_head = []
        elif not task.running and task.blockers == 0:
            task.running = 1
            task.t_start = now
            timing.at(now + task.node.seconds, self._compute_end, task)

    def _shard_end(self, arg) -> None:
        task, d = arg
        task.shards_done += 1
        if task.shards_done == len(task.node.devices):
            self._finish(task)
        for nxt in self._chips.ended(task, (d,)):
            self._try_start(nxt)

    def _compute_end(self, task: SimTask) -> None:
        self._finish(task)
        for nxt in self._chips.ended(task, task.node.devices):
            self._try_start(nxt)

    # --- 5. transfers ----------------------------------------------------------------------
    def _issue(self, task: SimTask) -> None:
        task.t_submit = self.timing.now
        task.submitted = True
        self._maybe_issue(task)

    def _maybe_issue(self, task: SimTask) -> None:
        parallel = self.dispatch is DispatchMode.PARALLEL
        if not task.submitted or task.launched or (parallel and task.unlaunched):
            return
        task.launched = True
        if task.link != LinkKind.DCN:  # a copy of a launched array is itself launched
            self._input_launched(task)
        self._try_transfer(task)

    def _try_transfer(self, task: SimTask) -> None:
        if task.undone or not task.launched or task.running:
            return
        task.running = 1
        timing = self.timing
        start, seconds = timing.claim(task.link, task.node.nbytes, task.devset, task.src,
                                      timing.now)
        task.t_start = start
        timing.at(start + seconds, self._transfer_end, task)

    def _transfer_end(self, task: SimTask) -> None:
        if task.link == LinkKind.DCN:  # a copy over DCN is launched once it has landed
            self._input_launched(task)
        self._finish(task)

    # --- the end of a node -----------------------------------------------------------------
    def _finish(self, task: SimTask) -> None:
        timing = self.timing
        now = timing.now
        task.done = True
        task.t_end = self.last_end = now
        self._record(task)
        heard = now + self.cluster.host.rpc_latency
        if task.is_compute and self.gang:
            timing.at(heard, self._tell_scheduler, task)
        if self.dispatch is DispatchMode.SEQUENTIAL:
            timing.at(heard, self._heard, task)
        for c in task.consumers:
            c.undone -= 1
            if c.undone == 0:
                (self._try_start if c.is_compute else self._try_transfer)(c)
        run = task.run
        run.remaining -= 1
        self.unfinished -= 1
        if run.remaining == 0:
            run.t_done = now

    def _tell_scheduler(self, task: SimTask) -> None:
        self._post(task.island, sch.Ended(task=task.id, seconds=task.t_end - task.t_start))

    def _record_frozen(self, queues) -> None:
        """Deadlock: each computation stuck at the head of some chips' queues becomes a span
        with status ``"deadlock"`` on those chips, from when it reached them until the clock
        froze, so a schedule view shows where each chip stopped."""
        heads: dict[int, list[int]] = {}
        tasks = {}
        for d, q in enumerate(queues):
            if q:
                heads.setdefault(q[0].id, []).append(d)
                tasks[q[0].id] = q[0]
        for tid, chips in heads.items():
            task = tasks[tid]
            node, run = task.node, task.run
            since = task.t_start if task.t_start is not None else task.t_submit
            self.trace.record(kind=_COMPUTE, name=node.name, program=run.name,
                              program_id=run.id, client=run.client, island=task.island,
                              devices=tuple(chips), t_submit=task.t_submit, t_start=since,
                              t_end=self.now, status="deadlock", node_id=node.id)

    def _record(self, task: SimTask) -> None:
        node, run = task.node, task.run
        if task.is_compute:
            self.trace.record(kind=_COMPUTE, name=node.name, program=run.name,
                              program_id=run.id, client=run.client, island=task.island,
                              devices=node.devices, t_submit=task.t_submit,
                              t_start=task.t_start, t_end=task.t_end, node_id=node.id)
        else:
            src = None if task.src is None else task.src.island
            self.trace.record(kind=_TRANSFER, name=node.name, program=run.name,
                              program_id=run.id, client=run.client, island=task.island,
                              devices=node.devices, t_submit=task.t_submit,
                              t_start=task.t_start, t_end=task.t_end, nbytes=node.nbytes,
                              src=src, dst=task.island, src_devices=node.src_devices,
                              link=task.link, node_id=node.id)

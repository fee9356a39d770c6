"""The simulated executor: ``pw.Controller(backend="sim", cluster=...)``.

The whole runtime runs as it does on real devices (tracing, plans, parallel or sequential
dispatch, one ``GangScheduler`` per island fed by the runtime's own ``IslandQueue``, futures,
the object store, the memory budget, the trace); only the executor differs. Its islands are
the simulated cluster's chips (``SimDevice`` stand-ins in real ``jax.sharding.Mesh``es, so
shardings, shard shapes and bytes are JAX's own), functions placed there are lowered on the
abstract mesh of their chips and never compiled, and nothing runs: a launch computes when the
computation would start and end on the cluster model, and the end is reported to the runtime
when the virtual clock gets there.

**The clock** moves only while someone waits (``fut.wait()``, ``fut.result()``,
``ctl.wait()``, ``run.wait()``, ``ctl.close()``, or ``ctl.executor.advance(seconds)``): the
waiting thread takes the next event off a heap ordered by (time, sequence), reports that end
(which tells the island's scheduler, whose decisions launch more work, adding events), and so
on until what it waits for is done. Submissions happen at the clock's current time. With one
thread submitting and waiting, every run is the same.

**The model** is ``timing.py``'s, the one the engine uses too (``docs/simulator.md``). Here
the client does a node's host-side work for a whole program when it is submitted with
parallel dispatch, for each node when its inputs exist with sequential dispatch; a
computation's duration is XLA's cost analysis of its lowered function on the chip's roofline
plus its collectives (``cost.py``), or the function's ``sim_cost``. Every end, a copy's as a
computation's, reaches the controller (its schedulers and its client) ``rpc_latency`` after it
happens; a copy over DCN counts as launched once it has landed, as its destination sees it.

Because chips take work in launch order, a computation's start and end are known the moment it
is launched (everything before it on its chips, and its inputs, were launched before it); the
scheduler still learns of the end only when the clock reaches it, so busy devices, policies and
memory budgets act as they do on real devices.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...runtime import interrupts
from ...runtime.errors import NoValueError, deleted_input, donated_and_read_in
from ...runtime.executable import Executable
from ...runtime.executor import IslandFacts, NoGroup
from ...runtime.resources import DEFAULT_ISLANDS, Island, islands_from_env
from ...runtime.specialization import Specialization
from ...runtime.tasks import Task, TaskState
from ...runtime.trace import LinkKind
from ...runtime.units import human_bytes
from ..local.devices import request_host_devices
from .cluster import Cluster
from .cost import analyze, roofline, warn_uncounted_loops
from .errors import SimError
from .program import hinted_seconds, lower_for_chips
from .timing import Timing

_DCN = LinkKind.DCN.value
_ENDED_OR_DROPPED = (TaskState.ENDED, TaskState.CANCELLED)
_NAP = 0.05  # s a waiting thread sleeps when only another thread can add work


@dataclass(frozen=True, slots=True)
class SimDevice:
    """A simulated chip as slices and meshes see it: ``id`` is its chip number in the cluster
    (``Cluster.island_devices``), ``host`` its host. ``platform``/``device_kind`` name the
    chip for JAX's abstract mesh (functions are lowered for TPUs whatever the chip)."""

    id: int
    host: int
    island: int
    device_kind: str
    platform: str = "tpu"

    @property
    def process_index(self) -> int:
        return self.host

    def __repr__(self) -> str:
        return f"SimDevice(id={self.id}, host={self.host})"


class SimValue:
    """What a future of a simulated run holds: a value's shape, dtype and sharding, and when
    it exists on the virtual clock (``ready``). There are no numbers in it."""

    __slots__ = ("shape", "dtype", "sharding", "ready", "deleted")

    def __init__(self, shape, dtype, sharding, ready: float):
        self.shape, self.dtype, self.sharding, self.ready = shape, dtype, sharding, ready
        self.deleted = False  # a launch that donates it was given it

    def __repr__(self) -> str:
        return f"SimValue(shape={self.shape}, dtype={self.dtype}, ready={self.ready:.6g} s)"


def preset_cluster(name: str, islands: Sequence[int] | None) -> Cluster:
    """The preset ``name`` with islands of the given chip counts (``None``: the preset's own
    machine, one island). GPU islands may differ in size; a TPU preset's islands are equal
    (one torus shape serves every island of a ``Cluster``)."""
    base = Cluster.preset(name)  # (an unknown name raises here)
    if islands is None:
        return base
    sizes, per_host = tuple(islands), base.chips_per_host
    if any(n % per_host for n in sizes):
        whole = tuple(per_host * max(1, round(n / per_host)) for n in sizes)
        raise SimError(f"an island of preset {name!r} is whole hosts of {per_host} chips; "
                       f"islands={sizes} are not. Maybe you want islands={whole}.")
    if len(set(sizes)) != 1 and base.ici.torus:
        raise SimError(f"the simulated islands of a TPU preset are equal (one torus shape for "
                       f"every island); islands={sizes} are not. Maybe you want islands="
                       f"{(max(sizes),) * len(sizes)}, or a GPU preset (cluster='h100'), "
                       "whose islands may differ.")
    cluster = Cluster.preset(name, chips=sizes[0] * len(sizes), islands=len(sizes))
    return replace(cluster, islands=tuple(n // per_host for n in sizes))


class SimExecutor(NoGroup):
    """Islands of a simulated ``cluster`` (``backend="sim"``; see the module docstring):
    a ``Cluster``, or a preset's name (default ``"tpu-v4"``) whose islands have the chip
    counts ``islands`` gives.

    >>> ctl = pw.Controller(backend="sim",
    ...                     cluster=pw.sim.Cluster.preset("tpu-v4", chips=2048))  # doctest: +SKIP
    >>> ctl.executor.now()                                                         # doctest: +SKIP
    0.0
    """

    name = "sim"
    program_ahead = False
    virtual = True  # the runtime does its host-side work in the thread that causes it

    def __init__(self, islands: Sequence[int] | None = None,
                 cluster: Cluster | str | None = None):
        if cluster is None or isinstance(cluster, str):
            cluster = preset_cluster(cluster or "tpu-v4", islands)
        elif not isinstance(cluster, Cluster):
            raise SimError(f"cluster must be a pw.sim.Cluster or a preset's name, got "
                           f"{type(cluster).__name__}. Maybe you want "
                           "pw.sim.Cluster.preset('tpu-v4', chips=2048) or 'tpu-v4'.")
        else:
            per_island = tuple(h * cluster.chips_per_host for h in cluster.islands)
            if islands is not None and tuple(islands) != per_island:
                raise ValueError(f"islands={tuple(islands)} but the cluster has islands of "
                                 f"{list(per_island)} chips; drop islands= (the cluster "
                                 "decides them).")
        # Lowering (even on an abstract mesh) starts JAX's CPU backend: let it start with the
        # devices the local backend's default islands need, so the same process can still
        # attach local islands afterwards.
        request_host_devices(sum(islands_from_env() or DEFAULT_ISLANDS))
        self.cluster = cluster
        self.host_of = cluster.host_of
        self.timing = Timing(cluster)  # the clock, the client, hosts, schedulers, chips, ports
        self.islands: tuple[Island, ...] = tuple(
            Island(i, tuple(SimDevice(d, int(cluster.host_of[d]), i, cluster.chip.name)
                            for d in cluster.island_devices(i)), "sim", simulated=True)
            for i in range(len(cluster.islands)))
        self._cv = threading.Condition(threading.RLock())
        # id(executable) -> its seconds, forgotten with it (holding it kept every function's
        # executables, jaxprs and lowerings alive while this executor lived)
        self._costs: dict[int, float] = {}
        self._planned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # run -> times

    # --- the clock -------------------------------------------------------------------------
    def now(self) -> float:
        """The virtual clock, in seconds since the controller started."""
        return self.timing.now

    def settle(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Move the clock, event by event, until ``predicate()`` holds; False if it still
        does not after ``timeout`` seconds of real time spent waiting for other threads (an
        empty heap: only another thread's submission or free can add work)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        timing = self.timing
        with self._cv:
            while not predicate():
                if timing.heap:
                    with interrupts.held:  # (an event popped and not run: its task never
                        timing.step()  # ends. Ctrl-C is raised between two events)
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(_NAP if left is None else min(left, _NAP))
        return True

    def expedite(self, task: Task, timeout: float | None = None) -> None:
        """Someone waits for ``task``: run the clock until it has ended."""
        self.settle(lambda: task.state in _ENDED_OR_DROPPED, timeout)

    def advance(self, seconds: float) -> float:
        """Let ``seconds`` of virtual time pass (what ends meanwhile ends, what it launches
        is launched); returns the clock. Submissions after it happen at the new time."""
        if (not isinstance(seconds, numbers.Real) or isinstance(seconds, bool)
                or not 0 <= seconds < math.inf):
            raise SimError(f"advance takes finite seconds >= 0, got {seconds!r}.")
        timing = self.timing
        with self._cv:
            until = timing.now + seconds
            while timing.heap and timing.heap[0][0] <= until:
                with interrupts.held:
                    timing.step()
            timing.now = until
            return until

    # --- host-side work --------------------------------------------------------------------
    def compile(self, spec: Specialization) -> Executable:
        """A function placed here is lowered for the simulated chips, never compiled."""
        return lower_for_chips(spec)

    def check_hint(self, name: str, hint) -> None:
        """Refuse a ``sim_cost`` that is not a duration (when the function is made)."""
        hinted_seconds(name, hint)

    def prepare(self, plan) -> None:
        """Each computation's duration, once per plan: its function's ``sim_cost``, else XLA's
        cost analysis of its lowered executable on the cluster (cached per executable).
        First, every node's outputs must fit a chip's HBM (``SimError`` if not)."""
        check_hbm(plan, self.cluster)
        seconds = [0.0] * len(plan.nodes)
        for p in plan.nodes:
            if p.is_compute:
                seconds[p.index] = self._cost(p)
        devset = self.timing.devset
        hosts = [devset(p.devices).nhosts + (
            0 if p.is_compute or not p.node.src_devices
            else devset(p.node.src_devices).nhosts) for p in plan.nodes]
        every = np.unique(np.concatenate([devset(p.devices).hosts for p in plan.nodes]))
        plan.backend["sim"] = (seconds, hosts, len(every))

    def _cost(self, p) -> float:
        exe = p.exe
        known = self._costs.get(id(exe))
        if known is None:
            value = hinted_seconds(p.fn.name, p.fn.hint)
            if value is None:
                mesh = p.fn.slice.mesh.abstract_mesh
                warn_uncounted_loops(p.fn.name, exe.jaxpr)
                value = roofline(analyze(exe.lowered, mesh, exe.jaxpr), self.cluster).seconds
            self._costs[id(exe)] = known = value
            weakref.finalize(exe, self._costs.pop, id(exe), None)
        return known

    def submitted(self, run) -> None:
        """The client's work for a program, now: once per program, and with parallel dispatch
        every node's (sequential dispatch does a node's once its inputs exist)."""
        _, hosts, every = run.plan.backend["sim"]
        timing = self.timing
        with self._cv:
            timing.program_work(run.client, every)
            if run.parallel:
                self._planned[run] = [timing.node_work(run.client, n) for n in hosts]

    def _decided(self, task: Task) -> float:
        """When the node's scheduler (or, for a copy, its hosts) has heard of it."""
        run, timing = task.run, self.timing
        done = self._planned.get(run)
        if done is not None:
            t = done[task.node.index]
        else:  # sequential: the client works on a node once its inputs exist (when it was
            # handed to the scheduler, which may launch it much later: its devices were busy)
            t = timing.node_work(run.client, run.plan.backend["sim"][1][task.node.index],
                                 at=task.t_submit)
        return max(timing.now, t + timing.host.rpc_latency)

    # --- computations ----------------------------------------------------------------------
    def launch(self, island: int, tasks: Sequence[Task]) -> None:
        timing = self.timing
        rpc = timing.host.rpc_latency
        with self._cv:
            for task in tasks:
                node, run = task.node, task.run
                task.t_launch = timing.now
                error = _donation_error(node, task.inputs())
                if error is not None:  # (what the local backend raises there; nothing runs)
                    timing.at(timing.now, _refused, (task, error))
                    continue
                ds = timing.devset(node.devices)
                arrived = timing.send_launch(island, self._decided(task), ds.hosts)
                seconds = run.plan.backend["sim"][0][node.index]
                start = timing.run_on_chips(ds, max(arrived, _ready(task.inputs())), seconds)
                end = start + seconds
                outs = _values(run, node, end)
                task.launched(outs)
                timing.at(end + rpc, _report, (task, start, end, outs))
            self._cv.notify_all()

    # --- transfers -------------------------------------------------------------------------
    def transfer(self, task: Task) -> None:
        node = task.node
        g = task.graph_node
        timing = self.timing
        with self._cv:
            earliest = max(self._decided(task), _ready(task.inputs()))
            src = timing.devset(g.src_devices) if g.src_devices else None
            start, seconds = timing.claim(g.link, g.nbytes, timing.devset(g.devices), src,
                                          earliest)
            end = start + seconds
            outs = _values(task.run, node, end)
            if g.link != _DCN:  # consumers may queue behind a copy inside an island
                task.launched(outs)
            else:  # one over DCN is launched once it has landed, as its destination sees it
                timing.at(end, _landed, (task, outs))
            # the controller hears of a copy's end over the network, as of a computation's
            timing.at(end + timing.host.rpc_latency, _report, (task, start, end, outs))
            self._cv.notify_all()

    # --- the rest of the interface ---------------------------------------------------------
    def fetch(self, value, sharding) -> Any:
        if isinstance(value, SimValue):
            raise NoValueError(
                f"this future comes from a simulated controller (backend='sim'): it has shape "
                f"{value.shape}, dtype {value.dtype} and sharding {value.sharding}, and existed "
                f"at t={value.ready * 1e3:.4g} ms on the virtual clock, but no value: a "
                "simulation computes nothing. Use fut.shape / fut.dtype / fut.sharding, "
                "fut.t_done, ctl.trace or pw.report(ctl, 'run.html'); run on a real backend "
                "for values.")
        return value  # a value the program was given (it returns its argument)

    def status(self, island: int) -> IslandFacts:
        return IslandFacts(details={"simulated": self.cluster.name, "clock_s": self.timing.now})

    def reattach(self, island: int) -> Island:
        raise ValueError("reattach() is for backend='ray': a simulated island cannot be lost.")

    def close(self) -> None:
        """Run the clock until everything launched has ended."""
        self.settle(lambda: not self.timing.heap)


def check_hbm(plan, cluster: Cluster) -> None:
    """Refuse a plan with a node whose outputs alone take more than a chip's HBM on one of its
    chips: no order of work, no memory budget, could ever place them."""
    hbm = cluster.chip.hbm_bytes
    for p in plan.nodes:
        per_chip: dict[int, int] = {}
        for nbytes in p.out_nbytes:
            for d, n in nbytes.items():
                per_chip[d] = per_chip.get(d, 0) + n
        over = [d for d, n in per_chip.items() if n > hbm]
        if over:
            d = min(over, key=lambda d: (-per_chip[d], d))
            raise SimError(
                f"program {plan.graph.name!r}: {p.name!r} puts {human_bytes(per_chip[d])} on "
                f"chip {d}, more than its Chip.hbm_bytes (valid: at most {hbm:.0f} B, "
                f"{human_bytes(hbm)}, on cluster {cluster.name!r}). Maybe you want its values "
                "sharded over more chips (in_specs=/out_specs=), or a chip with more HBM.")


def _landed(arg) -> None:
    task, outs = arg
    task.launched(outs)


def _report(arg) -> None:
    task, start, end, outs = arg
    task.ended(start, end, None, outs)


def _refused(arg) -> None:
    task, error = arg
    task.ended(task.t_launch, task.t_launch, error, None)


def _donation_error(node, inputs: list) -> BaseException | None:
    """The errors a real launch raises for donation (``runtime/errors.py``: an input an
    earlier call consumed, or one this call donates and also reads); else the donated inputs
    are consumed now."""
    for i, v in enumerate(inputs):
        if getattr(v, "deleted", False):
            return deleted_input(f"input {i} of {node.name} was given to an earlier call that "
                                 "donates it, which now owns its buffer")
    donated = node.exe.donated
    error = donated_and_read_in(node.name, inputs, donated, names=lambda: node.exe.input_names)
    if error is not None:
        return error
    for i in donated:
        if isinstance(inputs[i], SimValue):
            inputs[i].deleted = True
    return None


def _ready(values) -> float:
    """When the last of ``values`` exists (host values exist from the start)."""
    latest = 0.0
    for v in values:
        t = getattr(v, "ready", 0.0)
        if t > latest:
            latest = t
    return latest


def _values(run, node, ready: float) -> list[SimValue]:
    specs = run.plan.graph.values
    return [SimValue(spec.shape, spec.dtype, spec.sharding, ready)
            for spec in (specs[s] for s in node.outputs)]

"""The single controller: one object that owns every island, slice, program and buffer.

It wires the layers together: resources (islands, slices) -> programs (graphs, plans) ->
dispatch (runs, one gang scheduler per island) -> the executor of its backend (where the islands
live) -> objects (futures, store) -> trace. The backend comes by name from the registry
``pwkernel.backends`` fills, or as an object implementing ``pw.Executor``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from jax.sharding import AxisType

from . import callbacks, done_callbacks, guards, interrupts, registry
from . import executor as executors
from .device_groups import Topology
from .dispatcher import Dispatcher, DispatchMode
from .errors import ControllerClosedError, DeviceSetupError, SliceError, timeout_seconds
from .events import DEFAULT_CLIENT
from .executor import Executor, IslandFacts
from .graph import Graph
from .keywords import keywords_of, suggests_keywords, unexpected_keyword
from .objects import BufferRecord, Future, ObjectStore
from .registry import SharedDevicesWarning as SharedDevicesWarning  # (its old home)
from .registry import running_default
from .resources import DEFAULT_ISLANDS, Island, ResourceManager, VirtualSlice, islands_from_env
from .scheduler import Policy
from .snapshot import IslandView, PoolView, RunView, SliceView, Snapshot
from .tasks import ClientSpec, ProgramRun
from .trace import Trace
from .transfer import Link


def _callbacks_ran() -> bool:
    """Wait for the done-callbacks queued so far to run; a Ctrl-C kept meanwhile ends the
    wait (False), with a warning: a callback that never returns (blocked on a queue the
    closing thread was to drain) held ``close()`` for good, with the interrupt held off."""
    runner = done_callbacks.runner
    if runner.wait_idle_unless(interrupts.kept) or runner.on_its_thread():
        return True
    warnings.warn("ctl.close() was interrupted while a done-callback still ran: it closes "
                  "without waiting for it, and the values that callback reads are freed "
                  "(it gets ControllerClosedError). A callback that waits for work the "
                  "closing thread does never returns; give it a timeout.", RuntimeWarning,
                  stacklevel=4)
    return False


class _NotGiven:
    """``islands`` left out: ``DEFAULT_ISLANDS`` for a backend made by name, the islands an
    executor object brings for one passed in (a sentinel, so that an explicit (4, 4) is told
    apart from the default)."""

    def __repr__(self) -> str:
        return f"{DEFAULT_ISLANDS} (or the executor object's islands)"


_NOT_GIVEN: Any = _NotGiven()

_client: contextvars.ContextVar[ClientSpec | None] = contextvars.ContextVar("pw_client",
                                                                             default=None)


@suggests_keywords("pw.Controller")
class Controller:
    """The single controller of a set of device islands.

    >>> ctl = pw.Controller(islands=(4, 4))   # the host CPU as 2 islands x 4 devices
    >>> s0 = ctl.slice(2, island=0)
    >>> ctl.close()

    ``policy``: ``"fifo"``, ``"priority"`` or ``"share"``; ``dispatch``: ``"parallel"`` or
    ``"sequential"``; ``memory_budget``: bytes per device a computation may fill before it
    waits for memory to be freed; ``dcn``: a ``pw.Link`` emulating the network between islands.

    ``backend="ray"`` runs each island in a Ray actor (its own process and devices) on the
    cluster at ``ray_address`` (``"auto"``, ``"host:port"``), or on a local cluster started
    for it (``None``); see docs/ray.md. ``ctl.reattach(island)`` replaces a lost island.
    ``address`` is ``ray_address`` by a shorter name. ``pool=NAME`` attaches to a device pool
    on that cluster (``python -m pwkernel.pool start``; docs/pool.md): its islands, shared
    with other controllers (tenants) whose work their schedulers order together with this
    one's; ``tenant`` names this controller there (default ``PWKERNEL_TENANT`` or
    ``host:pid``) and ``weight`` is its share of the pool's devices under ``share``.

    >>> ctl = pw.Controller(backend="ray", address="127.0.0.1:6379", pool="class")  # doctest: +SKIP

    ``backend`` may also be an executor object (``pw.Executor``), which brings its islands:
    leave ``islands`` out then (an ``islands=`` that differs is an error, not ignored).

    ``backend="sim"`` runs the same programs on a simulated ``cluster``
    (``pw.sim.Cluster.preset("tpu-v4", chips=2048)``; default: a TPU v4 cluster shaped like
    ``islands``), through the same gang schedulers, on a virtual clock that moves while you
    wait (``fut.wait()``, ``ctl.wait()``); futures have shapes, shardings and times but no
    values (docs/simulator.md).
    """

    def __init__(self, islands: Sequence[int] | None = _NOT_GIVEN, policy: Policy | str = "fifo",
                 dispatch: DispatchMode | str = "parallel", memory_budget: int | None = None,
                 dcn: Link | None = None, backend: str | Executor = "local",
                 ray_address: str | None = None, cluster: Any = None,
                 address: str | None = None, pool: str | None = None,
                 tenant: str | None = None, weight: float | None = None):
        given = islands is not _NOT_GIVEN
        if not given:  # a pool brings its islands, as an executor object and a cluster do
            islands = DEFAULT_ISLANDS if isinstance(backend, str) and pool is None and not (
                backend == "sim" and cluster is not None) else None
        if islands is not None and (isinstance(islands, str | bytes) or not isinstance(
                islands, Sequence) or not islands or not all(
                isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0
                for n in islands)):
            one = isinstance(islands, int | np.integer) and not isinstance(islands, bool) \
                and islands > 0  # one island of that many
            raise DeviceSetupError(f"islands must be a sequence of positive device counts (one "
                                   f"per island) or None, got {islands!r}. Maybe you want "
                                   f"islands={(int(islands),) if one else (4, 4)}.")
        policy = Policy.parse(policy)
        mode = DispatchMode.parse(dispatch)
        if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(
                memory_budget, int | float | np.number) or not 0 < memory_budget < float("inf")):
            raise ValueError(f"memory_budget must be a finite positive number of bytes per "
                             f"device, or None (no budget), got {memory_budget!r}; e.g. "
                             "memory_budget=2**30 for 1 GiB per device.")
        if dcn is not None and not isinstance(dcn, Link):
            raise TypeError(f"dcn must be a pw.Link(bandwidth=..., latency=...) or None, got "
                            f"{type(dcn).__name__}.")
        self.closed = False
        self._closer: threading.Thread | None = None  # the thread that closes it
        self._closed_all = threading.Event()  # its close has ended
        self._close_lock = threading.Lock()
        self.memory_budget = memory_budget
        self.dcn = dcn
        # each option goes only to the backend that declares it (runtime/executor.py)
        self._backend = executors.create(backend, islands, dcn=dcn, ray_address=ray_address,
                                         cluster=cluster, address=address, pool=pool,
                                         tenant=tenant, weight=weight)
        self._islands = tuple(self._backend.islands)
        brought = tuple(len(i.devices) for i in self._islands)
        if given and islands is not None and not isinstance(backend, str) and tuple(
                islands) != brought:
            kind, asked = type(backend).__name__, tuple(islands)
            named = getattr(backend, "name", None)
            named = named if named in executors.backends() else "local"
            raise ValueError(
                f"islands={asked} but the executor object {kind} brings islands of {brought} "
                f"devices, and an executor object's own islands win; give the islands to the "
                f"backend ({kind}(islands={asked})) and drop islands=, or pass the backend by "
                f"name (backend={named!r}, islands={asked}).")
        self.resources = ResourceManager(self._islands, self._check_open)
        self.resources.controller = self
        self.trace = Trace(topology=Topology.of(((i.id, i.device_ids) for i in self._islands),
                                                self.host_of))
        record_into = getattr(self._backend, "record_into", None)
        if record_into is not None:  # work it sees but did not launch (a pool's other tenants)
            record_into(self.trace)
        # (freed memory is given back to the islands' schedulers only under a budget)
        self.store = ObjectStore(None if memory_budget is None else self._on_free,
                                 self._backend.fetch, getattr(self._backend, "failure", None))
        self._dispatcher = Dispatcher(self._backend, self.store, self.trace, mode, policy,
                                      memory_budget)
        self._policy = policy
        interrupts.install()  # Ctrl-C waits for the runtime's work in the main thread to end
        interrupts.courier.start()  # (and comes soon after a free that kept it: until close)
        registry.register(self)

    @property
    def backend(self) -> str:
        """The backend's name (``"local"``, ``"ray"``, ...)."""
        return self._backend.name

    @property
    def host_of(self) -> Any:
        """The host of each device id (indexable), where the backend knows hosts (the
        simulator: views then show a row per host), else None."""
        return getattr(self._backend, "host_of", None)

    @property
    def executor(self) -> Executor:
        """The backend's executor object (where the islands live)."""
        return self._backend

    # --- topology --------------------------------------------------------------------------
    @property
    def islands(self) -> tuple[Island, ...]:
        return self._islands

    @property
    def devices(self) -> tuple[Any, ...]:
        return tuple(d for isl in self._islands for d in isl.devices)

    @property
    def slices(self) -> tuple[VirtualSlice, ...]:
        return self.resources.slices

    @suggests_keywords("ctl.slice")
    def slice(self, shape: int | Sequence[int], island: int | None = None,
              axis_names: Sequence[str] | None = None,
              axis_types: str | AxisType | Sequence[str | AxisType] | None = None,
              devices: Sequence[int] | None = None, *,
              replacing: VirtualSlice | None = None) -> VirtualSlice:
        """A virtual slice of ``shape`` (int or mesh shape) on ``island`` (default: the one
        whose least loaded devices carry the fewest other slices, so free devices on any
        island come first). Slices may share devices; the gang scheduler time-multiplexes them.
        ``axis_types``: ``"explicit"`` or ``"auto"`` (or ``jax.sharding.AxisType`` values),
        one for all axes or one per axis; default: what ``jax.make_mesh`` gives (explicit).
        ``devices``: device ids or JAX devices, in mesh order (default: the least loaded).
        ``replacing``: a slice this one takes the place of (a name bound again): placed as
        though that one were given back, which it is once this one is made.
        """
        return self.resources.allocate(shape, island, axis_names, axis_types, devices,
                                       replacing)

    @suggests_keywords("ctl.remap")
    def remap(self, vs: VirtualSlice, island: int | None = None) -> VirtualSlice:
        """Move ``vs`` to other devices; its functions are lowered again on next use."""
        return self.resources.remap(vs, island)

    # --- policy, dispatch, clients ---------------------------------------------------------
    @property
    def policy(self) -> str:
        return self._policy.value

    @policy.setter
    def policy(self, value: Policy | str) -> None:
        self._check_open()
        self._policy = Policy.parse(value)
        for queue in self._dispatcher.islands.values():
            queue.set_policy(self._policy)
        self._dispatcher.check_memory_when_idle()  # in another order, another node is next

    @property
    def dispatch(self) -> str:
        return self._dispatcher.mode.value

    @dispatch.setter
    def dispatch(self, value: DispatchMode | str) -> None:
        self._check_open()
        self._dispatcher.mode = DispatchMode.parse(value)

    @contextlib.contextmanager
    @suggests_keywords("ctl.client")
    def client(self, name: str, weight: float = 1.0, priority: int = 0) -> Iterator[ClientSpec]:
        """Programs submitted inside belong to client ``name`` (in this thread/context).

        ``weight`` sets its proportional share under ``policy="share"``; ``priority`` its
        rank under ``policy="priority"`` (higher runs first).
        """
        self._check_open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a client name must be a non-empty string, got {name!r}.")
        if (isinstance(weight, bool) or not isinstance(weight, int | float | np.number)
                or not 0 < weight < float("inf")):  # (an infinite one starves the others)
            raise ValueError(f"client weight must be a finite number > 0, got {weight!r}; "
                             "e.g. weight=2 for twice the share of a weight-1 client.")
        if isinstance(priority, bool) or not isinstance(priority, int | np.integer):
            raise ValueError(f"client priority must be an integer (higher runs first), got "
                             f"{priority!r}; e.g. priority=1.")
        spec = ClientSpec(name, float(weight), int(priority))
        token = _client.set(spec)
        try:
            yield spec
        finally:
            _client.reset(token)

    @property
    def current_client(self) -> ClientSpec:
        return _client.get() or DEFAULT_CLIENT

    # --- programs --------------------------------------------------------------------------
    def submit(self, graph: Graph, leaves: list,
               dispatch: DispatchMode | str | None = None) -> list[Future]:
        """Submit a traced graph with its flattened arguments; returns the output futures.
        ``dispatch``: this submission's mode (default: ``ctl.dispatch``)."""
        self._check_open()
        mode = None if dispatch is None else DispatchMode.parse(dispatch)
        plan = graph.plan or self._dispatcher.plan(graph)
        if plan.guarded:  # (the caller's transfer guards, read in its thread as jax.jit does)
            guards.check(graph.name, plan.guarded)
        # (the dispatcher refuses futures of another controller in its one pass over leaves)
        with interrupts.held:  # (an interrupt now would leave a launch half made)
            return self._dispatcher.submit(graph, leaves, self.current_client, mode)

    def runs(self) -> list[ProgramRun]:
        """The runs (programs' submissions) that have not ended yet."""
        return self._dispatcher.active_runs()

    @suggests_keywords("ctl.wait")
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every run submitted has ended; False after ``timeout`` seconds in
        all."""
        timeout = timeout_seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        for run in self._dispatcher.all_runs():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not run.wait(left):
                return False
        return True

    def cancel_all(self) -> int:
        with interrupts.held:
            return sum(run.cancel() for run in self.runs())

    # --- memory and status -----------------------------------------------------------------
    def memory(self) -> dict[Any, int]:
        """Bytes held by live buffers on each device (every device listed, 0 when empty)."""
        counted: dict[int, tuple] = {}  # (the store first: a launch holds its outputs in
        held = self.store.memory(counted)  # its run, then marks the futures it consumed)
        for d, n in self._dispatcher.memory(counted).items():  # values running programs hold
            held[d] = held.get(d, 0) + n
        return {d: held.get(d.id, 0) for d in self.devices}

    def status(self) -> dict[str, Any]:
        """The snapshot as plain dicts and strings: islands (queue depths, the backend's facts),
        slices, programs, memory, policy, dispatch (closed: ``closed`` and nothing listed)."""
        return self.snapshot().as_status()

    def snapshot(self) -> Snapshot:
        """Islands, slices, runs with their nodes, memory, queue depths: frozen records (a
        closed controller's has only ``closed``). Safe beside other threads: one that closes
        the controller while this reads it gives the closed snapshot."""
        if self.closed:
            return Snapshot(closed=True)
        try:
            return self._take()
        except ControllerClosedError:  # (closed by another thread while it was read)
            if self.closed:
                return Snapshot(closed=True)
            raise

    def _take(self) -> Snapshot:
        """Each part read once, in order (islands, slices, runs, memory), from the parts
        that hold it, without stopping anything."""
        islands = tuple(IslandView.of(i, IslandFacts.of(self._backend.status(i.id)),
                                      **self._dispatcher.islands[i.id].status())
                        for i in self._islands)
        slices = tuple(view for vs in self.slices if (view := _view_of(vs)) is not None)
        runs = tuple(RunView.of(r) for r in self.runs())
        memory = {d.id: n for d, n in self.memory().items()}
        return Snapshot(self.closed, self.policy, self.dispatch, islands, slices, runs, memory,
                        PoolView.of_executor(self._backend))

    def _on_free(self, record: BufferRecord) -> None:
        # (installed only under a memory budget: see __init__)
        if record.reserved and record.island is not None and not self.closed:
            queue = self._dispatcher.islands[record.island]
            queue.release_memory(list(record.nbytes), max(record.nbytes.values(), default=0))

    # --- life cycle ------------------------------------------------------------------------
    def reattach(self, island: int | Island) -> Island:
        """Start a new process for ``island`` (an ``Island`` or its id; Ray backend) after its
        actor died; its slices work again. Values that lived on the old one are lost
        (``pw.IslandLostError``)."""
        self._check_open()
        if isinstance(island, Island):
            if island not in self._islands:
                raise SliceError(f"{island!r} is not an island of this controller, whose "
                                 f"islands are {list(self._islands)}. Maybe you want "
                                 "ctl.reattach(ctl.islands[i]) or ctl.reattach(i).")
            island = island.id
        fresh = self._backend.reattach(island)
        self.store.forget(island)  # (the old process's buffers went with it)
        return fresh

    def _check_open(self) -> None:
        if self.closed:
            raise ControllerClosedError("this controller was closed; create a new one with "
                                        "pw.Controller(...) or use pw.controller().")

    def close(self) -> None:
        """Cancel what has not run, wait for what is running, free every buffer and thread.
        Called again while another thread closes, it waits for that close to end."""
        here = threading.current_thread()
        # (a thread that closing waits for: the runtime's, or XLA's running a host callback)
        inside = here.name.startswith("pw-") or callbacks.in_host_callback()
        with self._close_lock:  # (one thread closes; the others wait for it below)
            again = self.closed
            if not again:
                if inside and not done_callbacks.runner.on_its_thread():
                    where = ("a host callback, inside the computation" if
                             callbacks.in_host_callback() else f"the runtime's own thread "
                             f"{here.name!r} (from a host callback, say)")
                    raise RuntimeError(  # (before anything changes: it stays usable)
                        f"ctl.close() was called from {where}, which closing must wait for. "
                        "Call it from your own thread, or from a done-callback "
                        "(add_done_callback).")
                self.closed, self._closer = True, here
        if again:  # (not on a thread that close may be waiting for: its own, the runtime's,
            if here is not self._closer and not inside:  # or the done-callbacks' one)
                self._closed_all.wait()
            return
        try:
            self._close()
        finally:
            self._closed_all.set()
        interrupts.raise_kept()

    def _close(self) -> None:
        with interrupts.held:  # (a Ctrl-C meanwhile is raised once all of it is done: a
            self._dispatcher.shutdown()  # half-closed controller would keep its threads and
            # buffers, and a second close() would not finish it). The callbacks of what ended
            waited = _callbacks_ran()  # meanwhile read values: before they are freed
            self.store.close()
            self.resources.release_all()
            registry.unregister(self)
            if waited:
                _callbacks_ran()  # the callbacks of what closing cancelled ran
            interrupts.courier.stop()  # (its thread ends with the last controller)

    def set_default(self) -> Controller:
        """Make this the process-wide controller that ``pw.controller()`` returns."""
        self._check_open()
        registry.set_default(self)
        return self

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "Controller(closed)"
        isl = ", ".join(f"{i.id}: {len(i.devices)} {i.platform}" for i in self._islands)
        backend = "" if self.backend == "local" else f", backend={self.backend!r}"
        return (f"Controller(islands={{{isl}}}, policy={self.policy!r}, "
                f"dispatch={self.dispatch!r}{backend})")


def _view_of(vs: VirtualSlice) -> SliceView | None:
    """The view of ``vs``; None once it is released (by another thread while it is read,
    maybe: a snapshot leaves it out, as it leaves out one released before)."""
    try:
        return None if vs.released else SliceView.of(vs)
    except SliceError:
        if vs.released:
            return None
        raise


# --- the process-wide controller (the open ones: registry.py) -----------------------------
def controller(islands: Sequence[int] | None = None, **kwargs) -> Controller:
    """The process-wide controller, created on first use.

    Its islands come from ``islands``, else ``PWKERNEL_ISLANDS`` ("4,4"), else what JAX sees
    (accelerators by host; on CPU-only machines the host as islands (4, 4)).
    """
    takes = keywords_of(Controller)
    for k in sorted(kwargs.keys() - set(takes)):
        raise unexpected_keyword("pw.controller", k, takes)
    with registry.making_default():  # (threads asking at once get the one that is made)
        ctl = running_default()
        if ctl is not None:
            unlike = _unlike(ctl, islands, kwargs)
            if not unlike:
                return ctl
            raise ValueError(
                f"pw.controller({', '.join(unlike)}): the process-wide controller exists "
                f"already ({ctl!r}) and its settings are fixed when it is made, so these "
                "would be ignored. Call pw.controller() without them, close it first "
                f"(pw.controller().close()), or make your own: pw.Controller({', '.join(unlike)})")
        ctl = Controller(islands if islands is not None else islands_from_env(), **kwargs)
        registry.set_default(ctl)
    return ctl


def _unlike(ctl: Controller, islands, kwargs: dict) -> list[str]:
    """The arguments of a ``pw.controller(...)`` call that ``ctl`` does not have (one it
    keeps no attribute of, such as ``pool=``, counts as unlike)."""
    sizes = [len(i.devices) for i in ctl.islands]
    out = [] if islands is None or (isinstance(islands, Sequence) and sizes == list(
        islands)) else [f"islands={islands!r}"]
    for k, v in kwargs.items():
        have = getattr(ctl, k, _NOT_GIVEN)
        if have is _NOT_GIVEN or have != getattr(v, "value", v):
            out.append(f"{k}={v!r}")
    return out

"""The runtime's read side: ``ctl.snapshot()``, one consistent-enough picture of a controller
as frozen records, for everything above the runtime (the notebook's displays, the sidebar's
comm, the views). Readers never reach into the dispatcher, the scheduler or a task.

The controller builds it from typed parts (each island's queue depths and its executor's
``IslandFacts``, each slice, each run's tasks, and, for a tenant of a device pool, the pool's
tenants from its executor's ``status()["pool"]``), each read once, in order (islands,
slices, runs, memory, pool), without stopping the controller: a program may finish between
two reads, so a run can be listed whose memory is already freed. Every field is a plain value
(ints, strings, tuples, enums): a snapshot can be kept, compared and turned into JSON without
holding the controller's objects alive. ``ctl.status()`` is a snapshot rendered as dicts and strings
(``Snapshot.as_status()``); nothing reads a snapshot back out of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .budget import Waiting
from .executor import IslandFacts
from .resources import describe_axis_types
from .tasks import TaskState

if TYPE_CHECKING:
    from .resources import Island, VirtualSlice
    from .tasks import ProgramRun, Task

_ENDED_OR_DROPPED = (TaskState.ENDED, TaskState.CANCELLED)


@dataclass(frozen=True)
class IslandView:
    """One island: its devices and the depth of its scheduler's queues."""

    id: int
    platform: str
    device_ids: tuple[int, ...]
    running: int                  # computations launched and not ended
    queued: int                   # computations with the scheduler, not launched yet
    lost: bool = False            # its process died (Ray backend); ctl.reattach(id)
    #: bytes its scheduler has reserved for launched work, by device
    memory_reserved: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    facts: IslandFacts = IslandFacts()  # what its executor knows (Ray: the actor)
    #: computations that wait for memory only your futures hold (``MemoryWaitWarning``)
    waiting_for_memory: tuple[Waiting, ...] = ()

    @classmethod
    def of(cls, island: Island, facts: IslandFacts, running: int, queued: int,
           memory_reserved: Mapping[int, int], waiting_for_memory=()) -> IslandView:
        """An island with its scheduler's queue depths and its executor's facts."""
        return cls(island.id, island.platform, tuple(island.device_ids), int(running),
                   int(queued), bool(facts.lost), MappingProxyType(
                       {int(d): int(n) for d, n in memory_reserved.items()}), facts,
                   tuple(waiting_for_memory))

    def as_status(self) -> dict[str, Any]:
        """This island in ``ctl.status()``."""
        out = {"id": self.id, "platform": self.platform, "devices": list(self.device_ids),
               "running": self.running, "queued": self.queued,
               "memory_reserved": dict(self.memory_reserved),
               "waiting_for_memory": [
                   {"computation": w.name, "program": w.program, "run": w.run,
                    "client": w.client, "devices": sorted(w.devices), "bytes": w.nbytes}
                   for w in self.waiting_for_memory],
               **self.facts.details}
        if self.facts.lost is not None:
            out["lost"] = self.facts.lost
        return out


@dataclass(frozen=True)
class SliceView:
    """One virtual slice: where it is and its mesh."""

    id: int
    island: int
    device_ids: tuple[int, ...]
    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    axis_types: tuple[str, ...]   # "explicit" or "auto", one per axis

    @classmethod
    def of(cls, vs: VirtualSlice) -> SliceView:
        """The view of a slice that has not been released."""
        return cls(vs.id, vs.island.id, tuple(vs.device_ids), tuple(vs.shape),
                   tuple(vs.axis_names), vs.axis_type_names)

    def __str__(self) -> str:
        """As the slice's own ``repr`` (what ``ctl.status()`` lists)."""
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape, strict=True))
        return (f"VirtualSlice(id={self.id}, {dims}, {describe_axis_types(self.axis_types)}, "
                f"island={self.island}, devices={list(self.device_ids)})")


@dataclass(frozen=True)
class NodeView:
    """One node of a run: a computation on its island, or a copy onto ``island``."""

    name: str
    compute: bool
    island: int                   # computations: their island; copies: the destination
    devices: tuple[int, ...]
    state: TaskState
    t_launch: float               # time.perf_counter() of its launch (0.0 before)

    @classmethod
    def of(cls, task: Task) -> NodeView:
        node = task.node  # its plan node: ``island`` is a copy's destination
        return cls(node.name, node.is_compute, node.island, tuple(node.devices),
                   TaskState(task.state), float(task.t_launch))


@dataclass(frozen=True)
class RunView:
    """One run (a program's submission) that has not ended, with its nodes."""

    id: int
    name: str
    client: str
    nodes: tuple[NodeView, ...]

    @classmethod
    def of(cls, run: ProgramRun) -> RunView:
        return cls(run.id, str(run.name), str(run.client),
                   tuple(NodeView.of(t) for t in list(run.tasks)))

    def __str__(self) -> str:
        """As the run's own ``repr`` (what ``ctl.status()`` lists)."""
        left = sum(n.state not in _ENDED_OR_DROPPED for n in self.nodes)
        state = f"{left} nodes left" if left else "done"
        return f"ProgramRun(id={self.id}, name={self.name!r}, client={self.client!r}, {state})"

    @property
    def running_on(self) -> tuple[int, ...]:
        """The islands where one of its nodes runs now."""
        return tuple(sorted({n.island for n in self.nodes if n.state is TaskState.RUNNING}))

    @property
    def islands(self) -> tuple[int, ...]:
        """The islands it runs or waits on."""
        live = (TaskState.RUNNING, TaskState.QUEUED, TaskState.WAITING)
        return tuple(sorted({n.island for n in self.nodes if n.state in live}))

    @property
    def state(self) -> str:
        """``"running"`` if a node runs now, else ``"queued"``."""
        return "running" if self.running_on else "queued"


@dataclass(frozen=True)
class TenantView:
    """One controller attached to the same pool (a *tenant*), over all the pool's islands."""

    name: str
    #: island id -> the device positions on that island its computations used
    slices: Mapping[int, tuple[int, ...]]
    queued: int                   # operations it has at the islands, not launched yet
    running: int                  # operations launched there, not ended
    share: float                  # its part of the device time the pool's tenants used (0..1)
    device_seconds: float         # device time its computations took (k devices x 1 s = k)
    bytes: int                    # what its buffers hold on the pool's islands
    me: bool                      # this controller

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TenantView:
        """From one tenant of an executor's pool dict (``status()["pool"]["tenants"]``)."""
        slices = {int(i): tuple(int(p) for p in ps) for i, ps in dict(row["devices"]).items()}
        return cls(str(row["name"]), MappingProxyType(dict(sorted(slices.items()))),
                   int(row["queued"]), int(row["running"]), float(row["share"]),
                   float(row["device_seconds"]), int(row["bytes"]), bool(row.get("me")))

    def as_status(self) -> dict[str, Any]:
        return {"name": self.name, "me": self.me, "queued": self.queued,
                "running": self.running, "share": self.share,
                "device_seconds": self.device_seconds, "bytes": self.bytes,
                "slices": {i: list(ps) for i, ps in self.slices.items()}}


@dataclass(frozen=True)
class PoolView:
    """The device pool this controller is a tenant of (``pw.Controller(..., pool=NAME)``):
    every tenant of its islands, this controller among them (``me``)."""

    name: str
    tenants: tuple[TenantView, ...]
    lost: tuple[int, ...] = ()    # islands that did not answer (their actors died)

    @classmethod
    def of(cls, pool: Mapping[str, Any] | None) -> PoolView | None:
        """From an executor's generic pool dict (``status()["pool"]``: ``name``, ``tenants``,
        ``islands``); None for None."""
        if pool is None:
            return None
        lost = tuple(int(i["island"]) for i in pool.get("islands", ()) if i.get("lost"))
        return cls(str(pool["name"]), tuple(TenantView.of(t) for t in pool["tenants"]), lost)

    @classmethod
    def of_executor(cls, executor: Any) -> PoolView | None:
        """The pool of an executor whose islands are a pool's (its ``pool`` names it: see
        ``runtime/executor.py``), read from its ``status()``; None for any other."""
        if getattr(executor, "pool", None) is None:
            return None
        return cls.of(executor.status().get("pool"))

    @property
    def me(self) -> TenantView | None:
        """This controller's row (None if the pool does not list it: it was dropped)."""
        return next((t for t in self.tenants if t.me), None)

    @property
    def others(self) -> tuple[TenantView, ...]:
        return tuple(t for t in self.tenants if not t.me)

    def as_status(self) -> dict[str, Any]:
        return {"name": self.name, "tenants": [t.as_status() for t in self.tenants],
                "lost": list(self.lost)}


@dataclass(frozen=True)
class Snapshot:
    """A controller at one moment (``ctl.snapshot()``); a closed one has only ``closed``."""

    closed: bool
    policy: str = ""
    dispatch: str = ""
    islands: tuple[IslandView, ...] = ()
    slices: tuple[SliceView, ...] = ()
    runs: tuple[RunView, ...] = ()
    memory: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    # ^ device id -> bytes held
    pool: PoolView | None = None  # the pool's tenants, when its islands are a pool's

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", MappingProxyType(
            {int(d): int(n) for d, n in self.memory.items()}))

    def island(self, island_id: int) -> IslandView:
        return next(i for i in self.islands if i.id == island_id)

    def as_status(self) -> dict[str, Any]:
        """``ctl.status()``: this snapshot as plain dicts and strings."""
        return {"islands": [i.as_status() for i in self.islands],
                "slices": [str(s) for s in self.slices],
                "programs": [str(r) for r in self.runs],
                "memory": dict(self.memory),
                "policy": self.policy, "dispatch": self.dispatch, "closed": self.closed,
                **({} if self.pool is None else {"pool": self.pool.as_status()})}

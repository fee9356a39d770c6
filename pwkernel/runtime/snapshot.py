"""The runtime's read side: ``ctl.snapshot()``, one consistent-enough picture of a controller
as frozen records, for everything above the runtime (the notebook's displays, the sidebar's
comm, the views). Readers never reach into the dispatcher, the scheduler or a task.

Each part is read once, in order (islands, slices, runs, memory), without stopping the
controller: a program may finish between two reads, so a run can be listed whose memory is
already freed. Every field is a plain value (ints, strings, tuples, enums): a snapshot can be
kept, compared and turned into JSON without holding the controller's objects alive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .tasks import TaskState

if TYPE_CHECKING:
    from .controller import Controller
    from .resources import VirtualSlice


@dataclass(frozen=True)
class IslandView:
    """One island: its devices and the depth of its scheduler's queues."""

    id: int
    platform: str
    device_ids: tuple[int, ...]
    running: int                  # computations launched and not ended
    queued: int                   # computations with the scheduler, not launched yet
    lost: bool = False            # its process died (Ray backend); ctl.reattach(id)


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


@dataclass(frozen=True)
class NodeView:
    """One node of a run: a computation on its island, or a copy onto ``island``."""

    name: str
    compute: bool
    island: int                   # computations: their island; copies: the destination
    devices: tuple[int, ...]
    state: TaskState
    t_launch: float               # time.perf_counter() of its launch (0.0 before)


@dataclass(frozen=True)
class RunView:
    """One submitted program that has not finished, with its nodes."""

    id: int
    name: str
    client: str
    nodes: tuple[NodeView, ...]

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

    def island(self, island_id: int) -> IslandView:
        return next(i for i in self.islands if i.id == island_id)


def _node(task) -> NodeView:
    node = task.node  # its plan node: ``island`` is a copy's destination
    return NodeView(node.name, node.is_compute, node.island, tuple(node.devices),
                    TaskState(task.state), float(task.t_launch))


def take(ctl: Controller) -> Snapshot:
    """The snapshot of ``ctl`` (what ``ctl.snapshot()`` returns)."""
    if ctl.closed:
        return Snapshot(closed=True)
    status = ctl.status()
    islands = tuple(IslandView(i["id"], i["platform"], tuple(i["devices"]), int(i["running"]),
                               int(i["queued"]), bool(i.get("lost", False)))
                    for i in status["islands"])
    slices = tuple(SliceView.of(vs) for vs in ctl.slices if not vs.released)
    runs = tuple(RunView(r.id, str(r.name), str(r.client),
                         tuple(_node(t) for t in list(r.tasks)))
                 for r in ctl.runs())
    memory = MappingProxyType({int(d): int(n) for d, n in status["memory"].items()})
    return Snapshot(False, status["policy"], status["dispatch"], islands, slices, runs,
                    memory)

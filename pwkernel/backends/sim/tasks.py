"""The engine's bookkeeping for one node of one submitted program, and for a set of chips."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...runtime.trace import LinkKind
from .program import NodeKind, SimNode

if TYPE_CHECKING:
    from .cluster import Cluster


@dataclass(frozen=True, eq=False)
class DeviceSet:
    """Chips looked up once: their NumPy index, their hosts and their island."""

    devices: tuple[int, ...]
    idx: np.ndarray
    hosts: np.ndarray          # unique host ids, ascending
    island: int
    host_of: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, devices: tuple[int, ...], cluster: Cluster) -> DeviceSet:
        idx = np.asarray(devices, dtype=np.int64)
        host_of = cluster.host_of[idx]
        return cls(tuple(devices), idx, np.unique(host_of),
                   int(cluster.island_of[idx[0]]), host_of)

    @property
    def nhosts(self) -> int:
        return len(self.hosts)

    def on_host(self, h: int) -> list[int]:
        """The chips of this set on host ``h``."""
        return self.idx[self.host_of == h].tolist()


class SimTask:
    """One node of one run: its counters (inputs not yet launched, not yet ended, not yet heard
    of by the client), its place in chip queues, and its times."""

    __slots__ = ("id", "run", "node", "devset", "src", "weight", "priority", "island",
                 "is_compute", "link", "producers", "consumers", "unlaunched", "undone",
                 "unheard", "unarrived", "submitted", "launched", "running", "done",
                 "rendezvous", "at_head", "shards_done", "blockers", "next", "order", "t_submit",
                 "t_start", "t_end")

    def __init__(self, id: int, run: SimRun, node: SimNode, devset: DeviceSet,
                 src: DeviceSet | None, weight: float, priority: int):
        self.id, self.run, self.node = id, run, node
        self.devset, self.src = devset, src
        self.weight, self.priority = weight, priority
        self.island = devset.island
        self.is_compute = node.kind is NodeKind.COMPUTE
        if self.is_compute:
            self.link: str | None = None
        elif src is None:
            self.link = "host"
        elif src.island == devset.island:
            self.link = LinkKind.ICI.value
        else:
            self.link = LinkKind.DCN.value
        self.producers: list[SimTask] = []
        self.consumers: list[SimTask] = []
        self.unlaunched = self.undone = self.unheard = len(node.inputs)
        self.unarrived = 1
        self.submitted = self.launched = self.done = False
        self.running = 0
        self.rendezvous = True
        self.at_head: list[int] = []
        self.shards_done = 0
        self.blockers = 0                 # what it waits for in the chips' queues (chips.py)
        self.next: list[SimTask] = []     # queued right behind it on some chip (GangQueues)
        self.order: int | None = None     # its place in launch order, once queued
        self.t_submit = 0.0
        self.t_start: float | None = None
        self.t_end: float | None = None

    def __repr__(self) -> str:
        return f"SimTask({self.node.name!r} of {self.run.name!r}, id={self.id})"


@dataclass
class SimRun:
    """One submission of a program: when it was submitted and when its last node ended."""

    id: int
    name: str
    client: str
    t_submit: float
    t_done: float | None = None
    remaining: int = 0
    tasks: list[SimTask] = field(default_factory=list, repr=False)

    @property
    def duration(self) -> float | None:
        return None if self.t_done is None else self.t_done - self.t_submit

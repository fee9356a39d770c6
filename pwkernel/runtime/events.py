"""The gang scheduler's vocabulary: its policies, the events it takes and the decisions it gives.

Events and decisions are small slotted dataclasses, values by convention: they are not
``frozen`` because a frozen dataclass's ``__init__`` costs two to three times more, and the
runtime makes three or four of them per computation. Their fields are keyword-only, so no
caller depends on the fields' order: ``Submit(task=3, devices=(0, 1), ready=True)``.
``runtime.scheduler`` re-exports them all.

Who submits is one ``ClientSpec`` (name, weight, priority), carried whole by ``Submit`` and
``SubmitProgram``: the controller's ``ctl.client(...)`` block makes it, a run keeps it, and
the scheduler reads it here.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"
    SHARE = "share"

    @classmethod
    def parse(cls, value: Policy | str) -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown scheduling policy {value!r}; expected one of "
                f"{[p.value for p in cls]}, e.g. ctl.policy = 'share'."
            ) from None


@dataclass(frozen=True)
class ClientSpec:
    """Who submits work: the client's ``name``, its ``weight`` under the ``share`` policy and
    its ``priority`` under ``priority`` (``with ctl.client("alice", weight=2): ...``)."""

    name: str = "default"
    weight: float = 1.0
    priority: int = 0


DEFAULT_CLIENT = ClientSpec()


# --- events (in) ---------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class Submit:
    """A computation joins the island's queue. ``memory`` is bytes it adds on each device.
    ``credit``: bytes per device, counted already, of the buffers it donates (consumes): it
    fits when ``memory - credit`` does, as the runtime gives those back when it launches
    (XLA reuses them for its outputs), so a step that donates its state needs room for one
    state, not two."""

    task: int
    devices: tuple[int, ...]
    client: ClientSpec = DEFAULT_CLIENT
    cost_key: Hashable = None
    memory: int = 0
    ready: bool = False
    after: tuple[int, ...] = ()  # tasks of this island whose outputs it reads
    group: Hashable = None  # its program run (see ``GangScheduler.program_ahead``)
    copy: bool = False  # a copy onto the island: it needs only ``memory`` (see the module doc)
    credit: int = 0  # bytes per device of counted buffers it donates (given back at launch)


@dataclass(slots=True, kw_only=True)
class NodeSpec:
    """The part of one computation of a program that is the same for every run of it.

    Indices are positions in the program (task id = ``SubmitProgram.base`` + index).
    ``waits``: computations of this program on this island it reads from directly; it is ready
    once they are launched (and, when ``external``, once a ``Ready`` event says its other
    inputs are there). ``after``: every computation of this program on this island whose
    outputs it reads (through transfers too), which it may queue behind."""

    index: int
    devices: frozenset[int]
    cost_key: Hashable = None
    memory: int = 0
    waits: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    external: bool = False
    credit: int = 0  # bytes per device of counted values of the run it donates (``Submit``)


@dataclass(slots=True, kw_only=True)
class SubmitProgram:
    """All of one program run's computations on this island, in program (topological) order."""

    base: int
    nodes: tuple[NodeSpec, ...]
    client: ClientSpec = DEFAULT_CLIENT
    group: Hashable = None


@dataclass(slots=True, kw_only=True)
class Ready:
    """All inputs of ``task`` exist, or are being computed by ``after`` (in-flight tasks of
    this island it may queue behind)."""

    task: int
    after: tuple[int, ...] = ()
    credit: int = 0  # more bytes per device it donates (counted arguments: see ``Submit``)


@dataclass(slots=True, kw_only=True)
class Ended:
    """``task`` ended (completed or failed) after running ``seconds`` on its devices."""

    task: int
    seconds: float = 0.0


Finished = Ended  # the event's name before the glossary (docs/architecture.md) said "end"


@dataclass(slots=True, kw_only=True)
class Cancel:
    """Drop ``task`` if it has not started; a running computation cannot be preempted."""

    task: int


@dataclass(slots=True, kw_only=True)
class MemoryFreed:
    """``nbytes`` of ``device``'s memory were given back (a value freed)."""

    device: int
    nbytes: int


@dataclass(slots=True, kw_only=True)
class SetPolicy:
    policy: Policy


@dataclass(slots=True, kw_only=True)
class Forget:
    """Client ``client`` is gone for good, its work all ended (a pool's tenant that left):
    its account and the estimates of its ``cost_keys`` go (``ClientLedger.forget``)."""

    client: str
    cost_keys: tuple = ()


@dataclass(slots=True, kw_only=True)
class Backfill:
    """Nothing runs anywhere and what waits here for memory cannot get it by waiting: one pass
    in which a computation waiting only for memory does not reserve its devices, so ready work
    behind it that fits may launch (its end may free what the other waits for). Sent by the
    runtime before it stops a program for memory (``runtime.budget``)."""


# --- decisions (out) -----------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class Launch:
    task: int


@dataclass(slots=True, kw_only=True)
class Reject:
    task: int
    reason: str

    @classmethod
    def refusing(cls, task: int, devices: frozenset[int], memory: int, island: tuple[int, ...],
                 budget: int | None) -> Reject:
        """Why an island (its ``devices``, its memory ``budget``) refuses ``task``."""
        if not devices or not devices <= set(island):
            unknown = sorted(devices - set(island))
            return cls(task=task, reason=f"devices {unknown or '[]'} are not on this island "
                                         f"(its devices: {list(island)})")
        return cls(task=task, reason=f"needs {memory} bytes per device but the memory budget "
                   f"is {budget}; raise memory_budget or split the work into smaller pieces")

"""The executor interface: what a backend implements, and the registry of backends by name.

The runtime decides (traces programs, plans them, gang-schedules them per island, keeps futures
and the trace); an executor runs what was decided, where its islands live: this process's JAX
devices (``backends/local``), Ray actors (``backends/ray``), or a simulated cluster
(``backends/sim``). The runtime talks to islands only through this interface and never imports
a backend: ``pwkernel.backends`` registers its backends here by name, and
``pw.Controller(backend=...)`` takes such a name or an object that implements ``Executor``.

The contract, per task (``runtime.tasks.Task``): an executor runs what it is handed and says
when each launch has completed; it keeps no order of ends and changes no task's state.

- ``launch(island, tasks)`` gets computations in the order the island's gang scheduler decided
  them and must start them in that order on their devices (``task.inputs()`` are the input
  values, ``task.node.call`` the executable's call path). It must not raise for one task's
  failure (that is the task's ``error``).
- ``transfer(task)`` copies ``task.inputs()[0]`` onto ``task.node.sharding`` (island
  ``task.node.island``).
- For each, it calls ``task.launched(values)`` once the outputs exist as values that may still
  be computing (optional when it reports the completion with them at once), and
  ``task.completed(t, error=None, values=None, t_start=None)`` exactly once when the launch has
  run: seen at ``t`` on ``now()``'s clock, failed with ``error``, its outputs ``values`` if
  ``launched`` did not give them, and ``t_start`` only if it knows when the work began on its
  devices. From any thread, in any order.
- The runtime reports the task's end from there (``runtime/ends.py``): in launch order per
  device set, after its inputs' ends (an upstream error wins), starting not before its launch,
  its inputs' ends and the previous end on its devices. No completion waits in the executor's
  threads for that: one that must wait is parked, and the end it waits for reports it.
  (``task.ended(t_start, t_end, error, values)``, the older contract, reports the end at
  once: for an executor that keeps that order itself, as the simulator's clock does.)

Nothing here assumes that one controller owns an island: each task carries its own run, which
is where its end is reported.

Optional members, looked up by the runtime with ``getattr``:

- ``expedite(task, timeout)``: a thread is about to wait for ``task``'s outputs;
- ``submitted(run)``: a program run was just submitted (before any of its tasks launch);
- ``virtual = True``: time is a virtual clock that moves only while someone waits (the
  simulator): the runtime then does a sequential run's host-side work in the thread that
  causes it (no dispatcher thread), calls ``expedite`` for any task not yet ended, and
  ``settle(predicate, timeout)`` when it waits for a whole run: the executor moves its clock
  until ``predicate()`` holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .plan import Plan
    from .resources import Island
    from .tasks import Task


@runtime_checkable
class Executor(Protocol):
    """Where islands live and work runs (see the module docstring for the contract)."""

    name: str
    islands: tuple[Island, ...]
    #: its islands take a program's nodes together: the scheduler may queue a program's
    #: computations behind each other (one message per island per program)
    program_ahead: bool

    def now(self) -> float:
        """The clock every time in the trace is on."""

    def prepare(self, plan: Plan) -> None:
        """Host-side work for a plan, once, before its first run (e.g. serialize executables
        for remote islands); may keep what it made in ``plan.backend``."""

    def launch(self, island: int, tasks: Sequence[Task]) -> None:
        """Start these computations of ``island``, in this order."""

    def transfer(self, task: Task) -> None:
        """Start copying a value onto the task's destination layout."""

    def group(self) -> contextlib.AbstractContextManager:
        """Launches and transfers started inside may travel together (one message)."""

    def fetch(self, value, sharding) -> Any:
        """A value as a local ``jax.Array`` for the user (``Future.result()``)."""

    def status(self, island: int) -> dict[str, Any]:
        """Facts about one island for ``ctl.status()`` (may be empty)."""

    def reattach(self, island: int) -> Island:
        """Replace a lost island (a backend whose islands cannot be lost raises)."""

    def close(self) -> None:
        """Wait for what runs, then free every thread, process and buffer."""


# --- backends by name ----------------------------------------------------------------------
_FACTORIES: dict[str, Callable[..., Executor]] = {}


def register_backend(name: str, factory: Callable[..., Executor]) -> None:
    """Make ``pw.Controller(backend=name)`` call ``factory(islands, **options)``."""
    _FACTORIES[name] = factory


def backends() -> tuple[str, ...]:
    """The names ``pw.Controller(backend=...)`` knows."""
    return tuple(_FACTORIES)


_REQUIRED = ("launch", "transfer", "islands", "now", "prepare", "group", "fetch", "close")


def create(backend: str | Executor, islands: Sequence[int] | None,
           **options: Any) -> Executor:
    """The executor ``backend`` names (built for ``islands`` with ``options``, those not
    None), or ``backend`` itself when it is an executor object."""
    given = {k: v for k, v in options.items() if v is not None}
    if isinstance(backend, str):
        factory = _FACTORIES.get(backend)
        if factory is None:
            raise ValueError(f"unknown backend {backend!r}; expected one of {list(_FACTORIES)} "
                             "(e.g. 'local': this process's devices, 'ray': islands as Ray "
                             "actors), or an executor object.")
        return factory(islands, **given)
    missing = [m for m in _REQUIRED if not hasattr(backend, m)]
    if missing:
        raise TypeError(f"backend must be a name {list(_FACTORIES)} or an object implementing "
                        f"pw.Executor; {type(backend).__name__} lacks {missing}.")
    if given:
        raise ValueError(f"{sorted(given)} configure a backend made by name; an executor object "
                         "comes configured. Drop them, or pass backend by name.")
    return backend


class NoGroup:
    """``group()`` for executors whose launches need no gathering."""

    def group(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

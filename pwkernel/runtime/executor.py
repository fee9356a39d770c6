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
  ``task.node.island``); an upload of several host values (only to an executor with
  ``batches_uploads = True``) copies each of ``task.inputs()`` onto its
  ``task.node.shardings`` entry, its outputs in that order.
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
- ``failure(value) -> BaseException | None``: the error a value holds that its launch's end
  did not report (the local backend reports a launch ready at once without waiting on it; one
  that failed while it ran keeps its error in its outputs): ``fut.result()`` raises it and
  ``fut.exception()`` returns it;
- ``virtual = True``: time is a virtual clock that moves only while someone waits (the
  simulator): the runtime then does a sequential run's host-side work in the thread that
  causes it (no dispatcher thread), calls ``expedite`` for any task not yet ended, and
  ``settle(predicate, timeout)`` when it waits for a whole run: the executor moves its clock
  until ``predicate()`` holds.
- ``launch_holds_inputs = True``: a launched computation keeps its inputs' buffers alive
  until it has run, whoever else drops them (JAX's own arrays: the local backend). The runtime
  then lets go of a value its run made once the value's last reader has launched, as
  ``jax.jit``'s caller drops an intermediate, so XLA frees it when that reader has run (and
  reuses its memory for the next step's outputs) instead of when the reader's end is reported.
  Without it the runtime deletes such a value after its last reader's end.
- ``batches_uploads = True``: a call's host values (NumPy arrays, Python scalars) come as
  one transfer of them all (``Graph.upload``), which it copies in one go; without it, one
  transfer per value.
- ``compile(spec) -> Executable``: lower a ``pw.function``'s specialization for its islands
  (``spec``: a ``runtime.specialization.Specialization``, the traced body with its input and output
  types and shardings, and the function's backend ``hint``) instead of the runtime's own
  ``jax.jit`` compile in this process; ``spec.executable(...)`` builds the result. The
  simulator lowers on the abstract mesh of its chips and compiles nothing. Without it, the
  runtime compiles for the slice's devices (local and Ray islands).
- ``check_hint(name, hint)``: a ``pw.function`` named ``name`` was made with a backend hint
  (``sim_cost=``) on one of its islands: raise if this backend cannot use it. The runtime
  carries a hint unread; only the backend that owns it reads it.
- ``record_into(trace)``: the controller's ``Trace``, given once when it is made, for work the
  executor sees but the runtime did not launch (a device pool's other tenants, Ray: their
  events carry ``tenant``).
- ``pool``: the name of the device pool whose islands these are (None: not a pool's); then
  ``status()`` without an island returns a dict whose ``"pool"`` lists the pool's tenants
  (``name``, ``tenants``, ``islands``), which ``ctl.snapshot().pool`` is made from.

Backends by name: ``register_backend(name, factory, options)`` declares the options of
``pw.Controller`` the backend takes (``ray_address`` for ``"ray"``, ``cluster`` for ``"sim"``,
``dcn`` for ``"local"``), and ``create`` hands each backend only its own: an option given to
another backend is refused in one line that names the backend taking it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .plan import Plan
    from .resources import Island
    from .tasks import Task


@dataclass(frozen=True)
class IslandFacts:
    """What an executor knows of one island (``status(island)``), for ``ctl.snapshot()`` and
    ``ctl.status()``: ``lost`` is read by the runtime, ``details`` are shown as they are.

    >>> IslandFacts(lost=False, details={"generation": 1}).lost
    False
    """

    #: its process died (Ray: ``ctl.reattach(id)``); None: this backend's islands cannot be lost
    lost: bool | None = None
    #: the backend's own facts (Ray: the actor; the simulator: its cluster and clock)
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @classmethod
    def of(cls, facts: IslandFacts | Mapping[str, Any] | None) -> IslandFacts:
        """``facts`` as a record: an executor may still return a plain mapping (its
        ``"lost"``, when present, is the island's ``lost``; the rest its details)."""
        if isinstance(facts, IslandFacts):
            return facts
        if facts is None:
            return cls()
        if not isinstance(facts, Mapping):
            raise TypeError(f"an executor's status(island) returns an IslandFacts "
                            f"(pwkernel.runtime.executor) or a mapping of facts, got "
                            f"{type(facts).__name__}.")
        rest = dict(facts)
        lost = rest.pop("lost", None)
        return cls(None if lost is None else bool(lost), rest)


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

    def status(self, island: int) -> IslandFacts:
        """Facts about one island for ``ctl.snapshot()`` and ``ctl.status()``."""

    def reattach(self, island: int) -> Island:
        """Replace a lost island (a backend whose islands cannot be lost raises)."""

    def close(self) -> None:
        """Wait for what runs, then free every thread, process and buffer."""

    # Optional, looked up with getattr (see the module docstring): expedite(task, timeout),
    # submitted(run), failure(value), virtual and settle(predicate, timeout),
    # compile(spec) -> Executable
    # (a runtime.specialization.Specialization in, a runtime.executable.Executable out), and
    # check_hint(name, hint).


# --- backends by name ----------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """A backend in the registry: how to make its executor, and the options it takes (each
    named with what it means, for the error that refuses it elsewhere)."""

    name: str
    factory: Callable[..., Executor]
    options: Mapping[str, str] = field(default_factory=dict)
    #: refuses a bad value of the ``pw.function`` hint this backend reads (``sim_cost``),
    #: whichever backend the function is made on, so a typo fails where it is written
    hint_check: Callable[[str, Any], None] | None = None
    #: refuses options that name nothing (a pool that does not exist) before anything is
    #: made or closed (``check_options``): cheap, connects to nothing
    options_check: Callable[..., None] | None = None


_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[..., Executor],
                     options: Mapping[str, str] | None = None,
                     hint_check: Callable[[str, Any], None] | None = None,
                     options_check: Callable[..., None] | None = None) -> None:
    """Make ``pw.Controller(backend=name, **given)`` call ``factory(islands, **given)``, where
    ``given`` holds only the ``options`` this backend declares (option name -> what it is);
    ``hint_check(name, hint)`` refuses a bad ``pw.function`` hint for this backend;
    ``options_check(**given)`` refuses options that name nothing, before anything is made."""
    _BACKENDS[name] = Backend(name, factory, MappingProxyType(dict(options or {})), hint_check,
                              options_check)


def check_hint(executor: Executor, name: str, hint: Any) -> None:
    """Refuse a bad backend hint of the ``pw.function`` named ``name``: the executor's own
    ``check_hint`` if it has one, else every registered backend's (a function made on one
    backend may be run on another, as the tutorials run one program locally and simulated)."""
    own = getattr(executor, "check_hint", None)
    checks = [own] if own is not None else [b.hint_check for b in _BACKENDS.values()
                                            if b.hint_check is not None]
    for check in checks:
        check(name, hint)


def backends() -> tuple[str, ...]:
    """The names ``pw.Controller(backend=...)`` knows."""
    return tuple(_BACKENDS)


_REQUIRED = ("launch", "transfer", "islands", "now", "prepare", "group", "fetch", "close")


def check_options(backend: str, **options: Any) -> Backend:
    """Refuse what ``pw.Controller(backend=backend, **options)`` would refuse before it makes
    anything: an unknown backend, another backend's option, options that name nothing (a
    pool that does not exist: the backend's ``options_check``). Options that are None are not
    given. Returns the backend's entry."""
    given = {k: v for k, v in options.items() if v is not None}
    entry = _BACKENDS.get(backend)
    if entry is None:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(_BACKENDS)} "
                         "(e.g. 'local': this process's devices, 'ray': islands as Ray "
                         "actors), or an executor object.")
    for option in given:
        if option not in entry.options:
            raise ValueError(_misplaced(option, backend))
    if entry.options_check is not None:
        entry.options_check(**given)
    return entry


def create(backend: str | Executor, islands: Sequence[int] | None,
           **options: Any) -> Executor:
    """The executor ``backend`` names (built for ``islands`` with ``options``, those not
    None), or ``backend`` itself when it is an executor object."""
    given = {k: v for k, v in options.items() if v is not None}
    if isinstance(backend, str):
        return check_options(backend, **given).factory(islands, **given)
    missing = [m for m in _REQUIRED if not hasattr(backend, m)]
    if missing:
        raise TypeError(f"backend must be a name {list(_BACKENDS)} or an object implementing "
                        f"pw.Executor; {type(backend).__name__} lacks {missing}.")
    if given:
        raise ValueError(f"{sorted(given)} configure a backend made by name; an executor object "
                         "comes configured. Drop them, or pass backend by name.")
    return backend


def _misplaced(option: str, backend: str) -> str:
    """One line: ``option`` is another backend's (which one, and what it means)."""
    owners = [b for b in _BACKENDS.values() if option in b.options]
    if not owners:
        return f"{option}= is not an option of backend={backend!r}; drop {option}=."
    owner = owners[0]
    return (f"{option}= is only for backend={owner.name!r} ({owner.options[option]}), not for "
            f"backend={backend!r}; drop {option}=, or pass backend={owner.name!r} with it.")


class NoGroup:
    """``group()`` for executors whose launches need no gathering."""

    def group(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

"""The error types users catch. Each subclasses a built-in so plain ``except`` clauses work."""

from __future__ import annotations


class PathwaysError(Exception):
    """Base class of every error pwkernel raises on purpose."""


class SliceError(PathwaysError, ValueError):
    """A virtual slice was asked for that cannot exist, or a released slice was used."""


class SpecError(PathwaysError, ValueError):
    """A PartitionSpec or array shape does not fit the slice's mesh."""


class ProgramError(PathwaysError, TypeError):
    """A program or compiled function was called or traced in a way it cannot handle."""


class ControllerClosedError(PathwaysError, RuntimeError):
    """The controller was closed; its slices, functions and futures can no longer be used."""


class MemoryBudgetError(PathwaysError, MemoryError):
    """A single computation needs more device memory than the controller's budget allows."""


class DeviceSetupError(PathwaysError, RuntimeError):
    """JAX's devices cannot be arranged into the requested islands."""


class CancelledError(PathwaysError, RuntimeError):
    """A computation was cancelled (by the user, an interrupt or a timeout) before it ran."""


class IslandLostError(PathwaysError, RuntimeError):
    """An island's process died (Ray backend): its buffers are gone, and computations that
    needed them fail. ``ctl.reattach(island)`` starts a replacement."""


class NoValueError(PathwaysError, RuntimeError):
    """A future of a simulated controller (``backend="sim"``) was asked for its value: a
    simulation knows shapes, dtypes, shardings and times, and computes nothing."""


class NeedsValueError(ProgramError):
    """Python asked for the value of something a program has not computed yet, while the
    program was traced (``float(v)``, ``if v:``): a ``%%pathways`` cell runs that statement
    as plain Python instead."""

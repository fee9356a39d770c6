"""The simulator's error types (each a ``pw.PathwaysError`` and a built-in)."""

from __future__ import annotations

from ...runtime.errors import PathwaysError


class SimError(PathwaysError, ValueError):
    """A cluster, program or cost that the simulator cannot use as given."""


class DeadlockError(PathwaysError, RuntimeError):
    """Devices wait on each other in a circle: the simulation cannot go on.

    ``deadlock`` (a ``Deadlock``) names the devices and the computations each one is stuck in.
    """

    def __init__(self, message: str, deadlock):
        super().__init__(message)
        self.deadlock = deadlock


class UncountedLoopWarning(UserWarning):
    """A computation's simulated duration counts a loop's body once because its trip count is
    data (a ``while_loop``, or a ``fori_loop`` with traced bounds), which a simulation never
    computes: the time is too short unless you give ``sim_cost=seconds``. Said once per
    compiled function and input signature."""

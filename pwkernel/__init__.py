"""pwkernel: Pathways-style single-controller distributed ML on JAX, in a Jupyter kernel.

>>> import numpy as np, pwkernel as pw
>>> ctl = pw.Controller(islands=(4, 4))
>>> s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
>>> a = pw.function(lambda x: x * 2, slice=s0)
>>> b = pw.function(lambda x: x + 1, slice=s1)
>>> c = pw.function(lambda x: x / 2, slice=s1)
>>> @pw.program
... def f(v):
...     x = a(v)
...     return b(x), a(c(x))
>>> y, z = f(np.array([1.0, 2.0]))
>>> y.result().tolist(), z.result().tolist()
([3.0, 5.0], [2.0, 4.0])
>>> ctl.close()
"""

from . import backends  # noqa: F401 - registers the backends by name (local, ray, sim)
from .runtime.controller import Controller, controller
from .runtime.dispatcher import DispatchMode
from .runtime.errors import (
    CancelledError,
    ControllerClosedError,
    DeviceSetupError,
    IslandLostError,
    MemoryBudgetError,
    MemoryWaitWarning,
    NeedsValueError,
    NoValueError,
    PathwaysError,
    ProgramError,
    SliceError,
    SpecError,
)
from .runtime.events import ClientSpec
from .runtime.executor import Executor
from .runtime.objects import Future, FutureState
from .runtime.program import BATCH, INFERRED, CompiledFunction, Program, function, program
from .runtime.registry import SharedDevicesWarning
from .runtime.resources import Island, VirtualSlice
from .runtime.scheduler import GangScheduler, Policy
from .runtime.tasks import ProgramRun
from .runtime.trace import Event, Trace
from .runtime.transfer import Link

__version__ = "0.1.0"

_VIZ = ("ScheduleView", "TopologyView", "report")


def __getattr__(name: str):
    # The widgets import bokeh and ipywidgets; load them only when asked for.
    if name in _VIZ:
        from . import viz

        return getattr(viz, name)
    if name == "sim":  # the simulator (pw.sim.Cluster, ...), loaded when first asked for
        from .backends import sim

        return sim
    if name == "train":  # training on pw.function/@pw.program (pw.train.Pipeline, ...);
        import pwkernel.train as train  # not `from . import train`: that asks here again

        return train
    raise AttributeError(f"module 'pwkernel' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext pwkernel``: host the controller in this kernel and register the magics."""
    from .notebook.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext pwkernel``: close the controller cleanly."""
    from .notebook.extension import unload_ipython_extension as unload

    unload(ipython)

__all__ = [
    "BATCH", "INFERRED", "CancelledError", "ClientSpec", "CompiledFunction", "Controller",
    "ControllerClosedError", "DeviceSetupError", "DispatchMode", "Event", "Executor", "Future",
    "FutureState", "GangScheduler", "Island", "IslandLostError", "Link", "MemoryBudgetError",
    "MemoryWaitWarning", "NeedsValueError", "NoValueError", "PathwaysError", "Policy", "Program",
    "ProgramError", "SharedDevicesWarning", "ProgramRun", "SliceError", "SpecError", "Trace",
    "VirtualSlice", "controller", "function", "program", "ScheduleView", "TopologyView", "report",
    "sim",
]

"""The Pathways simulator: the same programs and the same ``GangScheduler`` on a simulated
cluster, on a virtual clock (``docs/simulator.md``); ``pw.sim`` is this package.

Two ways in: ``pw.Controller(backend="sim", cluster=Cluster.preset(...))`` runs the whole
runtime (``pw.function``, ``@pw.program``, ``%%pathways``, clients, policies, views, reports)
with a simulated executor (``executor.py``); ``Simulator`` runs ``SimProgram``s (plain
graphs, at 2048 chips and beyond, with the deadlock demonstrator and multi-controller JAX).

>>> from pwkernel.backends import sim
>>> cluster = sim.Cluster.preset("tpu-v4", chips=8)
>>> step = sim.SimNode(0, "step", cluster.island_devices(0), seconds=1e-3)
>>> s = sim.Simulator(cluster)
>>> run = s.submit(sim.SimProgram("one step", [step]))
>>> round(s.run() * 1e3, 3) > 1.0
True
"""

from .cluster import CALIBRATION_KEYS, PRESETS, Chip, Cluster, HostCosts, Interconnect, Network
from .cost import Analysis, Collective, Cost, abstract_mesh, analyze, estimate, lower, roofline
from .deadlock import Deadlock, Wait
from .engine import Simulator
from .errors import DeadlockError, SimError, UncountedLoopWarning
from .executor import SimDevice, SimExecutor, SimValue
from .program import NodeKind, SimNode, SimProgram, from_graph, xla_cost
from .tasks import SimRun

__all__ = [
    "CALIBRATION_KEYS", "PRESETS", "Analysis", "Chip", "Cluster", "Collective", "Cost",
    "Deadlock", "DeadlockError", "HostCosts", "Interconnect", "Network", "NodeKind", "SimError",
    "SimDevice", "SimExecutor", "SimNode", "SimProgram", "SimRun", "SimValue",
    "Simulator", "UncountedLoopWarning", "Wait", "abstract_mesh", "analyze",
    "estimate", "from_graph", "lower", "roofline", "xla_cost",
]

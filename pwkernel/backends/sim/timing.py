"""The simulator's one timing model: the virtual clock and every resource that takes turns.

Both simulators keep their time here: the engine (``engine.py``, ``Simulator``: plain
``SimProgram`` graphs at the paper's scale) and the simulated executor (``executor.py``,
``SimExecutor``: the whole runtime on a simulated cluster). Each decides *when* it asks the
model (the engine at the event that makes a thing possible, the executor when the runtime
launches), and the model says how long it takes and who waits for whom:

- **the clock**: ``now`` and one heap of events ordered by (time, sequence number), so equal
  times keep the order they were created in and every run is the same (``at``, ``step``);
- **the client**: one thread per client; a program costs ``client_per_program`` plus
  ``program_fanout_per_host`` per host it reaches (``program_work``), a node
  ``client_per_node`` plus ``fanout_per_host`` per host it touches (``node_work``);
- **the island's scheduler**: one thread per island that sends a launch to each host of a
  computation, ``scheduler_per_host`` each, one host after another; the launch reaches a host
  ``rpc_latency`` later, where the host executor takes ``host_per_node``, one computation
  after another (``send_launch``; ``host_take`` where a host receives work directly, and
  ``host_dispatch`` for multi-controller JAX's per-host client);
- **the chips**, when the start of a computation is known at its launch (``run_on_chips``:
  chips take work in launch order; the engine's chip queues, ``chips.py``, reach the same
  starts through events, and also model chips that hold work in different orders);
- **the links**: a transfer holds the ports it uses (a chip's ICI out and in, a host's DCN
  out and in, a host's PCIe) for ``bytes / bandwidth`` split over its lanes, one transfer
  after another on a shared port, first come first served; the latency overlaps (``claim``).

``docs/simulator.md`` has the picture and every parameter.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from ...runtime.trace import LinkKind
from .cluster import Cluster
from .tasks import DeviceSet

_DCN, _ICI = LinkKind.DCN.value, LinkKind.ICI.value


class Timing:
    """The clock and the turns of clients, schedulers, hosts, chips and ports of ``cluster``
    (see the module docstring). ``now`` is the virtual clock in seconds; ``heap`` the
    events, ``(time, sequence, fn, arg)``; ``step`` takes the next one and calls
    ``fn(arg)``."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.host = cluster.host
        self.now = 0.0
        self.heap: list = []
        self._seq = 0
        self._devsets: dict[tuple[int, ...], DeviceSet] = {}
        n, h = cluster.num_chips, cluster.num_hosts
        self.client_free: dict[str, float] = {}
        self.scheduler_free = [0.0] * len(cluster.islands)  # each scheduler's one thread
        self.host_free = np.zeros(h)
        self.host_client_free = np.zeros(h)  # multi-controller JAX: each host's own client
        self.chip_free = np.zeros(n)
        self.ports = {"ici_out": np.zeros(n), "ici_in": np.zeros(n), "dcn_out": np.zeros(h),
                      "dcn_in": np.zeros(h), "pcie": np.zeros(h)}

    # --- the clock -------------------------------------------------------------------------
    def at(self, t: float, fn: Callable, arg) -> None:
        """Call ``fn(arg)`` when the clock reaches ``t``."""
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, fn, arg))

    def step(self) -> None:
        """Take the next event: the clock moves to its time (never back), then it happens."""
        t, _, fn, arg = heapq.heappop(self.heap)
        if t > self.now:
            self.now = t
        fn(arg)

    @property
    def next_time(self) -> float | None:
        """When the next event happens (``None``: nothing left)."""
        return self.heap[0][0] if self.heap else None

    def devset(self, devices: tuple[int, ...]) -> DeviceSet:
        """``devices`` looked up once (their index, hosts and island)."""
        ds = self._devsets.get(devices)
        if ds is None:
            ds = self._devsets[devices] = DeviceSet.of(devices, self.cluster)
        return ds

    # --- the client ------------------------------------------------------------------------
    def program_work(self, client: str, hosts: int) -> float:
        """The client's work once per program reaching ``hosts`` hosts, from now: when it is
        done."""
        host = self.host
        t = (max(self.client_free.get(client, 0.0), self.now) + host.client_per_program
             + host.program_fanout_per_host * hosts)
        self.client_free[client] = t
        return t

    def node_work(self, client: str, hosts: int, at: float | None = None) -> float:
        """The client's work for one node touching ``hosts`` hosts, from ``at`` (default: now;
        after what it is doing already): when it is done."""
        host = self.host
        begin = self.now if at is None else at
        done = (max(self.client_free.get(client, 0.0), begin) + host.client_per_node
                + host.fanout_per_host * hosts)
        self.client_free[client] = done
        return done

    def host_dispatch(self, h: int) -> float:
        """Multi-controller JAX: host ``h``'s own client dispatches one node, from now."""
        t = max(float(self.host_client_free[h]), self.now) + self.host.client_per_node
        self.host_client_free[h] = t
        return t

    # --- the scheduler and the hosts -------------------------------------------------------
    def send_launch(self, island: int, sent: float, hosts: np.ndarray) -> float:
        """Island ``island``'s scheduler sends a launch decided at ``sent`` to ``hosts``: when
        the last of them has enqueued it on its chips."""
        host = self.host
        if host.scheduler_per_host:  # the scheduler's thread sends one launch per host
            sent = max(self.scheduler_free[island], sent)
            sent += host.scheduler_per_host * len(hosts)
            self.scheduler_free[island] = sent
        free = np.maximum(self.host_free[hosts], sent + host.rpc_latency)
        free += host.host_per_node
        self.host_free[hosts] = free
        return float(free.max())

    def host_take(self, h: int) -> float:
        """Host ``h`` takes a computation that reached it now (no scheduler): when it has
        queued it on its chips."""
        t = max(self.host_free[h], self.now) + self.host.host_per_node
        self.host_free[h] = t
        return t

    # --- the chips -------------------------------------------------------------------------
    def run_on_chips(self, chips: DeviceSet, earliest: float, seconds: float) -> float:
        """A computation of ``seconds`` on ``chips``, launched behind everything before it
        there and possible from ``earliest``: its start (its end is ``start + seconds``)."""
        start = max(earliest, float(self.chip_free[chips.idx].max()))
        self.chip_free[chips.idx] = start + seconds
        return start

    # --- the links -------------------------------------------------------------------------
    def claim(self, link: str | None, nbytes: float, dst: DeviceSet, src: DeviceSet | None,
              earliest: float) -> tuple[float, float]:
        """A copy of ``nbytes`` over ``link`` (``"ici"``, ``"dcn"``, else from the hosts'
        memory over PCIe), possible from ``earliest``: it waits until every port it uses is
        free, then holds them for its bytes' time. Returns its start and its seconds (the
        latency and the bytes' time)."""
        c = self.cluster
        if link == _ICI:
            ports = (("ici_out", src.idx), ("ici_in", dst.idx))
            lanes = max(1, min(len(src.idx), len(dst.idx)))
            ici = c.ici
            bandwidth, latency = ici.link_bandwidth, ici.latency
            if ici.chips_per_switch:  # GPU nodes: a copy between two crosses the scale-out
                switch = c.switch_of  # fabric (InfiniBand), as a collective over both does
                ends = (switch[src.idx], switch[dst.idx])
                if min(e.min() for e in ends) != max(e.max() for e in ends):
                    bandwidth = ici.scaleout_bandwidth or bandwidth
                    latency = ici.scaleout_latency or latency
            busy = nbytes / lanes / bandwidth
        elif link == _DCN:
            ports = (("dcn_out", src.hosts), ("dcn_in", dst.hosts))
            lanes = max(1, min(src.nhosts, dst.nhosts))
            busy, latency = nbytes / lanes / c.dcn.bandwidth_per_host, c.dcn.latency
        else:
            ports = (("pcie", dst.hosts),)
            busy, latency = nbytes / dst.nhosts / c.host.host_to_device, 0.0
        start = max([earliest] + [float(self.ports[p][i].max()) for p, i in ports])
        for p, i in ports:
            self.ports[p][i] = start + busy
        return start, latency + busy

"""The simulated cluster: islands of hosts of chips, their links, and the host-side costs.

A ``Cluster`` is an immutable value. Chips are numbered island by island, host by host, so chip
``c`` sits on host ``c // chips_per_host``; ``island_of`` and ``host_of`` give both for every
chip at once (NumPy arrays, so the engine can look up thousands of chips in one call).

Presets carry published figures, with their source written next to each number (see
``docs/simulator.md``). Host-side costs (RPC latency, per-node work) are not published for
Pathways: the presets' values are stated assumptions, to be fit by the ``sim-paper``
calibration on the paper's dispatch break-even points (issue 14), never silently tuned here.

>>> c = Cluster.preset("tpu-v4", chips=2048)
>>> c.num_chips, c.num_hosts, len(c.islands)
(2048, 512, 1)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import SimError

GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True)
class Chip:
    """One accelerator: dense peak FLOP/s (bf16 and f32), HBM size and bandwidth, and the
    fixed device-side cost of starting a computation (``launch_overhead``, seconds)."""

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    peak_flops_f32: float | None = None  # None: same as peak_flops (TPUs run f32 matmuls
    launch_overhead: float = 0.0         # as bf16 passes by default)

    def __post_init__(self) -> None:
        _positive(self, "peak_flops", "hbm_bytes", "hbm_bandwidth")
        _non_negative(self, "launch_overhead")
        if self.peak_flops_f32 is not None:
            _positive(self, "peak_flops_f32")


@dataclass(frozen=True)
class Interconnect:
    """The fast links inside an island (TPU ICI, GPU NVLink).

    ``torus``: the torus dimensions of the island's chips (TPU); ``()`` means a switch where
    every chip is one hop from every other (NVLink), up to ``chips_per_switch`` chips; larger
    groups cross the ``scaleout_bandwidth`` fabric (InfiniBand between GPU nodes).
    ``link_bandwidth``: bytes/s one way per torus link, or per chip into the switch.
    """

    link_bandwidth: float
    latency: float
    torus: tuple[int, ...] = ()
    chips_per_switch: int = 0
    scaleout_bandwidth: float = 0.0
    scaleout_latency: float = 0.0

    def __post_init__(self) -> None:
        _positive(self, "link_bandwidth")
        _non_negative(self, "latency", "scaleout_bandwidth", "scaleout_latency")
        torus = self.torus
        if not isinstance(torus, tuple | list) or not all(_whole(d, 1) for d in torus):
            raise SimError(f"Interconnect.torus must be a tuple of torus dimensions, each an int "
                           f">= 1 (or () for a switch), got {torus!r}.")
        object.__setattr__(self, "torus", tuple(torus))
        if not _whole(self.chips_per_switch, 0):
            raise SimError(f"Interconnect.chips_per_switch must be an int >= 0 (0: no limit), "
                           f"got {self.chips_per_switch!r}.")

    def group_links(self, n: int) -> tuple[float, float, int]:
        """(bytes/s per chip, seconds per step, ring steps) for a collective over ``n`` chips.

        Torus: the group fills the torus dimensions in order; a bidirectional ring runs in each
        dimension it spans, all at once. Switch: a ring over the switch, or over the scale-out
        fabric when the group is larger than one switch.
        """
        if n <= 1:
            return self.link_bandwidth, self.latency, 0
        if self.torus:
            spans = _spans(n, self.torus)
            return 2 * self.link_bandwidth * len(spans), self.latency, sum(s - 1 for s in spans)
        if self.chips_per_switch and n > self.chips_per_switch:
            bandwidth = self.scaleout_bandwidth or self.link_bandwidth
            return bandwidth, self.scaleout_latency or self.latency, n - 1
        return self.link_bandwidth, self.latency, n - 1

    def collective_seconds(self, kind: str, nbytes: float, n: int) -> float:
        """Seconds for one collective over ``n`` chips. ``nbytes``: the larger of its operand
        and result on one chip. Ring algorithms: an all-reduce moves 2(n-1)/n of the data
        through each chip, an all-gather, reduce-scatter or all-to-all (n-1)/n, a permute all
        of it over one link."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        if kind == "collective_permute":
            return nbytes / self.link_bandwidth + self.latency
        bandwidth, latency, steps = self.group_links(n)
        rounds = 2 if kind == "all_reduce" else 1
        return rounds * ((n - 1) / n * nbytes / bandwidth + steps * latency)


@dataclass(frozen=True)
class Network:
    """The data-center network between islands: bytes/s each host can send (and receive)."""

    bandwidth_per_host: float
    latency: float

    def __post_init__(self) -> None:
        _positive(self, "bandwidth_per_host")
        _non_negative(self, "latency")


@dataclass(frozen=True)
class HostCosts:
    """The control plane's costs, in seconds (bytes/s for ``host_to_device``).

    - ``client_per_node``: the client's host-side work for one node of a program.
    - ``fanout_per_host``: the client's extra work per host a node runs on (one message each).
    - ``rpc_latency``: one message between client, island scheduler and hosts, one way.
    - ``host_per_node``: a host executor's work to enqueue one computation on its chips.
    - ``host_to_device``: bytes/s from a host's memory to its chips (PCIe).
    - ``client_per_program``: the client's work to submit one program (once per run).
    - ``program_fanout_per_host``: the client's one message per host a program runs on (once
      per run: a program's nodes travel to each host together).
    - ``scheduler_per_host``: an island scheduler's work per host of each computation it
      launches (the launch it sends that host, the end it hears back), on its one thread.
    """

    client_per_node: float
    fanout_per_host: float
    rpc_latency: float
    host_per_node: float
    host_to_device: float
    client_per_program: float = 0.0
    program_fanout_per_host: float = 0.0
    scheduler_per_host: float = 0.0

    def __post_init__(self) -> None:
        _non_negative(self, "client_per_node", "fanout_per_host", "rpc_latency", "host_per_node",
                      "client_per_program", "program_fanout_per_host", "scheduler_per_host")
        _positive(self, "host_to_device")


@dataclass(frozen=True)
class Cluster:
    """Islands of hosts of chips. ``islands``: the number of hosts in each island.

    >>> Cluster.preset("h100", chips=16).island_devices(0)[:3]
    (0, 1, 2)
    """

    chip: Chip
    islands: tuple[int, ...]
    chips_per_host: int
    ici: Interconnect
    dcn: Network
    host: HostCosts
    name: str = "custom"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        islands = self.islands
        islands = (islands,) if isinstance(islands, int) and not isinstance(islands, bool) \
            else tuple(islands)
        if not islands or not all(_whole(h, 1) for h in islands):
            raise SimError(f"Cluster islands must be a tuple of host counts, each an int >= 1, "
                           f"got {self.islands!r}. Maybe you want islands=(4,) for one island "
                           "of 4 hosts.")
        if not _whole(self.chips_per_host, 1):
            raise SimError(f"Cluster chips_per_host must be an int >= 1, got "
                           f"{self.chips_per_host!r}.")
        object.__setattr__(self, "islands", islands)
        torus = getattr(self.ici, "torus", ())
        if torus:  # a torus is an island's chips: every island must fill it exactly
            size = math.prod(torus)
            for i, hosts in enumerate(islands):
                chips = hosts * self.chips_per_host
                if chips != size:
                    raise SimError(
                        f"Cluster ici.torus {torus} has {size} chips but island {i} has "
                        f"{chips} ({hosts} hosts x {self.chips_per_host}). Maybe you want "
                        f"torus={torus_dims(chips, len(torus))}, or torus=() for a switch.")

    # --- layout ----------------------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        return sum(self.islands)

    @property
    def num_chips(self) -> int:
        return self.num_hosts * self.chips_per_host

    @cached_property
    def host_of(self) -> np.ndarray:
        """The host of every chip (global host ids, island by island)."""
        return np.arange(self.num_chips, dtype=np.int64) // self.chips_per_host

    @cached_property
    def island_of(self) -> np.ndarray:
        """The island of every chip."""
        return np.repeat(np.arange(len(self.islands)),
                         np.array(self.islands) * self.chips_per_host)

    @cached_property
    def switch_of(self) -> np.ndarray:
        """The switch (GPU node) of every chip, counted from its island's first chip
        (``Interconnect.chips_per_switch``); one switch per island when there is no limit."""
        cps = self.ici.chips_per_switch
        island = self.island_of
        if not cps:
            return island.copy()
        first = np.concatenate(([0], np.cumsum(np.array(self.islands) * self.chips_per_host)))
        local = np.arange(self.num_chips, dtype=np.int64) - first[island]
        return island * (self.num_chips + 1) + local // cps

    def island_devices(self, island: int) -> tuple[int, ...]:
        """The chip ids of ``island``, in order."""
        if not 0 <= island < len(self.islands):
            raise SimError(f"island {island!r} does not exist; this cluster has islands "
                           f"{list(range(len(self.islands)))}.")
        first = sum(self.islands[:island]) * self.chips_per_host
        return tuple(range(first, first + self.islands[island] * self.chips_per_host))

    def with_host(self, **costs: float) -> Cluster:
        """A copy with some host-side costs changed, e.g. ``c.with_host(rpc_latency=1e-4)``."""
        known = [f.name for f in fields(HostCosts)]
        unknown = sorted(set(costs) - set(known))
        if unknown:
            raise SimError(f"with_host got {unknown}, which are not host-side costs; valid: "
                           f"{known}.")
        return replace(self, host=replace(self.host, **costs))

    # --- presets ---------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, chips: int | None = None, islands: int = 1) -> Cluster:
        """A published machine: ``chips`` in all (a whole number of hosts per island), split
        into ``islands`` equal islands joined by DCN. Names: ``PRESETS``."""
        if name == "this-machine":
            return cls.from_calibration(None)
        make = PRESETS.get(name)
        if make is None:
            raise SimError(f"unknown cluster preset {name!r}; expected one of "
                           f"{sorted([*PRESETS, 'this-machine'])}.")
        return make(chips, islands)

    @classmethod
    def from_calibration(cls, data: Mapping | str | Path | None) -> Cluster:
        """The ``this-machine`` cluster from a calibration run's measured parameters.

        ``data``: a mapping, or the path of a JSON file, with the keys in
        ``CALIBRATION_KEYS``; ``None`` reads ``$PWKERNEL_SIM_CALIBRATION`` (or
        ``~/.cache/pwkernel/sim-calibration.json``). The calibration run that writes that
        file measures the local runtime (issue 14's calibration step); it is the one place
        these numbers may come from.
        """
        if data is None:
            data = Path(os.environ.get("PWKERNEL_SIM_CALIBRATION",
                                       Path.home() / ".cache/pwkernel/sim-calibration.json"))
            if not data.exists():
                raise SimError(
                    f"the 'this-machine' preset needs a calibration file, and there is none at "
                    f"{str(data)!r}. Write it with `python -m pwkernel.bench.sim_calibrate` "
                    "(it measures the local runtime, about 25 s; --out PATH elsewhere, then "
                    "PWKERNEL_SIM_CALIBRATION=PATH); or use Cluster.from_calibration({...}) "
                    "with measured "
                    f"numbers for {sorted(CALIBRATION_KEYS)}, or a published preset such as "
                    "Cluster.preset('tpu-v4', chips=8).")
        where = ""
        if isinstance(data, str | Path):
            where = f" (from {str(data)!r})"
            data = _calibration_file(Path(data))
        missing = sorted(set(CALIBRATION_KEYS) - set(data))
        if missing:
            raise SimError(f"calibration data{where} lacks {missing}; expected keys "
                           f"{sorted(CALIBRATION_KEYS)}. Maybe you want to write it again with "
                           "`python -m pwkernel.bench.sim_calibrate`.")
        chip = Chip("this machine", data["peak_flops"], data["hbm_bytes"],
                    data["memory_bandwidth"], launch_overhead=data["launch_overhead"])
        ici = Interconnect(data["ici_bandwidth"], data["ici_latency"])
        host = HostCosts(data["client_per_node"], data.get("fanout_per_host", 0.0),
                         data["rpc_latency"], data["host_per_node"], data["host_to_device"],
                         client_per_program=data.get("client_per_program", 0.0),
                         program_fanout_per_host=data.get("program_fanout_per_host", 0.0))
        return cls(chip, tuple(data["islands"]), int(data["chips_per_host"]), ici,
                   Network(data["dcn_bandwidth"], data.get("dcn_latency", 0.0)), host,
                   name="this-machine", sources={"all": "measured by the calibration run"})


#: what a ``this-machine`` calibration file holds (seconds, bytes, bytes/s, FLOP/s)
CALIBRATION_KEYS = (
    "islands", "chips_per_host", "peak_flops", "hbm_bytes", "memory_bandwidth",
    "launch_overhead", "ici_bandwidth", "ici_latency", "dcn_bandwidth", "client_per_node",
    "rpc_latency", "host_per_node", "host_to_device",
)


def _finite(v) -> bool:
    """A real number a clock can add: not a bool, NaN or an infinity (NaN passes every
    comparison's ``not``, an infinity every ``> 0``; either poisons virtual time)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _positive(obj, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not (_finite(v) and v > 0):
            raise SimError(f"{type(obj).__name__}.{n} must be a finite number > 0, got {v!r}.")


def _non_negative(obj, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not (_finite(v) and v >= 0):
            raise SimError(f"{type(obj).__name__}.{n} must be a finite number >= 0, got {v!r}.")


def _number(value) -> float:
    return value if isinstance(value, int | float) else 0


def _spans(n: int, dims: tuple[int, ...]) -> list[int]:
    """How far a block of ``n`` chips extends along each torus dimension it uses."""
    spans, left = [], n
    for d in dims:
        if left <= 1:
            break
        spans.append(min(d, left))
        left = math.ceil(left / d)
    return spans


def _calibration_file(path: Path) -> dict:
    """The JSON object a calibration run wrote at ``path``, or a ``SimError`` naming the fix."""
    again = "Write it with `python -m pwkernel.bench.sim_calibrate --out PATH`."
    if not path.is_file():
        raise SimError(f"there is no calibration file at {str(path)!r}. {again}")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict):
        raise SimError(f"{str(path)!r} is not a calibration file (a JSON object of "
                       f"{sorted(CALIBRATION_KEYS)}). {again}")
    return data


def torus_dims(chips: int, ndim: int) -> tuple[int, ...]:
    """The most even ``ndim``-dimensional torus holding ``chips`` (largest dimensions first):
    ``torus_dims(2048, 3) == (16, 16, 8)``."""
    dims = [1] * ndim
    rest = chips
    factors = []
    p = 2
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    for f in sorted(factors, reverse=True):
        dims[dims.index(min(dims))] *= f
    return tuple(sorted(dims, reverse=True))


# --- published machines ----------------------------------------------------------------------
# Host-side costs: no published figure for Pathways; stated assumptions for the sim-paper fit.
_HOST_ASSUMED = {
    "client_per_node": "assumed 20 us (to be fit on the paper's dispatch break-even points)",
    "fanout_per_host": "assumed 5 us per host message (to be fit likewise)",
    "rpc_latency": "assumed 50 us one way, a typical in-datacenter RPC (to be fit likewise)",
    "host_per_node": "assumed 10 us per enqueue on a host (to be fit likewise)",
}


def _split(name: str, chips: int | None, islands: int, per_host: int, default: int) -> tuple:
    chips = default if chips is None else chips
    if isinstance(islands, bool) or not isinstance(islands, int) or islands < 1:
        raise SimError(f"preset {name!r} needs islands, a whole number from 1, got "
                       f"islands={islands!r}. Maybe you want islands=1 (one island of all "
                       f"the chips) or islands=2 (two joined by DCN).")
    if isinstance(chips, str) and chips.strip().isdigit():
        raise SimError(f"preset {name!r} needs chips as an int, got the string {chips!r}. "
                       f"Maybe you want chips={int(chips)}.")
    if (isinstance(chips, bool) or not isinstance(chips, int) or chips < 1
            or chips % (per_host * islands)):
        unit = per_host * islands  # (islands is a whole number from 1 here)
        raise SimError(f"preset {name!r} needs chips, a multiple of {per_host} chips per host "
                       f"times the islands, got chips={chips!r}, islands={islands!r}. Maybe "
                       f"you want chips={unit * max(1, round(_number(chips) / unit))}.")
    hosts = chips // per_host // islands
    return (hosts,) * islands, chips // islands


def _tpu(name: str, chip: Chip, link: float, ndim: int, dcn: float, pcie: float,
         sources: dict[str, str], default: int):
    def make(chips: int | None, islands: int) -> Cluster:
        hosts, per_island = _split(name, chips, islands, 4, default)
        ici = Interconnect(link, 1e-6, torus=torus_dims(per_island, ndim))
        host = HostCosts(20e-6, 5e-6, 50e-6, 10e-6, pcie)
        return Cluster(chip, hosts, 4, ici, Network(dcn, 10e-6), host, name,
                       sources | _HOST_ASSUMED)
    return make


def _gpu(name: str, chip: Chip, nvlink: float, ib: float, pcie: float,
         sources: dict[str, str]):
    def make(chips: int | None, islands: int) -> Cluster:
        hosts, _ = _split(name, chips, islands, 8, 8)
        ici = Interconnect(nvlink, 2e-6, chips_per_switch=8, scaleout_bandwidth=ib,
                           scaleout_latency=5e-6)
        host = HostCosts(20e-6, 5e-6, 50e-6, 10e-6, pcie)
        return Cluster(chip, hosts, 8, ici, Network(8 * ib, 10e-6), host, name,
                       sources | _HOST_ASSUMED)
    return make


_TPU_COMMON = {
    "chips_per_host": "4 chips per TPU host (Google Cloud TPU system architecture docs)",
    "ici.latency": "assumed 1 us per hop",
    "dcn": "about 25 GB/s per TPU host (jax-ml/scaling-book, tpus.md); latency assumed 10 us",
    "host_to_device": "assumed 16 GB/s (PCIe 3.0 x16)",
    "launch_overhead": "assumed 2 us",
}
_GPU_COMMON = {
    "chips_per_host": "8 GPUs per node (DGX/HGX)",
    "ici.latency": "assumed 2 us (NVLink), 5 us across nodes (InfiniBand)",
    "dcn": "8 InfiniBand ports per node; latency assumed 10 us",
    "launch_overhead": "assumed 5 us (kernel launch)",
}

_HOPPER = _GPU_COMMON | {
    "peak_flops": "989 TFLOP/s bf16 dense, 494 TF32 (NVIDIA H100 datasheet)",
    "hbm": "80 GB at 3.35 TB/s (NVIDIA H100 datasheet)",
    "ici": "NVLink 900 GB/s bidirectional: 450 GB/s one way per GPU",
    "scaleout": "8 x 400 Gb/s InfiniBand per node: 50 GB/s per GPU",
    "host_to_device": "PCIe 5.0 x16, ~64 GB/s",
}

PRESETS = {
    "tpu-v3": _tpu("tpu-v3", Chip("TPU v3", 123 * TFLOPS, 32 * 2**30, 900 * GB,
                                  launch_overhead=2e-6),
                   100 * GB, 2, 25 * GB, 16 * GB, _TPU_COMMON | {
                       "peak_flops": "123 TFLOP/s bf16 per chip (Google Cloud TPU docs)",
                       "hbm": "32 GiB, ~900 GB/s (Google Cloud TPU docs)",
                       "ici": "~100 GB/s one way per link, 2-D torus, 1024 chips per pod"}, 1024),
    "tpu-v4": _tpu("tpu-v4", Chip("TPU v4", 275 * TFLOPS, 32 * 2**30, 1200 * GB,
                                  launch_overhead=2e-6),
                   45 * GB, 3, 25 * GB, 16 * GB, _TPU_COMMON | {
                       "peak_flops": "275 TFLOP/s bf16 per chip (Google Cloud TPU docs)",
                       "hbm": "32 GiB, 1.2 TB/s (Google Cloud TPU docs)",
                       "ici": "~45 GB/s one way per link, 3-D torus, 4096 chips per pod "
                              "(jax-ml/scaling-book)"}, 2048),
    "a100": _gpu("a100", Chip("A100 SXM 80GB", 312 * TFLOPS, 80 * GB, 2039 * GB,
                              peak_flops_f32=156 * TFLOPS, launch_overhead=5e-6),
                 300 * GB, 25 * GB, 32 * GB, _GPU_COMMON | {
                     "peak_flops": "312 TFLOP/s bf16 dense, 156 TF32 (NVIDIA A100 datasheet)",
                     "hbm": "80 GB at 2.04 TB/s (NVIDIA A100 datasheet)",
                     "ici": "NVLink 600 GB/s bidirectional: 300 GB/s one way per GPU",
                     "scaleout": "8 x 200 Gb/s HDR InfiniBand per DGX A100: 25 GB/s per GPU",
                     "host_to_device": "PCIe 4.0 x16, ~32 GB/s"}),
    "h100": _gpu("h100", Chip("H100 SXM", 989 * TFLOPS, 80 * GB, 3350 * GB,
                              peak_flops_f32=494 * TFLOPS, launch_overhead=5e-6),
                 450 * GB, 50 * GB, 64 * GB, _HOPPER),
    "h200": _gpu("h200", Chip("H200", 989 * TFLOPS, 141 * GB, 4800 * GB,
                              peak_flops_f32=494 * TFLOPS, launch_overhead=5e-6),
                 450 * GB, 50 * GB, 64 * GB, _HOPPER | {
                     "peak_flops": "989 TFLOP/s bf16 dense, 494 TF32 (NVIDIA H200 datasheet)",
                     "hbm": "141 GB at 4.8 TB/s (NVIDIA H200 datasheet)"}),
}

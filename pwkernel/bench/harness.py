"""The benchmark harness: interleaved measurement, medians, machine facts and JSON results.

Every comparison runs its variants in the same process, one round after another
(A B A B ..., with the order reversed every other round so neither side always runs first on a
warm cache). Each call of a variant returns one sample, a rate where higher is better. The
summary is the median with min and max; a ratio is the median of the per-round ratios A_i/B_i,
which compares samples taken seconds apart and so cancels most of the noise of a shared machine.

>>> from pwkernel.bench.harness import interleave, paired_ratio, summarize
>>> samples = interleave({"a": lambda: 2.0, "b": lambda: 1.0}, rounds=3)
>>> summarize(samples["a"])["median"], paired_ratio(samples, "a", "b")
(2.0, 2.0)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("tiny", "quick", "full")

#: the keys of the ``ratios`` object, with the target each is compared with on a 2-core CPU
TARGETS: dict[str, float] = {
    "opbyop_vs_jax": 0.8,
    "chained_vs_jax_opbyop": 1.0,
    "fused_vs_jax_fused": 0.98,
    "parallel_vs_sequential": 1.5,
    "parallel_vs_sequential_ray": 2.0,  # the same chain with islands as Ray actors
    "pipeline_vs_spmd": 0.95,
    "multitenant_vs_single": 1.0,
    "share_error": 5.0,           # percentage points, lower is better
    "two_islands_vs_one": 0.9,
    "tracing_overhead": 3.0,      # percent, lower is better
    "tracing_and_view_cpu": 3.0,  # percent of a core tracing + an open live view take
    "cpu_us_per_node_opbyop": 25.0,   # process CPU us per computation (issue 13)
    "cpu_us_per_node_chained": 15.0,
    "breakeven_us": 100.0,        # us of a computation's own run time to reach 95% of JAX
    "chained_vs_jax_at_1ms": 0.98,     # dispatch steps sweep: a ~1 ms real step (issue 25)
    "opbyop_vs_jax_at_1ms": 0.95,
    "host_cpu_growth": 2.0,            # host CPU per computation above JAX's, 10 ms over 1 ms
    "cpu_chained_vs_jax_call": 3.0,    # cpu_us_per_node_chained over bare JAX's CPU per call
    "cpu_opbyop_vs_jax_call": 5.0,
    "sim_breakeven_error_pct": 15.0,   # sim-paper: the fitted break-even points, |error| %
    "sim_prediction_error_pct": 10.0,  # sim-paper: the worst predicted ratio, |error| %
    "sim_share_error": 5.0,            # sim-paper: 1:2:4:8 shares, percentage points
    "train_spmd_vs_jax": 0.98,         # train: pw.train.SPMD vs plain jax.jit, steps >= 3 ms
    "train_spmd_packed_vs_jax": 0.98,  # train: the same with packed=True (reported)
    "train_pipeline_vs_spmd": 0.95,    # train: reported (shared CPU cores cannot show it)
    "train_two_islands_vs_one": 0.9,   # train: reported (the paper: ~0.97 over DCN)
    "train_1f1b_vs_gpipe_peak_memory": 0.75,  # train: peak activation memory, lower is better
    "pool_aggregate_vs_alone_1": 0.8,  # pool: one tenant vs a dedicated client (docs/pool.md)
    "pool_aggregate_vs_alone_2": 1.0,  # pool: k tenants' aggregate (the paper: at least 1)
    "pool_aggregate_vs_alone_4": 1.0,
    "pool_share_error": 5.0,           # pool: 1:2:4:8 across processes, percentage points
    "pool_reclaim_s": 10.0,            # pool: a killed tenant's memory freed (its lease + ...)
}
LOWER_IS_BETTER = ("share_error", "tracing_overhead", "tracing_and_view_cpu",
                   "cpu_us_per_node_opbyop", "cpu_us_per_node_chained", "breakeven_us",
                   "host_cpu_growth", "cpu_chained_vs_jax_call", "cpu_opbyop_vs_jax_call",
                   "sim_breakeven_error_pct", "sim_prediction_error_pct", "sim_share_error",
                   "train_1f1b_vs_gpipe_peak_memory", "pool_share_error", "pool_reclaim_s")


def islands() -> tuple[int, ...]:
    """The islands the benchmarks build their controllers with: ``PWKERNEL_BENCH_ISLANDS``
    ("1" on a machine with one GPU; ``--islands`` on the command line), else (4, 4)."""
    from ..runtime.resources import DEFAULT_ISLANDS, islands_from_env

    return islands_from_env("PWKERNEL_BENCH_ISLANDS") or DEFAULT_ISLANDS


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}; 'tiny' is for tests, "
                         "'quick' for a one-minute run, 'full' for the figures.")
    return mode


def interleave(variants: dict[str, Callable[[], float]], rounds: int,
               warmup: int = 1) -> dict[str, list[float]]:
    """Call every variant once per round, alternating the order; returns samples by name.

    ``warmup`` rounds run first and are dropped (compilation, caches, thread start-up).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}.")
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            value = float(variants[name]())
            if r >= warmup:
                samples[name].append(value)
    return samples


def summarize(values: list[float]) -> dict[str, float]:
    """Median, min, max and count of a list of samples."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s sample divided by ``b``'s sample of the same round."""
    pairs = [x / y for x, y in zip(samples[a], samples[b], strict=True) if y > 0]
    return statistics.median(pairs) if pairs else float("nan")


def rate(fn: Callable[[], Any], units: float) -> float:
    """Run ``fn`` once and return ``units`` per second of wall time."""
    t0 = time.perf_counter()
    fn()
    return units / (time.perf_counter() - t0)


@dataclass
class Result:
    """What one benchmark returns: its rows, its headline ratios and notes for the reader."""

    name: str
    mode: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    ratios: dict[str, float | None]
    notes: list[str]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def with_extra(self, **items: Any) -> Result:
        """Attach more named results (kept beside the rows in the JSON)."""
        self.extra.update(items)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "config": self.config, "rows": self.rows,
                "ratios": self.ratios, "targets": {k: TARGETS[k] for k in self.ratios},
                "notes": self.notes, "seconds": round(self.seconds, 2), **self.extra}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """The machine the numbers came from: CPU, cores, devices, load and library versions."""
    import jax

    devices = jax.devices()
    kinds = sorted({f"{d.platform}:{d.device_kind}" for d in devices})
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "usable_cores": usable,
        "platform": platform.platform(), "python": sys.version.split()[0],
        "devices": len(devices), "device_kinds": kinds, "loadavg_at_start": load,
        "versions": {p: _version(p) for p in ("pwkernel", "jax", "jaxlib", "numpy", "bokeh",
                                              "jax-cuda12-plugin")},
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def verdict(key: str, value: float | None) -> str:
    """'meets', 'misses' or 'n/a' for a headline ratio against its target."""
    if value is None or value != value:  # None or NaN
        return "n/a"
    target = TARGETS[key]
    ok = value <= target if key in LOWER_IS_BETTER else value >= target
    return "meets" if ok else "misses"


def _strict(value: Any) -> Any:
    """``value`` with every NaN or infinity made None: JSON has no such numbers (Python's
    ``json`` writes ``NaN``, which ``jq``, JavaScript and most other readers refuse)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as standard JSON: a number that is not finite (a ratio with no
    samples) is written as null, as a missing ratio is."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_strict(payload), indent=2, default=str, allow_nan=False))
    return path

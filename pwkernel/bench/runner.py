"""Runs benchmarks by name and gathers their results, the machine and a summary table.

>>> from pwkernel.bench.runner import run_benchmarks
>>> payload = run_benchmarks(["tracing"], mode="tiny")     # doctest: +SKIP
>>> sorted(payload)                                         # doctest: +SKIP
['benchmarks', 'failed', 'machine', 'mode', 'ratios', 'verdicts']
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .harness import LOWER_IS_BETTER, TARGETS, Result, check_mode, machine_info, verdict

#: benchmark name -> module (each has ``run(mode) -> Result``)
BENCHMARKS = {
    "dispatch": "dispatch",
    "parallel-dispatch": "parallel_dispatch",
    "pipeline": "pipeline",
    "multitenancy": "multitenancy",
    "dcn": "dcn",
    "tracing": "tracing",
    "sim-paper": "sim_paper",  # the paper's results on the simulator (no devices used)
    "train": "train",  # training through pw.train: SPMD vs jax.jit, pipelines, 1F1B memory
    "pool": "pool",  # a device pool shared by processes (docs/pool.md)
}
#: benchmarks ``all`` leaves out (name them to run them): pool starts a Ray cluster of its own
#: and five processes, minutes on two cores
NOT_IN_ALL = ("pool",)


def resolve(names: Sequence[str]) -> list[str]:
    """Expand ``all`` and check every name."""
    out: list[str] = []
    for name in names:
        if name == "all":
            out.extend(n for n in BENCHMARKS if n not in out and n not in NOT_IN_ALL)
        elif name in BENCHMARKS:
            if name not in out:
                out.append(name)
        else:
            raise ValueError(f"unknown benchmark {name!r}; expected one of "
                             f"{sorted(BENCHMARKS)} or 'all'.")
    return out


def run_one(name: str, mode: str) -> Result:
    module = importlib.import_module(f"{__package__}.{BENCHMARKS[name]}")
    return module.run(mode)


def run_benchmarks(names: Sequence[str], mode: str = "quick",
                   progress: Callable[[str], None] = lambda s: None,
                   payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``names`` one after another; returns the JSON payload (machine, results, ratios).

    A benchmark that raises does not stop the others: its entry in ``benchmarks`` is
    ``{"name", "mode", "error", "traceback"}``, its name is listed in ``failed`` and the rest
    run. ``payload``, when given, is filled in place as each benchmark ends, so a caller that
    is interrupted (Ctrl-C, SIGTERM) still holds what finished."""
    check_mode(mode)
    todo = resolve(names)
    payload = {} if payload is None else payload
    payload.update({"mode": mode, "machine": machine_info(), "benchmarks": {}, "ratios": {},
                    "verdicts": {}, "failed": []})
    for name in todo:
        payload["running"] = name  # (what an interrupted caller was in the middle of)
        progress(f"running {name} ({mode}) ...")
        try:
            result = run_one(name, mode)
        except Exception as e:  # noqa: BLE001 - reported in the payload; the rest still run
            payload["benchmarks"][name] = {"name": name, "mode": mode,
                                           "error": f"{type(e).__name__}: {e}",
                                           "traceback": traceback.format_exc()}
            payload["failed"].append(name)
            progress(f"{name}: FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            continue
        payload["benchmarks"][name] = result.to_dict()
        payload["ratios"].update(result.ratios)
        payload["verdicts"].update({k: verdict(k, v) for k, v in result.ratios.items()})
        progress(summary_lines(result))
    payload.pop("running", None)
    return payload


def summary_lines(result: Result) -> str:
    lines = [f"{result.name}: {result.seconds:.1f} s"]
    if "table" in result.extra:
        lines += [result.extra["table"], *result.notes]
    for key, value in result.ratios.items():
        shown = "n/a" if value is None else f"{value:.3f}"
        lines.append(f"  {key:<24} {shown:>8}   target {_target(key)}   "
                     f"{verdict(key, value)}")
    return "\n".join(lines)


def _target(key: str) -> str:
    op = "<=" if key in LOWER_IS_BETTER else ">="
    return f"{op} {TARGETS[key]:g}"

"""The cost of the event log, and of a live schedule view reading it at 10 Hz.

The workload is the dispatch benchmark's most overhead-bound case: chains of tiny computations
on a 2-device slice, traced into one program (each computation records one event). Rounds
alternate ``ctl.trace.enabled = False`` and ``True``; the overhead is ``1 - on/off`` in percent.

A third variant keeps a live ``pw.ScheduleView`` open on the controller, updated by its own
background thread (every 100 ms, or less often when updates would take more than the view's
time budget), as in a notebook; each of its rounds ends with one more update inside the timed
region, so drawing every event of the round is charged to it.

By default the benchmark runs inside a fresh Jupyter kernel (``where="kernel"``), so the
view's widgets send their updates over a real comm, as in a notebook, and what the kernel
spends sending them is measured; ``where="process"`` runs it here, where widgets send
nowhere (cheaper, and not what a notebook pays).

>>> from pwkernel.bench import tracing
>>> tracing.run("tiny").ratios                  # doctest: +SKIP
{'tracing_overhead': 1.2}
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from .harness import Result, check_mode, interleave, paired_ratio, rate, summarize

CONFIGS = {
    "tiny": {"chain": 16, "programs": 2, "repeat": 1, "size": 1024, "rounds": 2},
    "quick": {"chain": 64, "programs": 8, "repeat": 10, "size": 1024, "rounds": 11},
    "full": {"chain": 128, "programs": 16, "repeat": 5, "size": 1024, "rounds": 21},
}


def tiny(x):
    return x * 0.999 + 0.001


class LiveView:
    """A live ``pw.ScheduleView`` on ``ctl``: its own background updater (10 Hz, within its
    time budget), as in a notebook, paused outside the rounds that measure it."""

    def __init__(self, ctl: pw.Controller):
        from pwkernel.viz import ScheduleView  # raises ImportError/AttributeError if absent

        self.view = ScheduleView(ctl)
        self.updater = self.view.updater
        self.updater.pause()
        self.update = self.view.update

    @property
    def updates(self) -> int:
        return self.updater.ticks

    def active(self, on: bool) -> None:
        (self.updater.resume if on else self.updater.pause)()

    def close(self) -> None:
        self.view.close()


def _record_cost(ctl: pw.Controller, program, x, n: int = 20_000) -> float:
    """Seconds the runtime spends recording one computation: the call a task's end makes
    (``Trace.record_span`` with the parts its plan and run made once), on a task of
    ``program``, timed ``n`` times."""
    ctl.trace.enabled = True
    out = program(x)
    out.result()
    task = out.producer
    what, where, tail = task.node.trace
    fields, record = task.run.trace_fields, ctl.trace.record_span
    t = time.perf_counter()
    for _ in range(n):
        record(what, fields, where, tail, 0.0, 0.0, 0.0, "ok")
    seconds = (time.perf_counter() - t) / n
    ctl.trace.clear()
    return seconds


def _open_view(ctl: pw.Controller) -> tuple[LiveView | None, str]:
    try:
        return LiveView(ctl), "ok"
    except (ImportError, AttributeError, TypeError) as e:
        return None, f"not available: {type(e).__name__}: {e}"


def _start_kernel():
    """A plain ipykernel on this very Python: from a kernelspec of its own, not whatever a
    "python3" kernelspec on this machine names."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "pwkernel-bench"
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "pwkernel benchmark", "language": "python"}))
        km = KernelManager(kernel_name="pwkernel-bench",
                           kernel_spec_manager=KernelSpecManager(kernel_dirs=[tmp]))
        km.start_kernel()  # reads the spec now; the directory may go after
    return km


def _in_kernel(mode: str, timeout: float = 1800.0) -> Result:
    """``run(mode, where="process")`` inside a fresh Jupyter kernel (ipykernel on this Python,
    with as many CPU devices as this process has); its Result comes back as JSON."""
    code = (f"import jax, json\njax.config.update('jax_num_cpu_devices', "
            f"{len(jax.devices('cpu'))})\nfrom pwkernel.bench import tracing\n"
            f"print(json.dumps(tracing.run({mode!r}, where='process').to_dict()))")
    printed: list[str] = []
    failure: list[str] = []

    def collect(msg) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content.get("name") == "stdout":
            printed.append(content["text"])
        elif kind == "error":
            failure.append("\n".join(content["traceback"]))

    km = _start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(code, timeout=timeout, output_hook=collect)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    if reply["content"]["status"] != "ok" or failure:
        raise RuntimeError("the tracing benchmark failed in its Jupyter kernel:\n"
                           + "\n".join(failure))
    d = json.loads("".join(printed).strip().splitlines()[-1])
    config = d["config"] | {"where": "kernel"}
    return Result(d["name"], d["mode"], config, d["rows"], d["ratios"], d["notes"],
                  d["seconds"])


def run(mode: str = "quick", where: str = "kernel") -> Result:
    """Computations per second with tracing off, on, and on with a live view open.

    ``where``: "kernel" (in a fresh Jupyter kernel, as in a notebook) or "process" (here).
    """
    if where not in ("kernel", "process"):
        raise ValueError(f"where must be 'kernel' or 'process', got {where!r}.")
    if where == "kernel":
        return _in_kernel(mode)
    cfg = CONFIGS[check_mode(mode)] | {"where": "process"}
    t0 = time.perf_counter()
    ctl = pw.Controller(islands=(4, 4))
    view: LiveView | None = None
    try:
        vs = ctl.slice(2, island=0)
        fn = pw.function(tiny, slice=vs, in_specs=P("x"), out_specs=P("x"), name="tiny")
        x0 = jax.device_put(np.ones(cfg["size"], np.float32), NamedSharding(vs.mesh, P("x")))

        @pw.program(name="chain")
        def chain(x):
            for _ in range(cfg["chain"]):
                x = fn(x)
            return x

        def workload():
            for _ in range(cfg["repeat"]):  # rounds of ~0.5 s: several live updates each
                outs = [chain(x0) for _ in range(cfg["programs"])]
                for out in outs:
                    jnp.asarray(out.result()).block_until_ready()

        spent = {"view_cpu": 0.0, "live_wall": 0.0}

        def with_trace(enabled: bool, live: bool = False):
            def timed():
                t = time.perf_counter()
                workload()
                if live:  # what the view has not drawn yet is drawn inside the timed round
                    cpu = time.thread_time()
                    view.update()
                    spent["view_cpu"] += time.thread_time() - cpu
                    spent["live_wall"] += time.perf_counter() - t

            def once():
                ctl.trace.enabled = enabled
                if view is not None:  # the view updates only in its own rounds
                    view.active(live)
                value = rate(timed, cfg["chain"] * cfg["programs"] * cfg["repeat"])
                ctl.trace.clear()  # keep the log from growing across rounds
                return value
            return once

        view = None
        samples = interleave({"trace_off": with_trace(False), "trace_on": with_trace(True)},
                             rounds=cfg["rounds"])
        rows = [{"variant": k, "computations_per_s": summarize(v)} for k, v in samples.items()]
        overhead = 100.0 * (1.0 - paired_ratio(samples, "trace_on", "trace_off"))
        record_s = _record_cost(ctl, chain, x0)
        tracing_cpu = 100.0 * record_s * rows[1]["computations_per_s"]["median"]
        rows[1].update(record_us=record_s * 1e6, tracing_cpu_pct=tracing_cpu)
        view, status = _open_view(ctl)
        view_row: dict = {"variant": "trace_on+live_view", "status": status}
        if view is not None:
            live = interleave({"trace_off": with_trace(False),
                               "live_view": with_trace(True, live=True)}, rounds=cfg["rounds"])
            view_cpu = spent["view_cpu"] + view.updater.cpu_seconds
            view_row.update(computations_per_s=summarize(live["live_view"]),
                            overhead_pct=100.0 * (1.0 - paired_ratio(live, "live_view",
                                                                     "trace_off")),
                            view_cpu_pct=100.0 * view_cpu / spent["live_wall"],
                            updates=view.updates)
        rows.append(view_row)
    finally:
        if view is not None:
            view.close()
        ctl.close()
    notes = ["tracing_overhead: 100 * (1 - rate with tracing / rate without), percent, from "
             "paired rounds; negative means within noise.",
             "config.where: 'kernel' ran in a fresh Jupyter kernel, so the view's widgets sent "
             "their updates over a real comm, as in a notebook; 'process' ran where widgets "
             "send nowhere.",
             "the live-view row keeps a live pw.ScheduleView open (its own updater: 10 Hz, "
             "slower when updates would exceed its time budget) while tracing is on, and each "
             "of its rounds ends with one more update inside the timed region, so drawing "
             "every event of the round is charged to it.",
             "view_cpu_pct: CPU time the view's updates took (its thread, and the catch-up "
             "updates) per wall second of its rounds: its own cost, without the run-to-run "
             "noise of the paired rates (GC pauses, other tenants of the machine).",
             "tracing_cpu_pct: the dispatcher's record call per computation (timed on a real "
             "task) times the traced rate; tracing_and_view_cpu adds the two: what tracing "
             "and an open live view take from the programs' interpreter."]
    view_cpu = view_row.get("view_cpu_pct")
    ratios = {"tracing_overhead": overhead,
              "tracing_and_view_cpu": None if view_cpu is None else tracing_cpu + view_cpu}
    return Result("tracing", mode, dict(cfg), rows, ratios, notes,
                  time.perf_counter() - t0)

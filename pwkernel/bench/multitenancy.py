"""Multi-tenancy: clients time-sharing one island, and proportional share by weight.

1. **Aggregate throughput.** k clients (threads, each inside ``ctl.client(name)``) each submit
   programs of a few small computations on a slice of the same four devices, keeping a window of
   programs in flight. Computations per second with k = 1, 2, 4 clients, interleaved.
2. **Shares.** Under ``ctl.policy = "share"`` four clients with weights 1:2:4:8 each queue a
   backlog of identical computations at once. Device-seconds per client come from
   ``ctl.trace.events()``, counted while every client still had work queued (until the first
   client's last computation ends); the share error is the largest gap, in percentage points,
   between a client's share and its weight's share.

>>> from pwkernel.bench import multitenancy
>>> sorted(multitenancy.run("tiny").ratios)     # doctest: +SKIP
['multitenant_vs_single', 'share_error']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

from ..runtime.trace import Event
from .harness import Result, check_mode, interleave, islands, paired_ratio, rate, summarize

CONFIGS = {
    "tiny": {"clients": (1, 2), "size": 4096, "steps": 2, "programs": 4, "window": 2,
             "rounds": 1, "weights": (1, 2, 4, 8), "backlog": 8, "share_size": 65536},
    "quick": {"clients": (1, 2, 4), "size": 65536, "steps": 4, "programs": 24, "window": 4,
              "rounds": 5, "weights": (1, 2, 4, 8), "backlog": 60, "share_size": 262144},
    "full": {"clients": (1, 2, 4), "size": 65536, "steps": 4, "programs": 64, "window": 4,
             "rounds": 9, "weights": (1, 2, 4, 8), "backlog": 150, "share_size": 262144},
}
TIMEOUT = 120.0


def work(x):
    return jnp.tanh(x @ x.T @ x) * 0.1 + x * 0.9


def matrix(size: int) -> np.ndarray:
    side = int(np.sqrt(size))
    return np.linspace(-1, 1, side * side, dtype=np.float32).reshape(side, side)


def _client_loop(ctl, prog, x0, name: str, weight: float, programs: int, window: int,
                 errors: list) -> None:
    try:
        with ctl.client(name, weight=weight):
            inflight = []
            for _ in range(programs):
                inflight.append(prog(x0))
                if len(inflight) >= window:
                    inflight.pop(0).result(TIMEOUT)
            for fut in inflight:
                fut.result(TIMEOUT)
    except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
        errors.append(e)


def _run_clients(ctl, prog, x0, count: int, total: int, window: int) -> None:
    errors: list = []
    per = total // count  # the same total work whatever the number of clients
    threads = [threading.Thread(target=_client_loop, args=(ctl, prog, x0, f"c{i}", 1.0, per,
                                                           window, errors))
               for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    if errors:
        raise errors[0]


def throughput(ctl: pw.Controller, cfg: dict) -> tuple[list[dict], float]:
    return _on_quad(ctl, _throughput, cfg)


def _on_quad(ctl: pw.Controller, measure, cfg: dict):
    """``measure(ctl, vs, cfg)`` on a slice of island 0's first four devices (or all it has),
    given back after: the caller's controller (a notebook's, rerun) keeps no slice of it."""
    vs = ctl.slice(min(4, len(ctl.islands[0].devices)), island=0)
    try:
        return measure(ctl, vs, cfg)
    finally:
        vs.release()


def _throughput(ctl: pw.Controller, vs, cfg: dict) -> tuple[list[dict], float]:
    fn = pw.function(work, slice=vs, in_specs=P(), out_specs=P(), name="work")
    x0 = jax.device_put(matrix(cfg["size"]), NamedSharding(vs.mesh, P()))

    @pw.program(name="tenant")
    def prog(x):
        for _ in range(cfg["steps"]):
            x = fn(x)
        return x

    total = cfg["programs"] * max(cfg["clients"])
    variants = {f"{k}": (lambda k=k: rate(lambda: _run_clients(ctl, prog, x0, k, total,
                                                               cfg["window"]),
                                          total * cfg["steps"]))
                for k in cfg["clients"]}
    samples = interleave(variants, rounds=cfg["rounds"])
    rows = [{"clients": int(k), "computations_per_s": summarize(v),
             "vs_single": paired_ratio(samples, k, "1")} for k, v in samples.items()]
    return rows, paired_ratio(samples, str(max(cfg["clients"])), "1")


def _shares(ctl: pw.Controller, cfg: dict) -> dict:
    ctl.policy = "share"
    return _on_quad(ctl, _measure_shares, cfg)


def _measure_shares(ctl: pw.Controller, vs, cfg: dict) -> dict:
    fn = pw.function(work, slice=vs, in_specs=P(), out_specs=P(), name="share")
    x0 = jax.device_put(matrix(cfg["share_size"]), NamedSharding(vs.mesh, P()))
    fn(x0).result(TIMEOUT)  # compile outside the measurement
    weights = cfg["weights"]
    names = [f"w{w}" for w in weights]
    start = ctl.trace.next_index
    gate = threading.Barrier(len(weights))
    outs: dict[str, list] = {}
    failed: dict[str, BaseException] = {}

    def submit(name: str, weight: float) -> None:
        try:
            with ctl.client(name, weight=weight):
                gate.wait(TIMEOUT)  # all clients queue their backlog at about the same moment
                outs[name] = [fn(x0) for _ in range(cfg["backlog"])]
        except BaseException as e:  # noqa: BLE001 - raised below, in the measuring thread
            failed[name] = e
            gate.abort()  # (the others stop waiting for this one)

    threads = [threading.Thread(target=submit, args=(n, w)) for n, w in zip(names, weights,
                                                                             strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    stuck = [n for n, t in zip(names, threads, strict=True) if t.is_alive()]
    raised = {n: e for n, e in failed.items()
              if not isinstance(e, threading.BrokenBarrierError)}  # (not: stopped by abort)
    if raised or stuck:
        raise RuntimeError(
            f"the share measurement's clients did not all submit their backlog: failed "
            f"{sorted(raised)}, still submitting after {TIMEOUT} s {stuck}. The first "
            f"error is the cause of this one.") from next(iter(raised.values()), None)
    for futs in outs.values():
        for f in futs:
            f.result(TIMEOUT)
    busy, t_begin, t_end = backlogged_device_time(ctl.trace.events(since=start), names)
    total = sum(busy.values())
    wsum = sum(weights)
    shares = {n: {"weight": w, "target_pct": 100 * w / wsum,
                  "achieved_pct": 100 * busy[n] / total if total else float("nan"),
                  "device_s": busy[n]}
              for n, w in zip(names, weights, strict=True)}
    error = max(abs(s["achieved_pct"] - s["target_pct"]) for s in shares.values())
    return {"policy": "share", "window_s": t_end - t_begin, "clients": shares,
            "share_error_points": error}


def backlogged_device_time(events: Iterable[Event], clients: Sequence[str],
                           ) -> tuple[dict[str, float], float, float]:
    """Device-seconds of computation per client while every client still had work queued:
    from the first start to the moment the first client ran dry, which is when proportional
    share applies. Returns (device-seconds per client, window start, window end)."""
    events = [e for e in events if e.kind == "compute" and e.client in clients]
    t_begin = min(e.t_start for e in events)
    t_end = min(max(e.t_end for e in events if e.client == n) for n in clients)
    busy = dict.fromkeys(clients, 0.0)
    for e in events:
        overlap = min(e.t_end, t_end) - max(e.t_start, t_begin)
        if overlap > 0:
            busy[e.client] += overlap * len(e.devices)
    return busy, t_begin, t_end


def run(mode: str = "quick") -> Result:
    """Aggregate throughput for 1, 2, 4 clients, then shares achieved at weights 1:2:4:8."""
    cfg = CONFIGS[check_mode(mode)]
    t0 = time.perf_counter()
    ctl = pw.Controller(islands=islands())
    try:
        rows, multi = throughput(ctl, cfg)
        shares = _shares(ctl, cfg)
    finally:
        ctl.close()
    notes = ["computations_per_s: the same total work split over k clients (median, min, max).",
             "shares: device-seconds per client from ctl.trace.events() while all clients were "
             "backlogged; share_error: the largest |achieved - target| in percentage points."]
    return Result("multitenancy", mode, dict(cfg), rows,
                  {"multitenant_vs_single": multi,
                   "share_error": shares["share_error_points"]}, notes,
                  time.perf_counter() - t0).with_extra(shares=shares)

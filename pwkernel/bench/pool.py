"""A device pool shared by several processes (``python -m pwkernel.pool``, docs/pool.md).

One pool (its own Ray cluster on 127.0.0.1, islands ``islands``) and, attached to it, four
tenant processes with weights 1:2:4:8 (``bench/pool_tenant.py``), plus one *dedicated*
process: a controller with islands of its own of the same sizes on the same cluster, the
client the paper compares a shared system with.

1. **Aggregate throughput.** The same total of dependent steps (a product and a ``psum`` on
   island 0's devices), run by the dedicated process alone, or split over k = 1, 2, 4 pool
   tenants running at once; steps per second from the driver's wall time, the variants in
   interleaved rounds (``harness.interleave``). ``pool_aggregate_vs_alone_<k>`` is the paired
   ratio of k tenants' aggregate to the dedicated client's (the paper: at least 1 with four).
2. **Shares.** The four tenants keep their chains queued for ``busy_s`` seconds at once under
   the island's ``share`` policy. Device time per tenant comes from the island's own launch
   log (``launches()``), counted while every tenant was busy; ``pool_share_error`` is the
   largest gap between a tenant's share and its weight's share, in percentage points.
3. **Reclaim.** A tenant makes a value on each island, then is killed (SIGKILL: nothing
   unregisters it); ``pool_reclaim_s`` is the time from the kill until the pool has dropped
   it (its ``lease`` ran out) and the islands hold none of its bytes any more, read from
   their ``pool_status()``.

>>> from pwkernel.bench import pool
>>> sorted(pool.run("tiny").ratios)     # doctest: +SKIP
['pool_aggregate_vs_alone_1', 'pool_aggregate_vs_alone_2', 'pool_aggregate_vs_alone_4',
 'pool_reclaim_s', 'pool_share_error']
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .harness import Result, check_mode, interleave, paired_ratio, summarize

#: tiny's steps are large (960 x 960 blocks, tens of ms of device time): a tenant's chain is
#: one runnable step at a time, sent on when its controller sees the last one end, so shares
#: follow the weights only where device time outweighs that round trip, which two busy cores
#: stretch (at 160, two CPU-bound processes beside the run left every weight near 25 %)
CONFIGS = {
    "tiny": {"islands": (2,), "devices": 2, "size": 960, "counts": (1, 2, 4), "steps": 48,
             "rounds": 1, "weights": (1, 2, 4, 8), "busy_s": 3.0, "lease": 3.0, "ahead": 8},
    "quick": {"islands": (4,), "devices": 4, "size": 160, "counts": (1, 2, 4), "steps": 400,
              "rounds": 3, "weights": (1, 2, 4, 8), "busy_s": 6.0, "lease": 3.0, "ahead": 8},
    "full": {"islands": (4,), "devices": 4, "size": 160, "counts": (1, 2, 4), "steps": 800,
             "rounds": 7, "weights": (1, 2, 4, 8), "busy_s": 12.0, "lease": 5.0, "ahead": 8},
}
TIMEOUT = 180.0  # s for a process to answer (start-up on two busy cores included)
RAY_SLOW_START = "timed out during startup"  # Ray's words when its raylet took over 30 s


class Process:
    """A process that reads one command per line and answers each with one JSON line (a
    ``pool_tenant`` here; tutorial 10's students too)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None):
        self.name = name
        self.log = tempfile.TemporaryFile("w+")  # a pipe nobody reads could fill and block it
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)

    @classmethod
    def tenant(cls, name: str, args: list[str], env: dict[str, str]) -> Process:
        """``python -m pwkernel.bench.pool_tenant --name NAME ARGS``."""
        return cls(name, [sys.executable, "-m", "pwkernel.bench.pool_tenant", "--name", name,
                          *args], env)

    def ask(self, command: str, timeout: float = TIMEOUT) -> dict:
        """Send ``command``, return its answer."""
        self.send(command)
        return self.answer(timeout)

    def errors(self) -> str:
        self.log.seek(0)
        return self.log.read()[-2000:]

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = TIMEOUT) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(60)
            raise RuntimeError(f"pool benchmark process {self.name} ended, or said nothing "
                               f"for {timeout:g} s (exit {self.proc.returncode}): "
                               f"{self.errors()}")
        got = json.loads(line)
        if "error" in got:
            raise RuntimeError(f"{self.name}: {got['error']}")
        return got

    def kill(self) -> float:
        """SIGKILL (as a crashed kernel): returns when it was sent (``time.monotonic``)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        return time.monotonic()

    def quit(self) -> None:
        """Ask it to quit (its controller closes), if it runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send("quit")

    def end(self) -> None:
        """Quit, or be killed if it does not within a minute; its pipes are closed."""
        self.quit()
        if self.proc.poll() is None:
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(60)
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            with contextlib.suppress(OSError, ValueError):
                stream.close()


def child_env() -> dict[str, str]:
    """The processes import the pwkernel this process imported."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=here + (os.pathsep + path if path else ""))


@contextlib.contextmanager
def pool_for(name: str, sizes: tuple[int, ...], lease: float, env: dict) -> Iterator[dict]:
    """A pool of our own for the benchmark, started and stopped as a user does (``python -m
    pwkernel.pool``: the bench layer sits below the pool's); yields its pool file's record."""
    from ..backends.ray import poolfile

    def pool(*args: str, tries: int = 1) -> None:
        for _ in range(tries):
            done = subprocess.run([sys.executable, "-m", "pwkernel.pool", *args, "--name",
                                   name], env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT)
            if done.returncode == 0:
                return
            if RAY_SLOW_START not in done.stderr:
                break
        raise RuntimeError(f"python -m pwkernel.pool {args[0]} failed: {done.stderr}")

    # Ray gives its raylet a fixed 30 s to register: once more on an overloaded machine
    pool("start", "--islands", ",".join(map(str, sizes)), "--lease", str(lease),
         "--platform", "cpu", tries=2)
    try:
        yield poolfile.load(name)
    finally:
        pool("stop")


@contextlib.contextmanager
def connected(record: dict) -> Iterator[list]:
    """This process as a driver of the pool's cluster (with its token); yields its islands."""
    from ..backends.ray import cluster, tenancy

    cluster.connect(record["address"], pool=record["name"], own_token=True)
    try:
        yield tenancy.find_islands(record["name"])
    finally:
        cluster.disconnect()


def all_answers(procs: Sequence[Process], command: str) -> list[dict]:
    for p in procs:
        p.send(command)
    return [p.answer() for p in procs]


def steps_per_s(procs: Sequence[Process], steps: int) -> float:
    """``steps`` split evenly over ``procs``, all at once: steps per second of wall time."""
    t0 = time.perf_counter()
    made = sum(a["steps"] for a in all_answers(procs, f"run {steps // len(procs)}"))
    return made / (time.perf_counter() - t0)


def busy_window_device_time(log: list[dict], tenants: Sequence[str]) -> dict[str, float]:
    """Device-seconds of computation per tenant from an island's launch log, while every
    tenant had work running (from the last tenant's first start to the first one's last
    end): when proportional share applies."""
    computes = [r for r in log if r["kind"] == "compute" and r["tenant"] in tenants and r["ok"]]
    begin = max(min(r["t_start"] for r in computes if r["tenant"] == n) for n in tenants)
    end = min(max(r["t_end"] for r in computes if r["tenant"] == n) for n in tenants)
    busy = dict.fromkeys(tenants, 0.0)
    for r in computes:
        overlap = min(r["t_end"], end) - max(r["t_start"], begin)
        if overlap > 0:
            busy[r["tenant"]] += overlap * len(r["devices"])
    return busy


def overlaps(log: list[dict]) -> list[tuple[int, int]]:
    """Pairs of launch-log entries (their ``seq``) of two tenants' computations that ran at
    the same time on a shared device: what one gang order per island never lets happen."""
    computes = sorted((r for r in log if r["kind"] == "compute" and r["t_end"] is not None),
                      key=lambda r: r["t_launch"])
    out = []
    for i, r in enumerate(computes):
        for s in computes[i + 1:]:
            if s["t_launch"] >= r["t_end"]:
                break
            if s["tenant"] != r["tenant"] and set(s["devices"]) & set(r["devices"]):
                out.append((r["seq"], s["seq"]))
    return out


def schedule_columns(logs: dict[int, list[dict]], first_device: dict[int, int],
                     t0: float) -> dict[str, list]:
    """Bars of the islands' computations for a plot: one per device an entry ran on, ``left``
    and ``right`` in seconds after ``t0``, ``bottom``/``top`` around the device's global id
    (``first_device[island]`` plus its position), with its ``tenant`` and ``name``."""
    cols: dict[str, list] = {k: [] for k in ("left", "right", "bottom", "top", "device",
                                             "tenant", "name")}
    for island, log in logs.items():
        for r in log:
            if r["kind"] != "compute" or r["t_end"] is None:
                continue
            for position in r["devices"]:
                device = first_device[island] + position
                cols["left"].append(r["t_start"] - t0)
                cols["right"].append(r["t_end"] - t0)
                cols["bottom"].append(device - 0.4)
                cols["top"].append(device + 0.4)
                cols["device"].append(device)
                cols["tenant"].append(r["tenant"])
                cols["name"].append(r["name"])
    return cols


def shares(island, procs: Sequence[Process], weights: Sequence[float], seconds: float) -> dict:
    import ray

    since = ray.get(island.pool_status.remote(), timeout=60)["launches"]
    all_answers(procs, f"busy {seconds}")
    log = ray.get(island.launches.remote(since), timeout=60)
    busy = busy_window_device_time(log, [p.name for p in procs])
    total, wsum = sum(busy.values()), sum(weights)
    rows = {p.name: {"weight": w, "target_pct": 100 * w / wsum,
                     "achieved_pct": 100 * busy[p.name] / total if total else float("nan"),
                     "device_s": busy[p.name]} for p, w in zip(procs, weights, strict=True)}
    error = max(abs(r["achieved_pct"] - r["target_pct"]) for r in rows.values())
    return {"tenants": rows, "share_error_points": error, "overlaps": len(overlaps(log))}


def island_bytes(islands: list) -> tuple[int, dict[str, int]]:
    """All bytes the pool's islands hold, and each tenant's."""
    import ray

    total, by = 0, {}
    for s in ray.get([i.pool_status.remote() for i in islands], timeout=60):
        total += s["bytes"]
        for t in s["tenants"]:
            by[t["name"]] = by.get(t["name"], 0) + t["bytes"]
    return total, by


def unowned_bytes(islands: list) -> tuple[int, dict[str, int]]:
    """The bytes the islands hold beyond their tenants' buffers (values in flight, or not
    freed yet), and each tenant's bytes."""
    total, by = island_bytes(islands)
    return total - sum(by.values()), by


def wait_reclaimed(islands: list, name: str, unowned: int, t_kill: float,
                   timeout: float = TIMEOUT) -> dict:
    """After tenant ``name`` was killed at ``t_kill`` (``time.monotonic``), read the pool's
    status until it dropped the tenant (``dropped_s``) and the islands hold none of its bytes
    (``reclaim_s``: nothing beyond the other tenants' buffers and the ``unowned`` bytes of
    before the kill); the other tenants may go on working meanwhile."""
    import ray

    dropped, seen = None, -1
    while True:
        now_unowned, by = unowned_bytes(islands)
        t = time.monotonic() - t_kill
        if dropped is None and name not in by:
            dropped = t
        if dropped is not None and now_unowned <= unowned:
            return {"dropped_s": dropped, "reclaim_s": t}
        if t > timeout:
            raise RuntimeError(f"the pool did not free killed tenant {name}'s memory within "
                               f"{timeout:g} s ({'dropped' if dropped else 'not dropped'})")
        # until island 0's status changes (a tenant dropped, buffers freed, work ended)
        seen = ray.get(islands[0].changed.remote(seen, 1.0), timeout=60)


def reclaim(islands: list, victim: Process) -> dict:
    """Kill ``victim`` after it made a value on each island; how long until the pool forgot
    it and its memory was free."""
    holding = victim.ask("hold")["holding"]
    unowned, by = unowned_bytes(islands)
    times = wait_reclaimed(islands, victim.name, unowned, victim.kill())
    return times | {"holding": holding, "bytes_freed": by[victim.name]}


def end_all(procs: Sequence[Process]) -> None:
    """Every process quits at once (their controllers close), then each is waited for."""
    for p in procs:
        p.quit()
    for p in procs:
        p.end()


def run(mode: str = "quick") -> Result:
    """Aggregate throughput of 1, 2, 4 tenants against a dedicated client, shares at weights
    1:2:4:8, and the time to reclaim a killed tenant's memory."""
    cfg = CONFIGS[check_mode(mode)]
    t0 = time.perf_counter()
    phases = {}

    def phase(what: str) -> None:  # (on stderr too: the run takes minutes)
        phases[what] = round(time.perf_counter() - t0, 2)
        print(f"pool benchmark: {what} at {phases[what]:.1f} s", file=sys.stderr, flush=True)

    name, sizes, env = f"bench-{os.getpid()}", cfg["islands"], child_env()
    common = ["--devices", str(cfg["devices"]), "--size", str(cfg["size"]),
              "--ahead", str(cfg["ahead"])]
    procs: list[Process] = []
    with pool_for(name, sizes, cfg["lease"], env) as record:
        phase("pool started")
        try:  # (started after the pool: on two busy cores Ray's start-up may time out)
            tenants = [Process.tenant(f"w{w:g}", ["--pool", name, "--weight", str(w), *common],
                               env) for w in cfg["weights"]]
            token = dict(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=record["token_path"])
            dedicated = Process.tenant("dedicated", ["--islands", ",".join(map(str, sizes)),
                                              *common], dict(env, **token))
            procs = [*tenants, dedicated]
            for p in procs:
                p.send(f"attach {record['address']}")
            for p in procs:
                p.answer()  # ready: attached and compiled
            phase("processes ready")
            variants = {"alone": lambda: steps_per_s([dedicated], cfg["steps"])}
            variants |= {str(k): (lambda k=k: steps_per_s(tenants[:k], cfg["steps"]))
                         for k in cfg["counts"]}
            samples = interleave(variants, rounds=cfg["rounds"])
            dedicated.end()
            phase("throughput")
            with connected(record) as islands:
                share = shares(islands[0], tenants, cfg["weights"], cfg["busy_s"])
                phase("shares")
                freed = reclaim(islands, tenants[0])
                phase("reclaim")
        finally:
            end_all(procs)
    phase("pool stopped")
    rows = [{"variant": "dedicated" if k == "alone" else f"{k} tenants",
             "steps_per_s": summarize(v),
             "vs_alone": 1.0 if k == "alone" else paired_ratio(samples, k, "alone")}
            for k, v in samples.items()]
    rows.append({"variant": "shares 1:2:4:8", **share})
    rows.append({"variant": "reclaim", "lease_s": cfg["lease"], **freed})
    ratios = {f"pool_aggregate_vs_alone_{k}": paired_ratio(samples, str(k), "alone")
              for k in cfg["counts"]}
    ratios |= {"pool_share_error": share["share_error_points"],
               "pool_reclaim_s": freed["reclaim_s"]}
    notes = ["steps_per_s: the same total of dependent steps run by a dedicated client (its "
             "own islands) or split over k pool tenants at once (median, min, max).",
             "shares: device-seconds per tenant from the island's launch log while all four "
             "were busy; pool_share_error: the largest |achieved - target| in points.",
             f"pool_reclaim_s: SIGKILL to the islands' bytes back down; the pool's lease is "
             f"{cfg['lease']:g} s (a tenant silent that long is dropped)."]
    config = dict(cfg, islands=list(sizes), tenants=len(cfg["weights"]))
    return Result("pool", mode, config, rows, ratios, notes,
                  time.perf_counter() - t0).with_extra(shares=share, reclaim=freed, phases=phases)

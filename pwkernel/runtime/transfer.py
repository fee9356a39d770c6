"""Transfers inside an island (ICI) and between islands (DCN), and the link model.

A transfer moves a sharded buffer onto another layout with ``jax.device_put``: resharding
between slices of one island, or copying between islands. The local backend starts it at once
from the thread that decided it (its source may still be computing), so transfers overlap with
computations; one not ready at once is watched to its end on this module's pool of threads.
The gang schedulers order computations; a transfer waits for one only under a memory budget,
which admits its bytes on the destination first.

``Link(bandwidth, latency)`` emulates a slower data-center network between islands: the bytes
move at the machine's real speed, then the transfer's end is delayed to the time the link model
gives (``latency + nbytes / bandwidth``, with transfers on one directed link sharing its
bandwidth one after another). This is emulation, documented as such: it reproduces the timing
of a slower network, not its mechanics. (The simulated backend models links itself.)
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax

from .keywords import suggests_keywords
from .trace import LinkKind


def copy_onto(value, sharding):
    """``jax.device_put(value, sharding)`` (a new buffer, never the source's) that never waits
    for ``value`` to be computed. Between two layouts of the same devices (replicated to
    sharded, say) JAX's ``device_put`` takes a path that reads the value first, through the
    host: a copy decided behind a running computation waited for its end in the launching
    thread (and a computation of host callbacks on several devices could then miss XLA's
    collective rendezvous and abort the process). Such a copy is a compiled identity laid out
    as ``sharding``, queued behind its source as a computation is, done on the devices; any
    other goes to ``device_put``, which starts it at once (and says why a gone value cannot
    be copied). The identity needs the same devices in the same order (a computation has one
    device assignment): a mesh of them in another order is also ``device_put``'s."""
    src = getattr(value, "sharding", None)
    if (isinstance(value, jax.Array) and src is not None
            and src.device_set == sharding.device_set and not value.is_deleted()
            and not src.is_equivalent_to(sharding, value.ndim)
            and _order(src) == _order(sharding)):
        return _relaid(sharding)(value)
    return jax.device_put(value, sharding, may_alias=False)


def _order(sharding) -> tuple | None:
    """A sharding's devices in its mesh's order (None without a mesh: taken as the same)."""
    mesh = getattr(sharding, "mesh", None)
    devices = getattr(mesh, "devices", None)
    return None if devices is None else tuple(devices.flat)


@functools.lru_cache(maxsize=256)
def _relaid(sharding):
    """An identity compiled to lay its result out as ``sharding`` (JAX caches it per shape)."""
    return jax.jit(lambda v: v, out_shardings=sharding)


@suggests_keywords("pw.Link")
@dataclass(frozen=True)
class Link:
    """An emulated network link: ``bandwidth`` in bytes/s, ``latency`` in seconds.

    >>> pw.Link(bandwidth=1e9, latency=50e-6).duration(1_000_000)
    0.00105
    """

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        # (finite: an infinite latency held every copy between islands for ever, and a NaN
        # passed both comparisons)
        if not (_finite(self.bandwidth) and _finite(self.latency) and self.bandwidth > 0
                and self.latency >= 0):
            raise ValueError(
                f"Link needs bandwidth > 0 (bytes/s) and latency >= 0 (s), finite numbers, got "
                f"bandwidth={self.bandwidth!r}, latency={self.latency!r}; "
                "e.g. pw.Link(bandwidth=10e9, latency=20e-6)."
            )

    def duration(self, nbytes: int) -> float:
        return round(self.latency + nbytes / self.bandwidth, 12)


def _finite(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


class TransferEngine:
    """A small pool of threads that watch transfers to their ends, delaying DCN transfers to
    the link model's time."""

    def __init__(self, dcn: Link | None = None, workers: int = 4):
        self.dcn = dcn
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="pw-transfer")
        self._lock = threading.Lock()
        self._link_free: dict[tuple[int | None, int], float] = {}
        self._apart: list[threading.Thread] = []  # ``wait_apart``'s threads
        self._closing = threading.Event()  # set by ``shutdown``: copies land at once

    def wait_apart(self, fn, *args) -> None:
        """Run ``fn(*args)`` on a short-lived thread of its own (a copy that waits for its
        source's end must not take a worker); ``shutdown`` joins it."""
        thread = threading.Thread(target=fn, args=args, daemon=True, name="pw-transfer-wait")
        with self._lock:
            self._apart = [t for t in self._apart if t.is_alive()]
            self._apart.append(thread)
        thread.start()

    def submit(self, fn, *args) -> None:
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:  # the pool takes no more work (closed, or the interpreter is
            fn(*args)  # stopping): watch this transfer here, as a closing island does

    def delay(self, link: str, src: int | None, dst: int, nbytes: int, begin: float) -> None:
        """Delay a DCN transfer that began at ``begin`` until the link model says it landed
        (returns at once for any other transfer, or without a link model)."""
        if self.dcn is None or link != LinkKind.DCN.value:
            return
        with self._lock:
            start = max(begin, self._link_free.get((src, dst), 0.0))
            self._link_free[(src, dst)] = start + nbytes / self.dcn.bandwidth
        remaining = start + self.dcn.duration(nbytes) - time.perf_counter()
        if remaining > 0:  # emulation: the transfer lands when the link model says
            self._closing.wait(remaining)

    hold = delay  # its name before the glossary (docs/architecture.md) kept "hold" for islands

    def shutdown(self) -> None:
        """Watch every copy begun to its end (a copy dropped here would never end: its run
        would keep its buffers, and copies waiting for it their threads), then stop; the
        link model holds none of them any longer."""
        self._closing.set()
        self._pool.shutdown(wait=True)
        with self._lock:
            apart, self._apart = self._apart, []
        for thread in apart:
            thread.join()

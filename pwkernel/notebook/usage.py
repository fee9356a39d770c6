"""What the sidebar's status (``comm.py``) says about device use: each device's busy fraction
over the last ``WINDOW`` seconds, read incrementally from the trace, and, for a tenant of a
shared device pool, the pool's tenants with the other tenants' recent computations.

Other tenants' computations are in this controller's trace with their ``tenant`` (the Ray
backend pulls them from the pool's islands: ``backends/ray/others.py``); a device's
``utilization`` stays this controller's own, and its ``others`` gives each other tenant's busy
fraction on it over the same window.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..runtime.snapshot import Snapshot
from ..viz.columns import merged_busy
from ..viz.palette import COLORS

WINDOW = 2.0  # seconds of history behind each device's utilization
RECENT = 20  # other tenants' computations listed in the pool part, newest first


class Utilization:
    """Busy fraction of each device over the last ``window`` seconds: ended computations
    from the trace (read incrementally) plus computations running now. Other tenants'
    computations (a shared pool's) are kept apart: ``others`` and ``recent`` after a
    ``sample``."""

    def __init__(self, window: float = WINDOW):
        self.window = window
        self._trace: Any = None
        self._cursor = 0
        self._spans: deque[tuple[float, float, tuple[int, ...], str, Any]] = deque()
        #: device -> {tenant: busy fraction} of other tenants, as of the last ``sample``
        self.others: dict[int, dict[str, float]] = {}
        #: other tenants' computations that ended in the window, newest first (``Event``)
        self.recent: list[Any] = []

    def sample(self, trace, running: list[tuple[float, tuple[int, ...]]],
               now: float | None = None) -> dict[int, float]:
        """``trace``: the controller's ``Trace``; ``running``: (start, devices) of computations
        launched and not ended; ``now``: a reading of the controller's clock (the trace's;
        default ``time.perf_counter()``, the local and Ray backends' clock)."""
        now = time.perf_counter() if now is None else now
        start = now - self.window
        if trace is not self._trace:  # a new controller (the old one was closed): start over
            self._trace, self._cursor, self._spans = trace, 0, deque()
        events = trace.events(since=self._cursor)
        if events:
            self._cursor = events[-1].index + 1
        for e in events:
            if e.kind == "compute" and e.t_end > start:
                self._spans.append((e.t_start, e.t_end, tuple(e.devices), e.tenant, e))
        while self._spans and self._spans[0][1] <= start:
            self._spans.popleft()
        busy: dict[tuple[int, str], list[tuple[float, float]]] = {}
        spans = [*self._spans, *((t0, now, d, "", None) for t0, d in running)]
        for t0, t1, devices, tenant, _ in spans:
            lo, hi = max(t0, start), min(t1, now)
            if hi > lo:
                for d in devices:
                    busy.setdefault((d, tenant), []).append((lo, hi))
        use = {key: min(1.0, merged_busy(s) / self.window) for key, s in busy.items()}
        self.others = {}
        for (d, tenant), fraction in use.items():
            if tenant:
                self.others.setdefault(d, {})[tenant] = fraction
        theirs = [e for t0, t1, _, tenant, e in self._spans if tenant and t1 <= now]
        self.recent = sorted(theirs, key=lambda e: e.t_end, reverse=True)[:RECENT]
        return {d: fraction for (d, tenant), fraction in use.items() if not tenant}


def pool_part(snap: Snapshot, use: Utilization, now: float) -> dict[str, Any]:
    """The status's ``pool``: the pool's tenants (``name``, ``me``, ``color`` (other tenants:
    their colour in the views; "" for this controller), ``queued``, ``running``, ``share``,
    ``device_seconds``, ``bytes``, ``devices``: this controller's ids of the devices its work
    used) and ``recent``: the other tenants' computations that ended in the last window
    (``tenant``, ``client``, ``name``, ``island``, ``devices``, ``ago`` and ``duration`` in
    seconds), newest first."""
    pool = snap.pool
    ids = {i.id: i.device_ids for i in snap.islands}
    tenants = [{"name": t.name, "me": t.me,
                "color": "" if t.me else COLORS.color("tenant", t.name),
                "queued": t.queued, "running": t.running, "share": round(t.share, 4),
                "device_seconds": round(t.device_seconds, 6), "bytes": t.bytes,
                "devices": [ids[i][p] for i, ps in t.slices.items() if i in ids
                            for p in ps if p < len(ids[i])]} for t in pool.tenants]
    recent = [{"tenant": e.tenant, "client": e.client, "name": e.name, "island": e.island,
               "devices": list(e.devices), "ago": round(max(0.0, now - e.t_end), 4),
               "duration": round(e.duration, 6)} for e in use.recent]
    return {"name": pool.name, "tenants": tenants, "recent": recent}


def device_others(use: Utilization, device: int) -> dict[str, float]:
    """Each other tenant's busy fraction on ``device`` over the window (rounded)."""
    return {t: round(f, 4) for t, f in use.others.get(device, {}).items()}

"""The pool's other tenants in this controller's trace (``pw.Controller(backend="ray",
pool=NAME)``).

Every pool island keeps a launch log (``PoolIslandActor.launches(since)``): each operation it
issued, of every tenant, in its one issue order, with its times once it ended. ``OtherTenants``
reads each island's log from where it left off (one ``launches`` call per island, at most every
``PULL_EVERY`` seconds, from a thread of its own, and at once on ``pull()``: the backend's
``status()``, which snapshots and the sidebar read) and records every computation of ANOTHER
tenant that ended as a trace event, so the schedule view and the sidebar show it beside this
controller's own work:

- ``tenant``: the other tenant's name (the marker the views tell others' work by; ``""`` is
  this controller's own), ``program``: that name too (one colour per tenant when colouring by
  program), ``client``: ``"<tenant>/<client>"`` (or the tenant's name when it gave none),
  ``name``: its computation's name, ``program_id``: -1 (not a run of this controller);
- ``devices``: this controller's device ids of the positions it ran on;
- times: the actor's clock mapped onto this controller's with the island's offset
  (``IslandHost.to_local``): ``t_submit`` its launch there, ``t_start``/``t_end`` as measured
  there.

Its own entries (the log says whose by the tenant id the island gave it) and transfers are
skipped: its own computations are in the trace already, from its own records.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import ray

PULL_EVERY = 0.5  # seconds between two reads of the islands' launch logs
_TIMEOUT = 30.0  # seconds one read waits for an island before it is skipped this time


class IslandLog:
    """Where this controller is in one island's launch log: ``since`` is the first entry not
    ended yet (read again next time), ``seen`` the ended entries at or after it already
    recorded."""

    def __init__(self, host, device_ids: Sequence[int]):
        self.host = host
        self.device_ids = tuple(device_ids)  # position on the island -> this controller's id
        self.since = 0
        self.seen: set[int] = set()
        self.generation = host.generation

    def take(self, entries: list[dict]) -> list[dict]:
        """The entries of other tenants' computations that ended and were not taken yet;
        moves ``since`` past every ended entry at its start."""
        out, mine = [], self.host.tenant_id
        for e in entries:
            seq = e["seq"]
            if e["t_end"] is None or seq in self.seen or seq < self.since:
                continue
            self.seen.add(seq)
            if e["kind"] == "compute" and e.get("tenant_id") != mine:
                out.append(e)
        ended = {e["seq"] for e in entries if e["t_end"] is not None} | self.seen
        first = entries[0]["seq"] if entries else self.since
        self.since = max(self.since, first)  # entries the island dropped are gone for good
        while self.since in ended:
            self.since += 1
        self.seen = {s for s in self.seen if s >= self.since}
        return out


class OtherTenants:
    """Records the other tenants' ended computations on ``hosts`` (a pool's islands, as
    ``PoolIslandHost``) into ``trace``; ``islands`` are this controller's islands (for their
    device ids). ``start()`` pulls every ``every`` seconds until ``close()``."""

    def __init__(self, trace, hosts: dict[int, Any], islands: Sequence[Any],
                 every: float = PULL_EVERY):
        self.trace = trace
        self.every = every
        self.logs = [IslandLog(hosts[isl.id], isl.device_ids) for isl in islands]
        self.recorded = 0  # events recorded so far
        self._lock = threading.Lock()  # one pull at a time: the thread's and status()'s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False  # a failing read is logged once, not every half second

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pw-ray-others", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.pull()

    def pull(self) -> int:
        """Read every island's log once and record what is new; returns how many events."""
        with self._lock:
            logs = [log for log in self.logs if log.host.actor is not None
                    and not log.host.lost and log.host.tenant_id is not None]
            for log in logs:
                if log.generation != log.host.generation:  # reattached: a new actor's log
                    log.since, log.seen, log.generation = 0, set(), log.host.generation
            refs = [log.host.handle.launches.remote(log.since) for log in logs]
            count = 0
            for log, ref in zip(logs, refs, strict=True):
                try:
                    entries = ray.get(ref, timeout=_TIMEOUT)
                except ray.exceptions.RayActorError:  # died: lost, as a failed call marks
                    log.host.mark_lost()  # it (the work that needs it, and the pool's
                    continue  # KeepAlive, say so; Ray's text of the death is noise here)
                except (ray.exceptions.RayError, TimeoutError) as e:
                    if not self._failed:
                        logging.getLogger("pwkernel").warning(
                            "island %s: its launch log could not be read (other tenants' "
                            "work is missing from the trace meanwhile): %s", log.host.island, e)
                    self._failed = True
                    continue
                for e in log.take(entries):
                    self._record(log, e)
                    count += 1
            self.recorded += count
            return count

    def _record(self, log: IslandLog, e: dict) -> None:
        to_local = log.host.to_local
        tenant = str(e["tenant"])
        client = e.get("client")
        self.trace.record(
            kind="compute", name=str(e["name"]), program=tenant, program_id=-1,
            client=f"{tenant}/{client}" if client else tenant, island=log.host.island,
            devices=tuple(log.device_ids[p] for p in e["devices"]),
            t_submit=to_local(e["t_launch"]), t_start=to_local(e["t_start"]),
            t_end=to_local(e["t_end"]), status="ok" if e["ok"] else "error", tenant=tenant)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

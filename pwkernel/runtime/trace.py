"""The event log: every computation and transfer the controller ran, on one clock.

Times are seconds on the executor's clock (``executor.now()``): ``time.perf_counter()`` in the
controller's process for the local and Ray backends (an island actor's times are mapped onto
it with the clock offset measured when the actor starts), virtual seconds for a simulated
cluster. How each time is taken:

- ``t_submit``: the node was handed to its island's scheduler (parallel dispatch: when the
  program was submitted; sequential dispatch: when its inputs existed); a transfer's is when
  it was started.
- ``t_start``: the latest of the node's launch, its inputs' ends and the previous node's end on
  its devices. Nodes are launched ahead of their data (parallel dispatch), so this is the
  earliest moment the node could run.
- ``t_end``: its end as the executor saw it. Locally, the launch's fence was seen ready
  (``runtime/callbacks.py``): at once by the launching thread when XLA ran it within the call,
  else by the watcher thread of its device set, which includes that thread's wake-up (tens of
  microseconds on CPU; on accelerators also the device-to-host completion signal). Spans are
  therefore upper bounds on device busy time, accurate to a few tens of microseconds.

Events are appended by the threads that see the ends; readers take copies. ``index`` grows
forever, so a live view can ask for ``events(since=k)`` and stream only what is new. The log
keeps the newest ``capacity`` events (``CAPACITY`` by default, about 250 bytes each), so a
kernel that trains for days runs in bounded memory; older ones are dropped as ``clear`` drops
them, their indices never reused.
"""

from __future__ import annotations

import errno
import functools
import json
import operator
import os
import threading
from collections import deque
from enum import StrEnum
from itertools import islice
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .device_groups import Topology, check_rows
from .keywords import suggests_keywords

#: events a ``Trace`` keeps by default: the newest million (about 250 MB at most)
CAPACITY = 1_000_000


class EventKind(StrEnum):
    COMPUTE = "compute"
    TRANSFER = "transfer"


class LinkKind(StrEnum):
    """Where a transfer travelled: inside one island (the paper's ICI) or between islands (DCN)."""

    ICI = "ici"
    DCN = "dcn"


class Event(NamedTuple):
    """One computation or transfer that ran and ended (immutable; ``e._replace(...)`` makes a
    changed copy). Work that never ran (cancelled, rejected, fed by a failed input) has none.

    ``devices`` are global device ids: for a transfer, the destination devices, with the
    source devices in ``src_devices``. ``src``/``dst`` are island ids (transfers only).
    ``tenant`` names the pool tenant (another controller on a shared pool's island) whose
    computation this was; it is ``""`` for this controller's own work.
    ``status`` is ``"ok"`` or ``"error"``; a simulated cluster that deadlocked also records
    each stuck computation with ``"deadlock"``, until the clock froze. A named tuple, not a frozen
    dataclass: a live view reads thousands per second, and this builds one in a single C call.
    """

    index: int
    kind: str
    name: str
    program: str
    program_id: int
    client: str
    island: int
    devices: tuple[int, ...]
    t_submit: float
    t_start: float
    t_end: float
    status: str = "ok"
    nbytes: int = 0
    src: int | None = None
    dst: int | None = None
    src_devices: tuple[int, ...] = ()
    link: str | None = None
    node_id: int = -1
    tenant: str = ""  # another controller's work on a shared pool's island ("": this one's)

    @property
    def duration(self) -> float:
        return self.t_end - self.t_start

    @property
    def bandwidth(self) -> float | None:
        """Achieved bytes per second of a transfer (None for computations)."""
        if self.kind != EventKind.TRANSFER or self.duration <= 0:
            return None
        return self.nbytes / self.duration

    def to_dict(self) -> dict:
        return self._asdict()


_new_event = functools.partial(tuple.__new__, Event)

#: each ``Event`` field's position in an Event and in a ``Trace.rows`` tuple
FIELD: dict[str, int] = {name: i for i, name in enumerate(Event._fields)}


def getter(name: str) -> operator.itemgetter:
    """Reads field ``name`` from an ``Event`` or a ``Trace.rows`` tuple (a C call)."""
    return operator.itemgetter(FIELD[name])


def as_events(rows: list[tuple]) -> list[Event]:
    """``Event`` objects from ``Trace.rows`` tuples (C calls only: no Python per event)."""
    return list(map(_new_event, rows))


class Trace:
    """The controller's event log. ``enabled=False`` stops recording (and its small cost).

    Recording appends one plain tuple (the ``Event`` fields in order) under a lock. Plain
    tuples of numbers and strings are dropped from the garbage collector's lists after its
    first pass (an ``Event``, a tuple subclass, never is), so a long trace costs the collector
    nothing; ``events()`` builds ``Event`` objects when read, and ``rows()`` hands live views
    the stored tuples themselves.

    ``topology``: the islands (and hosts) the events ran on, which ``save(path, rows=...)``
    groups tracks by; the controller and the simulator give theirs. Without one, the islands
    and devices the events name, each device its own host.

    ``capacity``: how many events it keeps, the newest (an int > 0, or None for every one;
    settable: ``ctl.trace.capacity = 10_000``). Older events are dropped as they are recorded
    past it: ``events()`` starts at the oldest kept, ``next_index`` still counts them all.
    """

    def __init__(self, enabled: bool = True, topology: Topology | None = None,
                 capacity: int | None = CAPACITY):
        self.enabled = enabled  # (checked: see the setter)
        self.topology = topology
        self._raw: deque[tuple] = deque(maxlen=_capacity(capacity))
        self._next = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters = 0

    def record(self, *, kind: str, name: str, program: str, program_id: int, client: str,
               island: int, devices: tuple[int, ...], t_submit: float, t_start: float,
               t_end: float, status: str = "ok", nbytes: int = 0, src: int | None = None,
               dst: int | None = None, src_devices: tuple[int, ...] = (),
               link: str | None = None, node_id: int = -1, tenant: str = "") -> None:
        """Append one event, its ``Event`` fields by name (the log numbers it: ``index``).

        A computation needs no more than the ten fields up to ``t_end`` (``status`` is
        ``"ok"`` unless given); a transfer also says ``nbytes``, ``src``, ``dst``,
        ``src_devices`` and ``link``."""
        self.record_span((kind, name), (program, program_id, client), (island, devices),
                         (nbytes, src, dst, src_devices, link, node_id, tenant), t_submit,
                         t_start, t_end, status)

    @staticmethod
    def node_fields(*, kind: str, name: str, island: int, devices: tuple[int, ...],
                    nbytes: int = 0, src: int | None = None, dst: int | None = None,
                    src_devices: tuple[int, ...] = (), link: str | None = None,
                    node_id: int = -1, tenant: str = "") -> tuple[tuple, tuple, tuple]:
        """The fields of a node's events that no run changes, by name, as the three parts
        ``record_span`` takes (a plan builds them once per node: ``PlanNode.trace``)."""
        return (kind, name), (island, devices), (nbytes, src, dst, src_devices, link, node_id,
                                                  tenant)

    def record_span(self, what: tuple, run: tuple, where: tuple, tail: tuple, t_submit: float,
                    t_start: float, t_end: float, status: str = "ok") -> None:
        """Append one event from parts made once: ``node_fields``' three (``what``, ``where``,
        ``tail``) and the run's ``(program, program_id, client)``; what ``record`` does by
        keyword, without building the fixed fields again per event."""
        if not self._enabled:  # (the attribute itself: a property read costs every event)
            return
        with self._lock:
            self._raw.append((self._next, *what, *run, *where, t_submit, t_start, t_end, status,
                              *tail))
            self._next += 1
            if self._waiters:
                self._changed.notify_all()

    @suggests_keywords("ctl.trace.events")
    def events(self, since: int = 0) -> list[Event]:
        """Events with ``index >= since``, oldest first."""
        try:
            since = operator.index(since)
        except TypeError:
            raise TypeError(f"since is an event index (an int: trace.next_index, or an event's "
                            f".index), got {type(since).__name__} {since!r}.") from None
        return as_events(self.rows(since))

    def rows(self, since: int = 0) -> list[tuple]:
        """Like ``events`` but the stored tuples themselves (``Event`` fields in order; read
        them with ``operator.itemgetter``): no object is made per event."""
        with self._lock:
            new = min(self._next - since, len(self._raw))  # the newest ``new`` rows
            if new <= 0:
                return []
            if new == len(self._raw):
                return list(self._raw)
            rows = list(islice(reversed(self._raw), new))
        rows.reverse()
        return rows

    def wait_for(self, count: int, timeout: float | None = None) -> bool:
        """Block until at least ``count`` events were ever recorded; False on timeout."""
        with self._lock:
            self._waiters += 1
            try:
                return self._changed.wait_for(lambda: self._next >= count, timeout)
            finally:
                self._waiters -= 1

    @property
    def enabled(self) -> bool:
        """Whether events are recorded (settable: ``ctl.trace.enabled = False``)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not isinstance(value, bool | np.bool_):  # ("no" or 0 was taken by its truth)
            raise TypeError(f"trace.enabled must be True or False, got {type(value).__name__} "
                            f"{value!r}. Set ctl.trace.enabled = False to stop recording.")
        self._enabled = bool(value)

    @property
    def capacity(self) -> int | None:
        """How many events the log keeps (the newest); None: every one."""
        return self._raw.maxlen

    @capacity.setter
    def capacity(self, value: int | None) -> None:
        keep = _capacity(value)
        with self._lock:
            self._raw = deque(self._raw, maxlen=keep)

    @property
    def next_index(self) -> int:
        """The index the next event will get (the number of events ever recorded)."""
        return self._next

    def clear(self) -> None:
        """Forget recorded events; indices keep growing so live views stay consistent."""
        with self._lock:
            self._raw.clear()

    def __len__(self) -> int:
        return len(self._raw)

    def to_chrome(self, rows: str = "auto") -> dict:
        """Chrome-trace / Perfetto JSON: a process per island, a thread (track) per device.

        ``rows`` groups the device tracks as the schedule view groups its rows
        (``runtime/device_groups.py``): ``"device"``, ``"host"``, ``"island"``, or ``"auto"``
        (the default): a track per device while there are at most 64, else per host, per
        group of consecutive hosts, or per island. A grouped track is named with what it holds
        (``"hosts 0-7 (32 devices)"``, its ``tid`` the first of them) and gets one span per
        computation that touched it, not one per device.

        Transfers get their own track on the destination island (``transfers from island N``)
        and a flow arrow from the source device's track to the destination device's. Their
        tracks' ``tid`` is 10,000 (from the host) or 10,001 + N, or the next multiple of
        10,000 above the highest device id where a cluster has more devices, so that no
        transfer track shares a device's.
        """
        check_rows(rows)
        events = self.events()
        if not events:
            return {"traceEvents": [], "displayTimeUnit": "ms"}
        t0 = min(e.t_submit for e in events)
        out: list[dict] = []
        named: set[tuple[int, int]] = set()
        where = self._tracks(events, rows)  # device -> (tid, track name), if grouped
        touched: dict[tuple[int, ...], list[tuple[int, str]]] = {}
        # transfer tracks' tids sit above every device's (10_000 + 1 + src up to 9,999 devices)
        top = max(max(e.devices + e.src_devices, default=-1) for e in events)
        transfers = 10_000 * (top // 10_000 + 1)

        def us(t: float) -> float:
            return round((t - t0) * 1e6, 3)

        def track(pid: int, tid: int, label: str) -> None:
            if (pid, tid) not in named:
                named.add((pid, tid))
                out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": f"island {pid}"}})
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": label}})

        def on(d: int) -> tuple[int, str]:
            return where.get(d) or (d, f"device {d}")

        def tracks_of(devices: tuple[int, ...]) -> list[tuple[int, str]]:
            if not where:
                return [(d, f"device {d}") for d in devices]
            found = touched.get(devices)
            if found is None:
                found = touched[devices] = list(dict.fromkeys(map(on, devices)))
            return found

        for e in events:
            args = {"program": e.program, "client": e.client, "status": e.status,
                    "queued_us": us(e.t_start) - us(e.t_submit)}
            if e.tenant:
                args["tenant"] = e.tenant
            if e.kind == EventKind.COMPUTE:
                for tid, label in tracks_of(e.devices):
                    track(e.island, tid, label)
                    out.append({"ph": "X", "name": e.name, "cat": "compute", "pid": e.island,
                                "tid": tid, "ts": us(e.t_start),
                                "dur": us(e.t_end) - us(e.t_start), "args": args})
                continue
            host = e.src is None  # (one track per source: the host's is its own)
            tid = transfers + (0 if host else 1 + e.src)
            track(e.dst, tid, "transfers from the host" if host
                  else f"transfers from island {e.src} ({e.link})")
            args |= {"nbytes": e.nbytes, "src": e.src, "dst": e.dst, "link": e.link}
            out.append({"ph": "X", "name": e.name, "cat": "transfer", "pid": e.dst, "tid": tid,
                        "ts": us(e.t_start), "dur": us(e.t_end) - us(e.t_start), "args": args})
            if e.src_devices and e.devices:
                (src, src_label), (dst, dst_label) = on(e.src_devices[0]), on(e.devices[0])
                track(e.src, src, src_label)
                track(e.dst, dst, dst_label)
                flow = {"name": e.name, "cat": "transfer", "id": e.index}
                out.append(flow | {"ph": "s", "pid": e.src, "tid": src, "ts": us(e.t_start)})
                out.append(flow | {"ph": "f", "bp": "e", "pid": e.dst, "tid": dst,
                                   "ts": us(e.t_end)})
        return {"traceEvents": _lanes(out, 2 * transfers), "displayTimeUnit": "ms"}

    def _tracks(self, events: list[Event], rows: str) -> dict[int, tuple[int, str]]:
        """Each grouped device's track: (tid, name); empty for a track per device."""
        topology = self.topology
        if topology is None:  # (a bare trace: the islands its events name)
            seen: dict[int, set[int]] = {}
            for e in events:
                if e.kind == EventKind.COMPUTE:
                    seen.setdefault(e.island, set()).update(e.devices)
                else:
                    seen.setdefault(e.dst, set()).update(e.devices)
                    if e.src is not None:
                        seen.setdefault(e.src, set()).update(e.src_devices)
            topology = Topology.of((i, sorted(ds)) for i, ds in sorted(seen.items()))
        return {d: (ds[0], f"{label} ({len(ds)} device{'s' * (len(ds) != 1)})")
                for label, ds in topology.groups(rows) for d in ds}

    @suggests_keywords("ctl.trace.save")
    def save(self, path: str | Path, rows: str = "auto") -> Path:
        """Write Chrome-trace JSON (open it in https://ui.perfetto.dev or chrome://tracing).

        ``rows``: a track per ``"device"``, ``"host"`` or ``"island"``; ``"auto"`` (the
        default) keeps a track per device up to 64 devices, then groups them (``to_chrome``).

        A ``ValueError`` (one line, before anything is written) for a path that names no file
        (``""``, ``".json"``, a directory) or holds a NUL byte, or a ``rows`` that is none of
        those; a ``TypeError`` for a path that is not one, a ``FileNotFoundError`` for a folder
        that does not exist, and ``OSError`` as ``open`` gives it for one that cannot be
        written."""
        path = _file_path(path)
        check_rows(rows)
        path.write_text(json.dumps(self.to_chrome(rows)))
        return path


def _lanes(out: list[dict], spare: int) -> list[dict]:
    """``out`` with spans that overlap on one track moved to tracks of their own beside it.

    The JSON trace format needs a track's spans nested; Perfetto cuts or drops the ones that
    overlap without nesting (ui.perfetto.dev's FAQ). They happen where one track holds work
    that runs at once: concurrent transfers between the same islands, computations on
    different chips of one grouped track. Each such span goes to the first extra lane of its
    track that is free at its start (``"<track> · 2"``, ...), on ``tid``s from ``spare`` up,
    above every device's and transfer track's."""
    spans: dict[tuple[int, int], list[dict]] = {}
    for e in out:
        if e["ph"] == "X":
            spans.setdefault((e["pid"], e["tid"]), []).append(e)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in out if e["name"] == "thread_name"}
    taken: dict[int, int] = {}  # pid -> lanes given out there
    for (pid, tid), track in spans.items():
        ends: list[float] = []  # each lane's last end; lane 0 is the track itself
        tids = [tid]
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            k = next((k for k, end in enumerate(ends) if end <= e["ts"] + 1e-3), len(ends))
            if k == len(ends):
                ends.append(0.0)
                if k:
                    tids.append(spare + taken.get(pid, 0))
                    taken[pid] = taken.get(pid, 0) + 1
                    out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[k],
                                "args": {"name": f"{names[pid, tid]} · {k + 1}"}})
            ends[k] = e["ts"] + e["dur"]
            e["tid"] = tids[k]
    return out


def _capacity(value: int | None) -> int | None:
    if value is None:
        return None
    try:
        keep = operator.index(value)
    except TypeError:
        keep = 0
    if isinstance(value, bool) or keep <= 0:
        raise ValueError(f"a trace's capacity is how many events it keeps: an int > 0, or None "
                         f"to keep every one; got {value!r}.")
    return keep


def _file_path(path: str | Path) -> Path:
    """``path`` as a file a trace can be written to, or a ``ValueError`` that says why not."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"trace.save needs a file path (str or pathlib.Path), got {path!r}; "
                        "e.g. ctl.trace.save('run.json').")
    text = os.fspath(path)
    why = None
    if "\0" in text:
        why = "has a NUL byte, which no file name may hold"
    elif Path(text).name in ("", ".", "..") or Path(text).name.lower() == ".json":
        why = "names no file (a name is needed before '.json')"
    elif Path(text).is_dir():
        why = "is a directory"
    if why is not None:
        raise ValueError(f"trace.save({text[:120]!r}): the path {why}. Pass a file name such as "
                         "'run.json'.")
    folder = Path(text).parent
    if not folder.is_dir():
        missing = FileNotFoundError(f"trace.save({text[:120]!r}): the folder {str(folder)!r} "
                                    "does not exist; create it first or choose another path.")
        missing.strerror = os.strerror(errno.ENOENT)  # (what open's would say, for its callers)
        raise missing
    return Path(text)

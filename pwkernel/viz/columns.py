"""Pure conversions from trace events to readable columns (lists of names, colours, texts),
plus the layout and summaries the plots share. No Bokeh, no widgets. The live view and the
report stream the typed equivalent of these rows (``encoding``); these stay the reference
they are tested against.

The schedule has one row per device, grouped by island (``DeviceLayout``). A computation that
ran on k devices becomes k bars (one per device row). A transfer becomes a thin bar on each
destination device row, coloured by its link (ICI inside an island, DCN between islands, or
from the host), plus a link segment from the source device row to the destination row.

>>> layout = DeviceLayout.from_islands([(0, (0, 1)), (1, (2, 3))])
>>> cols = rectangles([], layout, t0=0.0)
>>> sorted(cols) == sorted(BAR_COLUMNS), cols["left"]
(True, [])
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..runtime.device_groups import MAX_ROWS, device_groups
from ..runtime.trace import Event, getter
from ..runtime.units import human_bytes
from .palette import COLORS, FAILED_COLOR, ColorRegistry, link_color

BAR_COLUMNS: tuple[str, ...] = (
    "index", "kind", "y", "left", "right", "instant", "name", "program", "client", "device",
    "island", "link", "status", "start", "duration", "nbytes", "bytes_text", "bw_text",
    "c_program", "c_client", "c_link", "tenant", "c_tenant",
)
LINK_COLUMNS: tuple[str, ...] = (
    "index", "x0", "y0", "x1", "y1", "name", "program", "client", "link", "status",
    "src_device", "dst_device", "start", "duration", "nbytes", "bytes_text", "bw_text", "c_link",
)

_DEVICES = getter("devices")

# Vertical placement inside a device row (rows are 1 apart): computations take the main band,
# transfers a thin strip beside it, so both stay readable when they overlap in time.
COMPUTE_OFFSET, COMPUTE_HEIGHT = -0.1, 0.55
TRANSFER_OFFSET, TRANSFER_HEIGHT = 0.3, 0.18
ISLAND_GAP = 0.6  # extra space between the last row of an island and the first of the next


@dataclass(frozen=True)
class DeviceLayout:
    """Where each device's row sits on the y axis, islands kept together in order.

    ``islands`` is ``((island_id, (device_id, ...)), ...)``. ``groups``: rows holding several
    devices (``((label, (device_id, ...)), ...)`` in order, each inside one island): bars of
    those devices share the row, one bar per row. ``partial``: devices outside the layout are
    left out of the picture (a drill-down into some devices) instead of refused.

    >>> DeviceLayout.grouped([(0, tuple(range(8)))], host_of=lambda d: d // 4,
    ...                      rows="host").labels
    {0.0: 'island 0 · host 0 (4 devices)', 1.0: 'island 0 · host 1 (4 devices)'}
    """

    islands: tuple[tuple[int, tuple[int, ...]], ...]
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
    partial: bool = False
    rows: dict[int, float] = field(init=False)

    def __post_init__(self) -> None:
        rows: dict[int, float] = {}
        island_of: dict[int, int] = {}
        for island, devices in self.islands:
            for d in devices:
                if d in island_of:
                    raise ValueError(f"device {d} appears in two islands of the layout "
                                     f"{self.islands!r}; each device belongs to one island.")
                island_of[d] = island
        units = self.groups or tuple((f"device {d}", (d,)) for _, ds in self.islands
                                     for d in ds)
        y, gaps, last, labels = 0.0, -1, None, {}
        for label, devices in units:
            island = island_of[devices[0]]
            if island != last:
                gaps, last = gaps + 1, island
            row = y + gaps * ISLAND_GAP
            for d in devices:
                rows[d] = row
            count = f" ({len(devices)} devices)" if self.groups else ""
            labels[row] = f"island {island} · {label}{count}"
            y += 1
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_shown", {})

    @classmethod
    def from_islands(cls, islands: Iterable[tuple[int, Sequence[int]]]) -> DeviceLayout:
        return cls(tuple((int(i), tuple(int(d) for d in ds)) for i, ds in islands))

    @classmethod
    def grouped(cls, islands: Iterable[tuple[int, Sequence[int]]], host_of=None,
                rows: str = "auto", max_rows: int = MAX_ROWS,
                devices: Iterable[int] | None = None) -> DeviceLayout:
        """Rows per ``"device"``, ``"host"`` (``host_of(device)``; default: each device its
        own host) or ``"island"``; ``"auto"``: per device while they fit in ``max_rows``
        rows, else per host, else per group of consecutive hosts (as many as fit), else per
        island. ``devices``: only these, one row each (a drill-down)."""
        islands = tuple((int(i), tuple(int(d) for d in ds)) for i, ds in islands)
        if devices is not None:
            keep = set(devices)
            known = {d for _, ds in islands for d in ds}
            if not keep or not keep <= known:
                raise ValueError(f"devices must be ids of the controller's devices "
                                 f"({min(known)}..{max(known)}), got {sorted(keep)}. Maybe you "
                                 "want devices=None (all of them).")
            return cls(tuple((i, tuple(d for d in ds if d in keep)) for i, ds in islands
                             if any(d in keep for d in ds)), partial=True)
        return cls(islands, device_groups(islands, host_of, rows, max_rows))

    @classmethod
    def from_controller(cls, ctl, rows: str = "device", max_rows: int = MAX_ROWS,
                        devices: Iterable[int] | None = None) -> DeviceLayout:
        """The layout of ``ctl.islands`` (works on a closed controller too). A controller
        that knows its hosts (``ctl.host_of``: device -> host, e.g. a simulator) can be shown
        per host."""
        host_of = getattr(ctl, "host_of", None)
        return cls.grouped(((isl.id, isl.device_ids) for isl in ctl.islands),
                           None if host_of is None else host_of.__getitem__, rows, max_rows,
                           devices)

    @property
    def n_rows(self) -> int:
        return len(self._labels)

    def row(self, device: int) -> float:
        try:
            return self.rows[device]
        except KeyError:
            raise ValueError(f"device {device} is not in this layout (devices "
                             f"{sorted(self.rows)}); the event comes from another controller "
                             f"or the islands changed: make a new view.") from None

    def shown(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """The devices of an event that get a bar: one per row (the first of the event's
        devices on it); with ``partial``, only devices in the layout."""
        if not self.groups and not self.partial:
            return devices
        out = self._shown.get(devices)
        if out is None:
            seen: set[float] = set()
            out = []
            for d in devices:
                y = self.rows.get(d)
                if y is None:
                    if not self.partial:
                        self.row(d)  # the clear error
                    continue
                if y not in seen:
                    seen.add(y)
                    out.append(d)
            out = self._shown[devices] = tuple(out)
        return out

    def busy(self, spans, lo: float, hi: float) -> dict[float, float]:
        """Seconds each row was busy (any of its devices) within ``[lo, hi]``, of ``spans``
        (start, end, devices): overlaps on a row counted once."""
        rows: dict[float, list[tuple[float, float]]] = {}
        for t_start, t_end, devices in spans:
            if t_end <= lo or t_start >= hi:
                continue
            span = (max(t_start, lo), min(t_end, hi))
            for d in self.shown(devices):
                rows.setdefault(self.rows[d], []).append(span)
        return {y: merged_busy(v) for y, v in rows.items()}

    def drawn(self, events: list) -> list:
        """The events (``Event`` objects or ``Trace.rows`` tuples) that get a bar here: all of
        them, but a drill-down's (``partial``) only those on its devices."""
        if not self.partial:
            return events
        return [e for e in events if self.shown(_DEVICES(e))]

    def pairs(self, src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int]]:
        """Source -> destination device pairs of a transfer to draw: one per pair of rows."""
        out, seen = [], set()
        for s, d in _pairs(src, dst):
            ys, yd = self.rows.get(s), self.rows.get(d)
            if ys is None or yd is None:
                if self.partial:
                    continue
                self.row(s), self.row(d)  # the clear error
            if (ys, yd) not in seen:
                seen.add((ys, yd))
                out.append((s, d))
        return out

    @property
    def labels(self) -> dict[float, str]:
        """Tick label per row position, e.g. ``{0.0: "island 0 · device 0"}``."""
        return dict(self._labels)

    def island_span(self, island: int) -> tuple[float, float]:
        """(first row, last row) of ``island``."""
        for i, ds in self.islands:
            if i == island and ds:
                return self.rows[ds[0]], self.rows[ds[-1]]
        raise ValueError(f"island {island} is not in this layout "
                         f"(islands {[i for i, _ in self.islands]}).")

    @property
    def extent(self) -> tuple[float, float]:
        """(lowest, highest) y the rows need, with half a row of margin."""
        ys = list(self.rows.values()) or [0.0]
        return min(ys) - 0.5, max(ys) + 0.5


def human_rate(bytes_per_s: float | None) -> str:
    return "" if bytes_per_s is None else f"{human_bytes(bytes_per_s)}/s"


def select(events: Iterable[Event], programs: Iterable[str] | None = None,
           clients: Iterable[str] | None = None) -> list[Event]:
    """The events of the given programs and clients (None: all of them)."""
    p = None if programs is None else set(programs)
    c = None if clients is None else set(clients)
    return [e for e in events
            if (p is None or e.program in p) and (c is None or e.client in c)]


def empty(names: Sequence[str]) -> dict[str, list]:
    return {k: [] for k in names}


def _program_color(e: Event, colors: ColorRegistry) -> str:
    return colors.color("program", e.program) if e.status == "ok" else FAILED_COLOR


def rectangles(events: Iterable[Event], layout: DeviceLayout, t0: float,
               colors: ColorRegistry = COLORS) -> dict[str, list]:
    """Bars for ``events``: one per (event, device). Times are seconds since ``t0``.

    Computations sit on their devices' rows; transfers on their destination devices' rows in
    the thin transfer strip, coloured by link (``c_link``). Another tenant's computation (a
    shared pool's) names it in ``tenant`` and has its colour in ``c_tenant``. A bar of no
    length (it started and ended at once) has its time in ``instant`` (NaN for the others).
    """
    out = empty(BAR_COLUMNS)
    for e in events:
        is_transfer = e.kind == "transfer"
        offset = TRANSFER_OFFSET if is_transfer else COMPUTE_OFFSET
        bw = e.bandwidth
        left, right = e.t_start - t0, e.t_end - t0
        shared = {
            "index": e.index, "kind": e.kind, "left": left, "right": right,
            "instant": left if right == left else math.nan,
            "name": e.name, "program": e.program, "client": e.client, "island": e.island,
            "link": e.link or "", "status": e.status, "start": e.t_start - t0,
            "duration": e.duration, "nbytes": e.nbytes,
            "bytes_text": human_bytes(e.nbytes) if is_transfer else "",
            "bw_text": human_rate(bw), "c_program": _program_color(e, colors),
            "c_client": colors.color("client", e.client),
            "c_link": link_color(e.link) if is_transfer else "", "tenant": e.tenant,
            "c_tenant": colors.color("tenant", e.tenant) if e.tenant else "",
        }
        for d in layout.shown(e.devices):
            for k, v in shared.items():
                out[k].append(v)
            out["device"].append(d)
            out["y"].append(layout.row(d) + offset)
    return out


def _pairs(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int]]:
    # Shard i of the source feeds shard i of the destination when the layouts match in size;
    # otherwise every destination device is drawn from the source shard at the same position.
    if not src or not dst:
        return []
    return [(src[i % len(src)], d) for i, d in enumerate(dst)]


def links(events: Iterable[Event], layout: DeviceLayout, t0: float) -> dict[str, list]:
    """Segments from source device to destination device for transfers between devices.

    A segment starts at the transfer's start on the source row and ends at its end on the
    destination row; transfers from the host have no source device and get no segment.
    """
    out = empty(LINK_COLUMNS)
    for e in events:
        if e.kind != "transfer":
            continue
        for s, d in layout.pairs(e.src_devices, e.devices):
            row = {
                "index": e.index, "x0": e.t_start - t0, "x1": e.t_end - t0,
                "y0": layout.row(s) + TRANSFER_OFFSET, "y1": layout.row(d) + TRANSFER_OFFSET,
                "name": e.name, "program": e.program, "client": e.client, "link": e.link or "",
                "status": e.status, "src_device": s, "dst_device": d, "start": e.t_start - t0,
                "duration": e.duration, "nbytes": e.nbytes, "bytes_text": human_bytes(e.nbytes),
                "bw_text": human_rate(e.bandwidth), "c_link": link_color(e.link),
            }
            for k, v in row.items():
                out[k].append(v)
    return out


def tail(columns: dict[str, list], rows: int) -> dict[str, list]:
    """The last ``rows`` rows of ``columns`` (what a rollover of ``rows`` would keep)."""
    return {k: v[-rows:] if rows > 0 else [] for k, v in columns.items()}



def newest(events: Sequence[Event], rows: int,
           layout: DeviceLayout | None = None) -> list[Event]:
    """The shortest suffix of ``events`` that makes at least ``rows`` bars: one per device,
    or, with ``layout``, one per row of it the event is shown on (``layout.shown``: rows
    that group devices, a drill-down that leaves devices out).

    Converting only these is what keeps a 100,000-event history cheap to show: the page
    keeps ``rows`` rows anyway.
    """
    if rows <= 0:
        return []
    # Bars per event, newest first, counted in C (an Event or a Trace.rows tuple alike).
    devices = map(_DEVICES, reversed(events))
    if layout is not None and (layout.groups or layout.partial):
        devices = map(layout.shown, devices)  # fewer bars than devices: count those drawn
    counts = np.fromiter(map(len, devices), np.int64, len(events))
    enough = np.cumsum(counts) >= rows
    start = len(events) - (int(enough.argmax()) + 1 if enough.any() else len(events))
    return list(events[start:])


def length(columns: dict[str, Sequence]) -> int:
    return len(next(iter(columns.values()), []))


def merged_busy(spans: list[tuple[float, float]]) -> float:
    busy, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy


def client_share(events: Iterable[Event]) -> dict[str, float]:
    """Device-seconds of computation per client (a 2-device span of 1 s counts 2 s)."""
    share: dict[str, float] = defaultdict(float)
    for e in events:
        if e.kind == "compute":
            share[e.client] += e.duration * len(e.devices)
    return dict(share)


def transfer_summary(events: Iterable[Event]) -> list[dict]:
    """Per (link, source island, destination island): count, bytes, seconds, bandwidth."""
    groups: dict[tuple, dict] = {}
    for e in events:
        if e.kind != "transfer":
            continue
        g = groups.setdefault((e.link or "", e.src, e.dst), {
            "link": e.link or "", "src": e.src, "dst": e.dst, "count": 0, "nbytes": 0,
            "seconds": 0.0})
        g["count"] += 1
        g["nbytes"] += e.nbytes
        g["seconds"] += max(e.duration, 0.0)
    for g in groups.values():
        g["bandwidth"] = g["nbytes"] / g["seconds"] if g["seconds"] > 0 else None
    return sorted(groups.values(), key=lambda g: (g["link"], str(g["src"]), str(g["dst"])))

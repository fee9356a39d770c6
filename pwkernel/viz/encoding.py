"""Trace events as typed NumPy columns: what the plots stream to the page. NumPy, no Bokeh.

Bokeh sends a NumPy column as one binary buffer, but a Python list value by value, holding
the GIL the dispatch threads need. So every streamed column is numeric: strings (names,
programs, clients, statuses, links) become integer codes into a ``Codebook`` that the page
holds once, and colours become indices into a fixed palette that a colour mapper resolves
in the browser.

Rows are the same as ``columns.rectangles`` / ``columns.links`` (one bar per event and
device; one segment per source/destination pair); ``decode`` turns the codes back.

>>> book = Codebook()
>>> book.code("train"), book.code("ici"), book.names[:3]
(4, 0, ['ici', 'dcn', 'host'])
>>> layout = DeviceLayout.from_islands([(0, (0, 1))])
>>> cols = compute_arrays([], layout, 0.0, book)
>>> cols["index"].dtype.name, len(cols["index"])
('int64', 0)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from itertools import chain, compress

import numpy as np

from ..runtime.trace import Event, getter
from .columns import (
    COMPUTE_OFFSET,
    TRANSFER_OFFSET,
    DeviceLayout,
)
from .palette import COLORS, ColorRegistry

# Links first, at fixed codes 0..3, in every codebook: the link filters and the link colour
# mapper of a figure are built once and must agree with every view's and report's codes.
LINK_NAMES: tuple[str, ...] = ("ici", "dcn", "host", "")
LINK_CODES: dict[str, int] = {name: i for i, name in enumerate(LINK_NAMES)}

# Column name -> dtype. The string columns hold codes; ``c_*`` hold palette indices. A bar's
# start is its ``left`` (a segment's ``x0``): no separate column crosses the wire for it.
# ``instant``: where a bar of no length (left == right) sits, NaN for every other bar; the
# page draws a mark a few pixels wide there (``figures.INSTANT_PX``), since the bar is not.
COMPUTE_ARRAYS: dict[str, type] = {
    "index": np.int64, "y": np.float64, "left": np.float64, "right": np.float64,
    "instant": np.float64,
    "name": np.int32, "program": np.int32, "client": np.int32, "device": np.int32,
    "island": np.int32, "status": np.int32, "duration": np.float64,
    "c_program": np.int32, "c_client": np.int32, "tenant": np.int32, "c_tenant": np.int32,
}
TRANSFER_ARRAYS: dict[str, type] = {
    "index": np.int64, "y": np.float64, "left": np.float64, "right": np.float64,
    "instant": np.float64,
    "name": np.int32, "program": np.int32, "client": np.int32, "device": np.int32,
    "island": np.int32, "link": np.int32, "status": np.int32, "duration": np.float64,
    "nbytes": np.float64, "bandwidth": np.float64,
}
LINK_ARRAYS: dict[str, type] = {
    "index": np.int64, "x0": np.float64, "y0": np.float64, "x1": np.float64,
    "y1": np.float64, "name": np.int32, "program": np.int32, "client": np.int32,
    "link": np.int32, "status": np.int32, "src_device": np.int32, "dst_device": np.int32,
    "duration": np.float64, "nbytes": np.float64, "bandwidth": np.float64,
}
# Which columns hold codebook codes (``decode`` turns these back into strings).
CODED: frozenset[str] = frozenset({"name", "program", "client", "status", "link", "tenant"})
OWN = LINK_CODES[""]  # the ``tenant`` code of this controller's own work (``""``)


class Codebook:
    """An append-only table of strings: each new string gets the next integer code.

    Codes never change while rows use them, so rows streamed earlier stay valid; the page
    needs only the names added since it last looked (``names[k:]``). ``keep`` drops the names
    no row uses any more (a view does, re-coding its rows and names at once).

    >>> book = Codebook(seed=())
    >>> [book.code(s) for s in ("a", "b", "a")], book.decode([1, 0])
    ([0, 1, 0], ['b', 'a'])
    """

    def __init__(self, seed: Iterable[str] = LINK_NAMES):
        self.names: list[str] = []
        self._codes: dict[str, int] = {}
        self._lock = threading.Lock()
        for name in seed:
            self.code(name)
        self._seed = tuple(self.names)  # kept by ``keep`` whatever the rows use

    def code(self, name: str) -> int:
        """The code of ``name``, adding it if new."""
        found = self._codes.get(name)
        if found is None:
            with self._lock:
                found = self._codes.get(name)
                if found is None:
                    found = self._codes[name] = len(self.names)
                    self.names.append(name)
        return found

    def codes(self, names: Sequence[str]) -> np.ndarray:
        """The codes of ``names`` as an int32 array (one C pass when every name is known).

        >>> Codebook(seed=("a",)).codes(["b", "a", "b"]).tolist()
        [1, 0, 1]
        """
        try:
            return np.fromiter(map(self._codes.__getitem__, names), np.int32, len(names))
        except KeyError:  # new names: add them once each, in first-seen order
            for name in dict.fromkeys(names):
                self.code(name)
            return np.fromiter(map(self._codes.__getitem__, names), np.int32, len(names))

    def keep(self, codes: Iterable[int]) -> np.ndarray:
        """Keep only the names of ``codes`` (and the seed), in their order; returns each old
        code's new one (-1: dropped), to re-code the columns that used the old codes.

        >>> book = Codebook(seed=("x",)); _ = [book.code(s) for s in "abc"]
        >>> book.keep([3]).tolist(), book.names
        ([0, -1, -1, 1], ['x', 'c'])
        """
        with self._lock:
            old, seed = self.names, self._seed
            kept = [*seed, *(old[c] for c in sorted(set(map(int, codes))) if c >= len(seed))]
            self.names = kept
            self._codes = {name: i for i, name in enumerate(kept)}
            remap = np.full(len(old), -1, dtype=np.int32)
            for code, name in enumerate(old):
                remap[code] = self._codes.get(name, -1)
            return remap

    def decode(self, codes: Iterable[int]) -> list[str]:
        """The strings of ``codes`` (a column of a coded source)."""
        names = self.names
        try:
            return [names[int(c)] for c in codes]
        except IndexError:
            raise ValueError(f"a code is not in this codebook (it has {len(names)} names); "
                             "decode a column with the codebook that encoded it.") from None

    def __len__(self) -> int:
        return len(self.names)


def empty_arrays(schema: dict[str, type]) -> dict[str, np.ndarray]:
    """Zero-length typed columns: a source that starts empty but typed."""
    return {k: np.zeros(0, dtype=t) for k, t in schema.items()}


def _pack(rows: dict[str, list], schema: dict[str, type]) -> dict[str, np.ndarray]:
    return {k: np.asarray(rows[k], dtype=schema[k]) for k in schema}


def _bandwidth(e: Event) -> float:
    bw = e.bandwidth
    return math.nan if bw is None else float(bw)  # NaN: "unknown", shown as blank


def _row_table(layout: DeviceLayout, devices: list[int]) -> np.ndarray:
    """The y of each device in ``devices``, looked up in one NumPy gather."""
    ids = np.asarray(devices, dtype=np.int64)
    size = max(max(layout.rows, default=-1), int(ids.max(initial=-1))) + 1
    table = np.full(size, np.nan)
    for d, y in layout.rows.items():
        table[d] = y
    ys = table[ids] if len(ids) else np.zeros(0)
    if np.isnan(ys).any():
        layout.row(int(ids[np.isnan(ys)][0]))  # raises the layout's own clear error
    return ys


def _bars(columns: dict[str, Sequence], devices: list[tuple[int, ...]], layout: DeviceLayout,
          offset: float, t0: float, schema: dict[str, type]) -> dict[str, np.ndarray]:
    """Per-event columns repeated once per device (one bar each; one per row when rows
    group devices), plus device and y."""
    if layout.groups or layout.partial:
        devices = [layout.shown(ds) for ds in devices]
    counts = np.fromiter(map(len, devices), dtype=np.int64, count=len(devices))
    flat = list(chain.from_iterable(devices))
    # Most events of a view span slices of one size: a scalar repeat is the cheap path.
    repeat = int(counts[0]) if len(counts) and (counts == counts[0]).all() else counts
    cols = {name: np.repeat(np.asarray(values, dtype=schema.get(name, np.float64)), repeat)
            for name, values in columns.items()}
    left, right = cols.pop("t_start") - t0, cols.pop("t_end") - t0
    cols.update(left=left, right=right, duration=right - left,
                instant=np.where(right == left, left, np.nan),
                device=np.asarray(flat, dtype=np.int32), y=_row_table(layout, flat) + offset)
    return {k: cols[k] for k in schema}


def _column(events: list[Event], field: str) -> list:
    """One field of every event (an Event is a tuple: itemgetter is a C call)."""
    return list(map(getter(field), events))


def _palette_indices(codes: np.ndarray, book: Codebook, colors: ColorRegistry,
                     namespace: str) -> np.ndarray:
    """The palette index of each coded name: one lookup per distinct name, then a gather."""
    distinct = np.unique(codes)
    table = np.zeros(int(distinct[-1]) + 1 if len(distinct) else 0, dtype=np.int32)
    for code in distinct.tolist():
        table[code] = colors.index(namespace, book.names[code])
    return table[codes]


_TENANT = getter("tenant")


def own_and_others(events: list) -> tuple[list, list]:
    """``events`` (``Event`` objects or ``Trace.rows`` tuples) split into this controller's own
    and other tenants' (a shared pool's): a view draws the two apart. One C pass when all are
    its own."""
    if not any(map(_TENANT, events)):
        return events, []
    return ([e for e in events if not _TENANT(e)], [e for e in events if _TENANT(e)])


def compute_arrays(events: Iterable[Event], layout: DeviceLayout, t0: float, book: Codebook,
                   colors: ColorRegistry = COLORS) -> dict[str, np.ndarray]:
    """One bar per (computation, device), as typed columns (transfers are skipped).

    ``c_program`` is the program's palette index (``failed_index`` when the computation did
    not end "ok"), ``c_client`` the client's; a figure's colour mapper turns them into
    the same colours ``colors.color`` gives. ``tenant`` is ``OWN`` for this controller's work
    and codes the tenant's name for another tenant's of a shared pool, ``c_tenant`` that
    tenant's palette index (0 for own work).
    """
    # This runs for every event a live view shows, beside the dispatch threads. It reads only
    # the fields it needs, one column at a time (a C-level map over the events: ~10 ns per
    # value, where transposing whole rows with zip(*events) costs ~25), codes strings through
    # the codebook's dict and colours through one gather, and makes no Python object per
    # event that the garbage collector would track.
    events = events if isinstance(events, list) else list(events)
    kinds = _column(events, "kind")
    if "transfer" in kinds:
        events = list(compress(events, map("transfer".__ne__, kinds)))
    name, program, client, status, tenant = (
        book.codes(_column(events, f)) for f in ("name", "program", "client", "status",
                                                  "tenant"))
    c_tenant = np.zeros(len(events), dtype=np.int32)
    others = tenant != OWN
    if others.any():  # a pool's other tenants: one colour each
        c_tenant[others] = _palette_indices(tenant[others], book, colors, "tenant")
    ok = status == book.code("ok")
    c_program = np.full(len(events), colors.failed_index, dtype=np.int32)
    if ok.any():
        c_program[ok] = _palette_indices(program[ok], book, colors, "program")
    columns = {f: _column(events, f) for f in ("index", "t_start", "t_end", "island")}
    columns.update(name=name, program=program, client=client, status=status,
                   c_program=c_program, tenant=tenant, c_tenant=c_tenant,
                   c_client=_palette_indices(client, book, colors, "client"))
    return _bars(columns, _column(events, "devices"), layout, COMPUTE_OFFSET, t0,
                 COMPUTE_ARRAYS)


def transfer_arrays(events: Iterable[Event], layout: DeviceLayout, t0: float,
                    book: Codebook) -> dict[str, np.ndarray]:
    """One thin bar per (transfer, destination device), as typed columns."""
    code = book.code
    moved = [e for e in events if e.kind == "transfer"]
    rows = [(e.index, e.t_start, e.t_end, code(e.name), code(e.program), code(e.client),
             e.island, code(e.link or ""), code(e.status), float(e.nbytes), _bandwidth(e))
            for e in moved]
    fields = ("index", "t_start", "t_end", "name", "program", "client", "island", "link",
              "status", "nbytes", "bandwidth")
    columns = dict(zip(fields, zip(*rows, strict=True) if rows else [()] * len(fields),
                       strict=True))
    devices = [e.devices for e in moved]
    return _bars(columns, devices, layout, TRANSFER_OFFSET, t0, TRANSFER_ARRAYS)


def link_arrays(events: Iterable[Event], layout: DeviceLayout, t0: float,
                book: Codebook) -> dict[str, np.ndarray]:
    """Source -> destination segments of transfers between devices, as typed columns."""
    rows: dict[str, list] = {k: [] for k in LINK_ARRAYS}
    code = book.code
    for e in events:
        if e.kind != "transfer":
            continue
        for s, d in layout.pairs(e.src_devices, e.devices):
            row = (e.index, e.t_start - t0, layout.row(s) + TRANSFER_OFFSET, e.t_end - t0,
                   layout.row(d) + TRANSFER_OFFSET, code(e.name), code(e.program),
                   code(e.client), code(e.link or ""), code(e.status), s, d, e.duration,
                   float(e.nbytes), _bandwidth(e))
            for k, v in zip(LINK_ARRAYS, row, strict=True):
                rows[k].append(v)
    return _pack(rows, LINK_ARRAYS)


def decode(columns: dict[str, Sequence], book: Codebook) -> dict[str, list]:
    """``columns`` as plain lists, coded columns turned back into strings.

    >>> book = Codebook()
    >>> decode({"link": np.array([1]), "device": np.array([3])}, book)
    {'link': ['dcn'], 'device': [3]}
    """
    return {k: book.decode(v) if k in CODED else np.asarray(v).tolist()
            for k, v in columns.items()}

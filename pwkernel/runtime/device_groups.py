"""How many devices share few rows: one per device while they fit, else per host, per group of
consecutive hosts, or per island. The views' rows (``viz/columns.py``) and the trace export's
tracks (``Trace.save(path, rows=...)``) are both cut by ``device_groups``, so a schedule view
and a Perfetto file of the same run show the same rows.

>>> device_groups([(0, tuple(range(8)))], host_of=lambda d: d // 4, rows="host")
(('host 0', (0, 1, 2, 3)), ('host 1', (4, 5, 6, 7)))
>>> device_groups([(0, (0, 1))], rows="auto")   # two devices fit: a row each
()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ROW_MODES = ("auto", "device", "host", "island")
MAX_ROWS = 64  # rows="auto": one row per device up to this many, then hosts, groups, islands

#: a row holding several devices: its label (``"host 3"``, ``"hosts 0-7"``, ``"all"``) and
#: its devices in order, all of one island
Group = tuple[str, tuple[int, ...]]


def check_rows(rows: Any) -> str:
    """``rows`` if it is one of ``ROW_MODES``, else a ``ValueError`` that names them."""
    if not isinstance(rows, str) or rows not in ROW_MODES:
        raise ValueError(f"rows must be one of {ROW_MODES}, got {rows!r}. Maybe you want "
                         "rows='auto' (per device while they fit, then per host).")
    return rows


def device_groups(islands: Iterable[tuple[int, Sequence[int]]],
                  host_of: Callable[[int], int] | None = None, rows: str = "auto",
                  max_rows: int = MAX_ROWS) -> tuple[Group, ...]:
    """The rows of ``islands`` (``((island_id, (device_id, ...)), ...)``) as groups, or ``()``
    for one row per device. ``rows``: ``"device"``, ``"host"`` (``host_of(device)``; default:
    each device its own host), ``"island"``, or ``"auto"``: per device while they fit in
    ``max_rows`` rows, else per host, else per group of consecutive hosts (as many as fit),
    else per island."""
    check_rows(rows)
    islands = tuple((int(i), tuple(int(d) for d in ds)) for i, ds in islands)
    host_of = host_of or (lambda d: d)
    total = sum(len(ds) for _, ds in islands)
    if rows == "device" or (rows == "auto" and total <= max_rows):
        return ()
    if rows == "island":
        return tuple(("all", ds) for _, ds in islands)
    hosts = [_runs(ds, host_of) for _, ds in islands]
    if rows == "auto" and sum(len(h) for h in hosts) > max_rows:
        if len(islands) >= max_rows:
            return tuple(("all", ds) for _, ds in islands)
        per = max(1, max_rows // max(1, len(islands)))
        hosts = [_blocks(h, per) for h in hosts]
    return tuple(group for hs in hosts for group in hs)


@dataclass(frozen=True, eq=False)
class Topology:
    """A controller's islands and, where known, each device's host: what a trace's export
    needs to group its tracks. ``host_of``: a device id -> host id (None: each device is its
    own host).

    >>> Topology.of([(0, [0, 1, 2, 3])], host_of=[0, 0, 1, 1]).groups("host")
    (('host 0', (0, 1)), ('host 1', (2, 3)))
    """

    islands: tuple[tuple[int, tuple[int, ...]], ...]
    host_of: Callable[[int], int] | None = None

    @classmethod
    def of(cls, islands: Iterable[tuple[int, Sequence[int]]], host_of: Any = None) -> Topology:
        """From ``(island_id, device_ids)`` pairs; ``host_of`` may be a function or anything
        indexable by device id (a list, a NumPy array)."""
        if host_of is not None and not callable(host_of):
            hosts = host_of
            host_of = lambda d: int(hosts[d])  # noqa: E731 (a closure over the table)
        return cls(tuple((int(i), tuple(int(d) for d in ds)) for i, ds in islands), host_of)

    def groups(self, rows: str = "auto", max_rows: int = MAX_ROWS) -> tuple[Group, ...]:
        """``device_groups`` of these islands and hosts."""
        return device_groups(self.islands, self.host_of, rows, max_rows)


def _runs(devices: tuple[int, ...], host_of) -> list[Group]:
    """The devices of one island as rows per host, in order."""
    out: list[tuple[str, list[int]]] = []
    last = None
    for d in devices:
        h = host_of(d)
        if h != last:
            out.append((f"host {h}", []))
            last = h
        out[-1][1].append(d)
    return [(label, tuple(ds)) for label, ds in out]


def _blocks(hosts: list[Group], rows: int) -> list[Group]:
    """Consecutive hosts merged into at most ``rows`` rows of equal size."""
    per = -(-len(hosts) // rows)
    out = []
    for i in range(0, len(hosts), per):
        chunk = hosts[i:i + per]
        first, last = chunk[0][0].split()[-1], chunk[-1][0].split()[-1]
        label = chunk[0][0] if len(chunk) == 1 else f"hosts {first}-{last}"
        out.append((label, tuple(d for _, ds in chunk for d in ds)))
    return out

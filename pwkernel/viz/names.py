"""What a schedule view names, bounded however many programs run: the choices its filters
offer, the names its legend shows, and the codebook of names its page holds.

A notebook's ``%%pathways`` cells are one program each (``cell[N]``), so a view open all day
sees hundreds of programs. The view keeps, per name, the trace index it last saw it at
(``Recent``), and drops a name once its events have left the view's history; what it sends is
bounded by a count: its legend names the ``LEGEND_NAMES`` programs (or clients) used most
recently and counts the others in one entry, its filters offer the ``FILTER_NAMES`` most
recent, newest first (with the ones selected, always), and its codebook keeps only the names
of the rows in the page (``compact``), which hold at most ``max_rows`` rows per source.

>>> names = Recent(limit=2)
>>> names.note(["a", "b", "a", "c"], [1, 2, 3, 4])
>>> names.newest(), names.older
(['c', 'a'], 1)
>>> names.prune(first=3); names.newest(), names.older
(['c', 'a'], 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from operator import itemgetter

import numpy as np

from .encoding import CODED, Codebook

LEGEND_NAMES = 10  # names the legend shows one by one; older ones are one "+ N older" entry
FILTER_NAMES = 50  # names a filter offers (besides those selected), newest first
CODEBOOK_FLOOR = 64  # a codebook this small is never compacted

_SECOND = itemgetter(1)


class Recent:
    """Names in the order they were last seen, each with the trace index it was last seen at.

    ``limit``: how many ``newest`` gives; ``older`` counts the rest (names still in the view's
    events). Memory: one entry per name whose events the view still holds (``prune``)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.last: dict[str, int] = {}

    def note(self, names: Iterable[str], indices: Iterable[int]) -> None:
        """Note events' names with their (growing) trace indices: one C pass, then one step
        per distinct name."""
        batch = dict(zip(names, indices, strict=True))  # each name's last index in the batch
        last = self.last
        for name in batch:
            last.pop(name, None)
        last.update(sorted(batch.items(), key=_SECOND))  # oldest first: the newest at the end

    def prune(self, first: int) -> None:
        """Forget names last seen before trace index ``first`` (their events left the view)."""
        last = self.last
        while last:
            name, index = next(iter(last.items()))
            if index >= first:
                return
            del last[name]

    def newest(self) -> list[str]:
        """The ``limit`` names seen most recently, the newest first."""
        return list(islice(reversed(self.last), self.limit))

    @property
    def older(self) -> int:
        """How many names ``newest`` leaves out."""
        return max(0, len(self.last) - self.limit)

    def shown(self) -> tuple[frozenset[str], int]:
        """What a legend or filter drawn from this shows (redrawn only when it changes)."""
        return frozenset(self.newest()), self.older

    def clear(self) -> None:
        self.last.clear()


def filter_options(recent: Recent, selected: Iterable[str]) -> tuple[str, ...]:
    """A filter's choices: the newest ``recent.limit`` names, newest first, then the selected
    names not among them (a selection stays selectable when its program grows old)."""
    newest = recent.newest()
    offered = set(newest)
    return (*newest, *(n for n in selected if n not in offered))


def codes_in_use(sources) -> np.ndarray:
    """The codebook codes the coded columns of ``sources`` (Bokeh sources) hold, sorted."""
    used = [np.asarray(s.data[k]) for s in sources for k in sorted(CODED) if k in s.data]
    return np.unique(np.concatenate(used)) if used else np.zeros(0, np.int32)


def compact(book: Codebook, sources, lookup) -> int:
    """Keep in ``book`` only the names the rows of ``sources`` use (and the fixed links),
    re-code those rows, and send the page the new rows and names at once (in the caller's
    batch: one message). Returns how many names are left: a view compacts again at twice
    that, so re-sending its rows costs O(1) a new name."""
    used = codes_in_use(sources)
    remap = book.keep(used)
    for source in sources:
        data = dict(source.data)
        source.data = {k: remap[np.asarray(v, dtype=np.int64)] if k in CODED else v
                       for k, v in data.items()}
    lookup.data = {"text": list(book.names)}
    return len(book)

"""Colours: one stable, colour-blind-safe colour per program (and per client).

The palette is Okabe & Ito's eight colours (also Bokeh's ``Colorblind8``), without black, which
is kept for transfers between islands. Colours are handed out in first-seen order from one
process-wide registry, so a program has the same colour in every view and report made by this
kernel.

>>> colors = ColorRegistry()
>>> colors.color("program", "train") == colors.color("program", "train")
True
"""

from __future__ import annotations

import threading

# Okabe-Ito, minus black: orange, sky blue, bluish green, yellow, blue, vermillion, purple.
OKABE_ITO: tuple[str, ...] = (
    "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
)

# Transfers are drawn in neutral tones so they never read as a program's computation.
LINK_COLORS: dict[str, str] = {"ici": "#777777", "dcn": "#000000", "host": "#BBBBBB"}
UNKNOWN_LINK_COLOR = "#999999"
FAILED_COLOR = "#D3D3D3"  # a failed or cancelled computation: grey, whatever its program


class ColorRegistry:
    """Maps (namespace, key) to a palette colour; the first key seen gets the first colour.

    After ``len(palette)`` keys the colours repeat (each new key takes the next one, so the
    newest ``len(palette)`` keys differ); a view's legend still names each key. The registry
    is bounded: it keeps the keys used within the last ``limit // 2`` new keys of their
    namespace at least, up to ``limit``, and forgets the rest (a notebook's cells are one
    program each: a day of them must not pile up). A key forgotten and seen again takes the
    next colour, as a new one; a key in use keeps its colour.

    >>> reg = ColorRegistry(("#000", "#fff"), limit=4)
    >>> [reg.index("program", k) for k in "abcdefa"]
    [0, 1, 0, 1, 0, 1, 0]
    >>> len(reg.assigned("program")) <= 4
    True
    """

    def __init__(self, palette: tuple[str, ...] = OKABE_ITO, limit: int = 4096):
        if not palette:
            raise ValueError("a ColorRegistry needs at least one colour, got an empty palette.")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
            raise ValueError(f"a ColorRegistry's limit must be an int >= 2, got {limit!r}.")
        self.palette = tuple(palette)
        self.limit = limit
        # Two generations per namespace: keys used lately, and those of the generation before
        # (kept while still used; forgotten when the young one fills up again).
        self._young: dict[str, dict[str, int]] = {}
        self._old: dict[str, dict[str, int]] = {}
        self._serial: dict[str, int] = {}  # keys handed a colour so far, per namespace
        self._lock = threading.Lock()

    def color(self, namespace: str, key: str) -> str:
        """The colour of ``key`` in ``namespace`` ("program" or "client")."""
        return self.palette[self.index(namespace, key)]

    def index(self, namespace: str, key: str) -> int:
        """The position of ``key``'s colour in ``palette`` (what a plot's colour mapper
        resolves in the browser, so columns stay numeric).

        >>> ColorRegistry(("#000", "#fff")).index("program", "a")
        0
        """
        table = self._young.get(namespace)
        found = None if table is None else table.get(key)  # the common case takes no lock
        if found is None:
            with self._lock:
                table = self._young.setdefault(namespace, {})
                found = table.get(key)
                if found is None:
                    found = self._old.get(namespace, {}).pop(key, None)
                    if found is None:  # a new key: the next colour
                        serial = self._serial.get(namespace, 0)
                        self._serial[namespace] = serial + 1
                        found = serial % len(self.palette)
                    if len(table) >= self.limit // 2:  # the young generation grows old
                        self._old[namespace], table = table, {}
                        self._young[namespace] = table
                    table[key] = found
        return found

    @property
    def failed_index(self) -> int:
        """The index of ``FAILED_COLOR`` in ``mapper_palette``: one past the palette."""
        return len(self.palette)

    @property
    def mapper_palette(self) -> tuple[str, ...]:
        """``palette`` plus ``FAILED_COLOR``: what a colour mapper over ``index`` draws."""
        return (*self.palette, FAILED_COLOR)

    def assigned(self, namespace: str) -> dict[str, str]:
        """A copy of the colours ``namespace``'s keys have now (the registry's bounded table),
        the least recently handed out first."""
        with self._lock:
            both = {**self._old.get(namespace, {}), **self._young.get(namespace, {})}
            return {k: self.palette[i] for k, i in both.items()}


# One registry per process: every ScheduleView, TopologyView and report agrees on colours.
COLORS = ColorRegistry()


def link_color(link: str | None) -> str:
    return LINK_COLORS.get(link or "", UNKNOWN_LINK_COLOR)

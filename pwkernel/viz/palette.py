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

    After ``len(palette)`` keys the colours repeat; a view's legend still names each key.
    """

    def __init__(self, palette: tuple[str, ...] = OKABE_ITO):
        if not palette:
            raise ValueError("a ColorRegistry needs at least one colour, got an empty palette.")
        self.palette = tuple(palette)
        self._assigned: dict[str, dict[str, str]] = {}
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
        table = self._assigned.get(namespace)
        found = None if table is None else table.get(key)  # the common case takes no lock
        if found is None:
            with self._lock:
                table = self._assigned.setdefault(namespace, {})
                found = table.get(key)
                if found is None:
                    found = table[key] = len(table) % len(self.palette)
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
        """A copy of the colours handed out so far in ``namespace``, in first-seen order."""
        with self._lock:
            return {k: self.palette[i] for k, i in self._assigned.get(namespace, {}).items()}


# One registry per process: every ScheduleView, TopologyView and report agrees on colours.
COLORS = ColorRegistry()


def link_color(link: str | None) -> str:
    return LINK_COLORS.get(link or "", UNKNOWN_LINK_COLOR)

"""How the package writes sizes, times and device lists for people: one rule each, used by
the runtime's errors, the notebook's displays and the views (``viz/figures.py`` repeats the
byte rule in JavaScript for the hover text, and the sidebar in TypeScript)."""

from __future__ import annotations

from collections.abc import Iterable


def human_bytes(n: float) -> str:
    """``512 -> '512 B'``, ``1536 -> '1.5 KiB'``, up to GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_seconds(seconds: float) -> str:
    """``0.0123 -> '12.3 ms'``; ten seconds and more in seconds."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def device_ids(ids: Iterable[int]) -> str:
    """A run of three or more consecutive ids as ``[0-3]``, else the list: ``[0, 2]``."""
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"[{ids[0]}-{ids[-1]}]"
    return str(list(ids))

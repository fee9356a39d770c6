"""A picture of how an array is laid out: its blocks, and which device of which island holds each.

``blocks`` is pure: it reads the sharding's own map of devices to index ranges and groups
devices that hold the same block (replication). ``sharding_html`` draws them: a strip for a
1-D array, a grid for a 2-D array (sizes proportional to the block extents), a table of blocks
for higher ranks. Each block is coloured by the device holding it (the first, when several
do) and names every holder as ``i<island>:d<device>``.

>>> html = sharding_html((8, 4), x.sharding, island_of={0: 0, 1: 0})   # doctest: +SKIP
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Light tints, so the dark labels stay readable; a device keeps its colour in every picture.
DEVICE_COLORS: tuple[str, ...] = (
    "#F6D28B", "#A9D8F5", "#8FD6C0", "#F7F19E", "#8FB9DE", "#F2AE85", "#E7B7D3", "#C9C9C9",
    "#D9C2F0", "#B8E0A0", "#F5B8B8", "#B0E0E6",
)
MAX_ROWS = 16  # blocks listed for arrays of rank 3 and more
_BOX = 'display:inline-block;font-family:monospace;font-size:11px'


@dataclass(frozen=True, order=True)
class Block:
    """One region of the array: ``[start, stop)`` per dimension, and the devices holding it."""

    index: tuple[tuple[int, int], ...]
    devices: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)


def _bounds(part: Any, size: int) -> tuple[int, int]:
    start, stop, _ = part.indices(size) if isinstance(part, slice) else (part, part + 1, 1)
    return int(start), int(stop)


def blocks(shape: Sequence[int], sharding: Any) -> list[Block]:
    """The distinct blocks of an array of ``shape`` laid out by ``sharding``, in index order."""
    shape = tuple(int(n) for n in shape)
    held: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        key = tuple(_bounds(part, n) for part, n in zip(index, shape, strict=True))
        held.setdefault(key, []).append(device.id)
    return sorted(Block(key, tuple(sorted(ids))) for key, ids in held.items())


def device_color(device: int) -> str:
    return DEVICE_COLORS[device % len(DEVICE_COLORS)]


def device_label(device: int, island_of: Mapping[int, int] | None = None) -> str:
    """``"i0:d3"`` (device 3 of island 0), or ``"d3"`` when the island is not known."""
    island = None if island_of is None else island_of.get(device)
    return f"d{device}" if island is None else f"i{island}:d{device}"


def block_label(block: Block, island_of: Mapping[int, int] | None = None) -> str:
    """Every holder of ``block``: ``"i0:d0 i0:d1"``."""
    return " ".join(device_label(d, island_of) for d in block.devices)


def _ranges(block: Block) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in block.index) + "]"


def _cell(block: Block, island_of, style: str) -> str:
    label = html.escape(block_label(block, island_of))
    tip = html.escape(f"{_ranges(block)} on {label}")
    return (f'<div title="{tip}" style="{style};background:{device_color(block.devices[0])};'
            'border:1px solid #fff;box-sizing:border-box;overflow:hidden;display:flex;'
            'align-items:center;justify-content:center;text-align:center;padding:1px;'
            f'line-height:1.1">{label}</div>')


def _fractions(edges: list[int]) -> str:
    return " ".join(f"{max(1, b - a)}fr" for a, b in zip(edges, edges[1:], strict=False))


def _grid(found: list[Block], shape: tuple[int, ...], island_of) -> str:
    """A CSS grid whose tracks follow the blocks' edges, so sizes are proportional."""
    # A 1-D array is drawn as one row of a 2-D grid.
    boxes = [((0, 1), *b.index) if len(shape) == 1 else b.index for b in found]
    shape = (1, *shape) if len(shape) == 1 else shape
    rows = sorted({e for box in boxes for e in box[0]} | {0, shape[0]})
    cols = sorted({e for box in boxes for e in box[1]} | {0, shape[1]})
    height = min(240, max(28, 28 * (len(rows) - 1)))
    width = min(480, max(120, 60 * (len(cols) - 1)))
    cells = []
    for b, ((r0, r1), (c0, c1)) in zip(found, boxes, strict=True):
        place = (f"grid-row:{rows.index(r0) + 1}/{rows.index(r1) + 1};"
                 f"grid-column:{cols.index(c0) + 1}/{cols.index(c1) + 1}")
        cells.append(_cell(b, island_of, place))
    return (f'<div style="display:grid;grid-template-rows:{_fractions(rows)};'
            f'grid-template-columns:{_fractions(cols)};width:{width}px;height:{height}px;'
            f'font-family:monospace;font-size:11px">{"".join(cells)}</div>')


def _listing(found: list[Block], island_of) -> str:
    rows = "".join(
        f'<tr><td style="padding:1px 6px">{html.escape(_ranges(b))}</td>'
        f'<td style="padding:1px 6px;background:{device_color(b.devices[0])}">'
        f'{html.escape(block_label(b, island_of))}</td></tr>' for b in found[:MAX_ROWS])
    more = (f'<tr><td colspan="2" style="padding:1px 6px">... {len(found) - MAX_ROWS} more '
            'blocks</td></tr>' if len(found) > MAX_ROWS else "")
    return (f'<table style="border-collapse:collapse;{_BOX}"><tr><th style="text-align:left">'
            f'block</th><th style="text-align:left">held by</th></tr>{rows}{more}</table>')


def summary(shape: Sequence[int], sharding: Any) -> str:
    """``"8 blocks of 2x2, each on 1 device"`` (blocks of unequal shapes: their count)."""
    found = blocks(shape, sharding)
    shapes = {b.shape for b in found}
    copies = {len(b.devices) for b in found}
    what = ("x".join(map(str, next(iter(shapes)))) or "one value") if len(shapes) == 1 \
        else "unequal shapes"
    held = (f"each on {next(iter(copies))} device{'s' if max(copies) > 1 else ''}"
            if len(copies) == 1 else "held by different numbers of devices")
    return f"{len(found)} block{'s' if len(found) != 1 else ''} of {what}, {held}"


def sharding_html(shape: Sequence[int], sharding: Any,
                  island_of: Mapping[int, int] | None = None) -> str:
    """The picture of an array of ``shape`` laid out by ``sharding``, as HTML."""
    shape = tuple(int(n) for n in shape)
    found = blocks(shape, sharding)
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    over = ""
    if mesh is not None and getattr(mesh, "shape", None):
        over = " over " + ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
    head = (f"{'x'.join(map(str, shape)) or 'scalar'} laid out as "
            f"{spec if spec is not None else type(sharding).__name__}{over}: "
            f"{summary(shape, sharding)}")
    body = _grid(found, shape, island_of) if 1 <= len(shape) <= 2 and math.prod(shape) else \
        _listing(found, island_of)
    return (f'<div class="pw-sharding" style="margin:4px 0"><div style="{_BOX};color:#555;'
            f'margin-bottom:2px">{html.escape(head)}</div>{body}</div>')

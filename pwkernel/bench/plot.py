"""A PNG of the dispatch benchmark like the paper's figure, drawn with Pillow.

One panel per slice size; x: a computation's own run time (log scale), y: computation steps
per second (log scale); one line per variant. No smoothing, no fitted curves: the medians as
measured, joined by straight lines.

>>> from pwkernel.bench.plot import dispatch_png
>>> dispatch_png(result.to_dict(), "dispatch.png")      # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

COLORS = {"pw_opbyop": (214, 39, 40), "jax_opbyop": (255, 152, 150),
          "pw_chained": (31, 119, 180), "pw_fused": (44, 160, 44), "jax_fused": (152, 223, 138)}
PANEL_W, PANEL_H, MARGIN = 360, 300, 60
LEGEND_STEP = 110  # px per variant in the legend under the panels


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _fmt(v: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"


def dispatch_png(result: dict[str, Any], path: str | Path) -> Path:
    """Draw ``result`` (the dispatch benchmark's dict) to ``path``; returns the path."""
    rows = result.get("rows") or []
    if result.get("name") != "dispatch" or not rows:
        raise ValueError("dispatch_png needs the dispatch benchmark's result (name 'dispatch', "
                         f"with rows); got name {result.get('name')!r} with {len(rows)} rows.")
    slices = sorted({r["devices"] for r in rows})
    xs = [r["computation_us"] for r in rows]
    ys = [s["median"] for r in rows for s in r["steps_per_s"].values()]
    xlo, xhi = min(xs) / 1.5, max(xs) * 1.5
    ylo, yhi = min(ys) / 1.5, max(ys) * 1.5
    # as wide as the legend too: one panel (``--islands 1``) is narrower than five entries
    width = max(MARGIN + len(slices) * (PANEL_W + MARGIN), MARGIN + len(COLORS) * LEGEND_STEP)
    img = Image.new("RGB", (width, PANEL_H + 2 * MARGIN + 40), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()

    def to_px(x: float, y: float, left: int) -> tuple[float, float]:
        fx = (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))
        fy = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
        return left + fx * PANEL_W, MARGIN + (1 - fy) * PANEL_H

    for i, devices in enumerate(slices):
        left = MARGIN + i * (PANEL_W + MARGIN)
        draw.rectangle([left, MARGIN, left + PANEL_W, MARGIN + PANEL_H], outline="black")
        draw.text((left, MARGIN - 18), f"{devices}-device slice", fill="black", font=font)
        for t in _log_ticks(xlo, xhi):
            if xlo <= t <= xhi:
                px, _ = to_px(t, ylo, left)
                draw.line([px, MARGIN + PANEL_H, px, MARGIN + PANEL_H + 4], fill="black")
                draw.text((px - 8, MARGIN + PANEL_H + 6), _fmt(t), fill="black", font=font)
        for t in _log_ticks(ylo, yhi):
            if ylo <= t <= yhi:
                _, py = to_px(xlo, t, left)
                draw.line([left - 4, py, left + PANEL_W, py], fill=(225, 225, 225))
                draw.text((left - 34, py - 5), _fmt(t), fill="black", font=font)
        mine = sorted((r for r in rows if r["devices"] == devices),
                      key=lambda r: r["computation_us"])
        for variant, color in COLORS.items():
            points = [to_px(r["computation_us"], r["steps_per_s"][variant]["median"], left)
                      for r in mine]
            if len(points) > 1:
                draw.line(points, fill=color, width=2)
            for px, py in points:
                draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=color)
        draw.text((left + PANEL_W // 2 - 70, MARGIN + PANEL_H + 22),
                  "computation time (us, log)", fill="black", font=font)
    draw.text((4, 4), "steps per second (log) vs computation size", fill="black", font=font)
    lx = MARGIN
    for variant, color in COLORS.items():
        draw.rectangle([lx, PANEL_H + MARGIN + 42, lx + 12, PANEL_H + MARGIN + 52], fill=color)
        draw.text((lx + 16, PANEL_H + MARGIN + 41), variant, fill="black", font=font)
        lx += LEGEND_STEP
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, "PNG")
    return path

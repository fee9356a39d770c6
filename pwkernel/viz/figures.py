"""Bokeh figures shared by the live views and the static report. Pure Bokeh: no widgets.

The schedule figure draws three sources made by ``columns``: computation bars, transfer bars
(thin strip on the destination device row) and link segments (source device -> destination
device; DCN dashed and black, ICI solid and grey).
"""

from __future__ import annotations

from bokeh.models import (
    BoxAnnotation,
    CDSView,
    ColumnDataSource,
    FixedTicker,
    GroupFilter,
    HoverTool,
    Range1d,
)
from bokeh.plotting import figure

from .columns import COMPUTE_HEIGHT, TRANSFER_HEIGHT, DeviceLayout

COLOR_FIELDS = {"program": "c_program", "client": "c_client"}

_COMMON_TIPS = [("name", "@name"), ("program", "@program"), ("client", "@client"),
                ("start", "@start{0.000000} s"), ("duration", "@duration{0.000000} s")]


def color_field(color_by: str) -> str:
    try:
        return COLOR_FIELDS[color_by]
    except KeyError:
        raise ValueError(f"color_by must be one of {sorted(COLOR_FIELDS)}, got {color_by!r}."
                         ) from None


def schedule_figure(layout: DeviceLayout, bars: ColumnDataSource, transfers: ColumnDataSource,
                    segments: ColumnDataSource, color_by: str = "program",
                    title: str = "Gang schedule", x_range: Range1d | None = None,
                    height: int | None = None):
    """A Gantt chart: one row per device, grouped by island. Returns the figure.

    The figure's glyph renderers are named ``compute``, ``transfers``, ``ici-links`` and
    ``dcn-links``; switch colouring with ``set_color_by(fig, "client")``.
    """
    low, high = layout.extent
    rows = len(layout.rows)
    fig = figure(title=title, height=height or max(220, 60 + 34 * rows),
                 sizing_mode="stretch_width", x_range=x_range or Range1d(0.0, 1.0),
                 y_range=Range1d(high, low),  # flipped: device 0 on top
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_drag="xpan",
                 active_scroll="xwheel_zoom", x_axis_label="seconds since the first event",
                 output_backend="canvas")
    fig.yaxis.ticker = FixedTicker(ticks=sorted(layout.rows.values()))
    fig.yaxis.major_label_overrides = {float(y): s for y, s in layout.labels.items()}
    fig.ygrid.grid_line_color = None
    for n, (island, devices) in enumerate(layout.islands):
        if not devices:
            continue
        first, last = layout.island_span(island)
        fig.add_layout(BoxAnnotation(top=first - 0.48, bottom=last + 0.48, level="underlay",
                                     fill_color="#F4F4F4" if n % 2 == 0 else "#FFFFFF",
                                     fill_alpha=1.0, line_color=None))
    compute = fig.hbar(y="y", left="left", right="right", height=COMPUTE_HEIGHT, source=bars,
                       fill_color=color_field(color_by), line_color="#333333",
                       line_width=0.5, name="compute")
    moved = fig.hbar(y="y", left="left", right="right", height=TRANSFER_HEIGHT,
                     source=transfers, fill_color="c_link", line_color="c_link",
                     hatch_pattern="right_diagonal_line", hatch_color="white",
                     hatch_alpha=0.6, name="transfers")
    ici = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=segments,
                      view=CDSView(filter=GroupFilter(column_name="link", group="ici")),
                      line_color="#777777", line_width=1, line_alpha=0.6, name="ici-links")
    dcn = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=segments,
                      view=CDSView(filter=GroupFilter(column_name="link", group="dcn")),
                      line_color="#000000", line_width=1, line_alpha=0.6, line_dash="dashed",
                      name="dcn-links")
    fig.add_tools(HoverTool(renderers=[compute], tooltips=[
        *_COMMON_TIPS, ("device", "@device (island @island)"), ("status", "@status")]))
    transfer_tips = [*_COMMON_TIPS, ("link", "@link"), ("bytes", "@bytes_text"),
                     ("bandwidth", "@bw_text"), ("status", "@status")]
    fig.add_tools(HoverTool(renderers=[moved], tooltips=[
        *transfer_tips, ("to device", "@device (island @island)")]))
    fig.add_tools(HoverTool(renderers=[ici, dcn], line_policy="interp", tooltips=[
        *transfer_tips, ("devices", "@src_device → @dst_device")]))
    return fig


def set_color_by(fig, color_by: str) -> None:
    """Colour the computation bars of a ``schedule_figure`` by program or by client."""
    name = color_field(color_by)
    renderer = fig.select_one({"name": "compute"})
    renderer.glyph.fill_color = name


def legend_html(colors: dict[str, str], title: str) -> str:
    """Small HTML swatches: a legend that costs nothing in the plot."""
    items = "".join(
        f'<span style="margin-right:10px;white-space:nowrap"><span style="display:inline-block;'
        f'width:11px;height:11px;background:{c};border:1px solid #333;margin-right:3px;'
        f'vertical-align:middle"></span>{_escape(k)}</span>' for k, c in colors.items())
    links = ('<span style="margin-left:8px;white-space:nowrap">transfers: '
             '<b style="color:#777">━ ICI</b> <b style="color:#000">╍ DCN</b> '
             '<b style="color:#BBB">▬ host</b></span>')
    return f'<div style="font-size:12px"><b>{_escape(title)}:</b> {items}{links}</div>'


def _escape(text: str) -> str:
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))

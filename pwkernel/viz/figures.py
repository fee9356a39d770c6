"""Bokeh figures shared by the live views and the static report. Pure Bokeh: no widgets.

The schedule figure draws three sources made by ``columns``: computation bars, transfer bars
(thin strip on the destination device row) and link segments (source device -> destination
device; DCN dashed and black, ICI solid and grey).
"""

from __future__ import annotations

import numpy as np
from bokeh.models import (
    BoxAnnotation,
    CDSView,
    ColumnDataSource,
    CustomJS,
    CustomJSFilter,
    CustomJSHover,
    FixedTicker,
    HoverTool,
    LinearColorMapper,
    Range1d,
)
from bokeh.plotting import figure
from bokeh.transform import transform

from .columns import COMPUTE_HEIGHT, TRANSFER_HEIGHT, DeviceLayout
from .encoding import LINK_CODES, LINK_NAMES
from .palette import COLORS, LINK_COLORS, UNKNOWN_LINK_COLOR, ColorRegistry

COLOR_FIELDS = {"program": "c_program", "client": "c_client"}

# Hover text is made in the browser: coded columns are looked up in the page's copy of the
# codebook (a one-column source, ``text``, that grows only when a new name appears).
_LOOKUP_JS = """
const text = names.get_column("text");
return text != null && value >= 0 && value < text.length ? String(text[value]) : String(value);
"""
# The same rule as ``runtime.units.human_bytes``; NaN (unknown bandwidth) shows as blank.
_BYTES_JS = """
if (value == null || Number.isNaN(value)) return "";
const units = ["B", "KiB", "MiB", "GiB"];
let v = value, i = 0;
while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
return (i == 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i] + suffix;
"""
# Keep the rows of one link kind: GroupFilter compares strings, the column holds codes.
_LINK_FILTER_JS = """
const links = source.get_column("link");
const keep = [];
if (links != null) for (let i = 0; i < links.length; i++) if (links[i] == code) keep.push(i);
return keep;
"""
_CODED = ("name", "program", "client", "status", "link", "tenant")


def names_source(names: list[str] | None = None) -> ColumnDataSource:
    """The page's copy of a ``Codebook``: row k is the string of code k."""
    return ColumnDataSource({"text": list(names or [])}, name="pw-schedule-names")


def _color_mapper(colors: ColorRegistry) -> LinearColorMapper:
    # Integer index k falls in [k - 0.5, k + 0.5): exact whatever the float rounding.
    palette = list(colors.mapper_palette)
    return LinearColorMapper(palette=palette, low=-0.5, high=len(palette) - 0.5)


def _link_mapper() -> LinearColorMapper:
    palette = [LINK_COLORS.get(n, UNKNOWN_LINK_COLOR) for n in LINK_NAMES]
    return LinearColorMapper(palette=palette, low=-0.5, high=len(palette) - 0.5,
                             high_color=UNKNOWN_LINK_COLOR)


def _formatters(names: ColumnDataSource) -> dict[str, CustomJSHover]:
    lookup = CustomJSHover(args={"names": names}, code=_LOOKUP_JS)
    return {**{f"@{c}": lookup for c in _CODED},
            "@nbytes": CustomJSHover(args={"suffix": ""}, code=_BYTES_JS),
            "@bandwidth": CustomJSHover(args={"suffix": "/s"}, code=_BYTES_JS)}


_NAME_TIPS = [("name", "@name{custom}"), ("program", "@program{custom}"),
              ("client", "@client{custom}")]
_BAR_TIPS = [*_NAME_TIPS, ("start", "@left{0.000000} s"), ("duration", "@duration{0.000000} s")]
_SEGMENT_TIPS = [*_NAME_TIPS, ("start", "@x0{0.000000} s"),
                 ("duration", "@duration{0.000000} s")]


def color_field(color_by: str) -> str:
    try:
        return COLOR_FIELDS[color_by]
    except KeyError:
        raise ValueError(f"color_by must be one of {sorted(COLOR_FIELDS)}, got {color_by!r}."
                         ) from None


def _link_view(link: str) -> CDSView:
    return CDSView(filter=CustomJSFilter(args={"code": LINK_CODES[link]}, code=_LINK_FILTER_JS))


DENSE_PX = 2.0
# A bar of no length (a computation that started and ended at once: 2-4 % of a real trace)
# would draw nothing and could not be hovered. Its ``instant`` (NaN for every other bar) gets
# a mark this many pixels wide, whatever the zoom, on the renderer ``<bars>-instants``.
INSTANT_PX = 3
ASSUMED_WIDTH = 1000  # px of plot a page usually gives a stretched figure, before it is drawn
_DENSE_JS = """
const left = bars.data.left, right = bars.data.right;
const lo = fig.x_range.start, hi = fig.x_range.end;
let n = 0;
for (let i = 0; i < left.length; i++) {
  if (right[i] >= lo && left[i] <= hi) n++;
}
const width = fig.inner_width || fig.width || 600;
const dense = n * min_px > width * rows;
for (const r of links) {
  if (r.visible === dense) r.visible = !dense;
}
"""


def _instants(fig, bars, height: float):
    """The mark of each bar of no length of ``bars`` (a bar renderer): ``INSTANT_PX`` pixels
    wide at its ``instant``, styled as the bar; other bars' NaN draws nothing there."""
    glyph = bars.glyph
    return fig.rect(x="instant", y="y", width=INSTANT_PX, width_units="screen", height=height,
                    source=bars.data_source, fill_color=glyph.fill_color,
                    line_color=glyph.line_color, fill_alpha=glyph.fill_alpha,
                    line_width=glyph.line_width, name=f"{bars.name}-instants")


def schedule_figure(layout: DeviceLayout, bars: ColumnDataSource, transfers: ColumnDataSource,
                    segments: ColumnDataSource, names: ColumnDataSource,
                    color_by: str = "program", title: str = "Gang schedule",
                    x_range: Range1d | None = None, height: int | None = None,
                    colors: ColorRegistry = COLORS, others: ColumnDataSource | None = None):
    """A Gantt chart: one row per device, grouped by island. Returns the figure.

    The sources hold the typed columns of ``encoding`` (``compute_arrays``,
    ``transfer_arrays``, ``link_arrays``); ``names`` is the page's copy of their codebook
    (``names_source``), which the hover tooltips read names from. The figure's glyph
    renderers are named ``compute``, ``transfers``, ``ici-links`` and ``dcn-links`` (and
    ``compute-instants``, ``transfers-instants``: the marks of bars of no length); switch
    colouring with ``set_color_by(fig, "client")``. ``others``: a shared pool's other tenants'
    computations (``compute_arrays`` too), drawn lighter and hatched on the same rows, coloured
    by tenant (``c_tenant``), as the renderer ``others`` (and ``others-instants``).
    """
    low, high = layout.extent
    rows = layout.n_rows
    fig = figure(title=title, height=height or max(220, 60 + 34 * rows),
                 sizing_mode="stretch_width", x_range=x_range or Range1d(0.0, 1.0),
                 y_range=Range1d(high, low),  # flipped: device 0 on top
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_drag="xpan",
                 active_scroll="xwheel_zoom", x_axis_label="seconds since the first event",
                 output_backend="canvas")
    fig.yaxis.ticker = FixedTicker(ticks=sorted(layout.labels))
    fig.yaxis.major_label_overrides = {float(y): s for y, s in layout.labels.items()}
    fig.ygrid.grid_line_color = None
    for n, (island, devices) in enumerate(layout.islands):
        if not devices:
            continue
        first, last = layout.island_span(island)
        fig.add_layout(BoxAnnotation(top=first - 0.48, bottom=last + 0.48, level="underlay",
                                     fill_color="#F4F4F4" if n % 2 == 0 else "#FFFFFF",
                                     fill_alpha=1.0, line_color=None))
    # A bar's outline is its own colour: zoomed out, thousands of bars narrower than a pixel
    # draw little but outline, and a dark one would turn busy rows black. Bars stay apart
    # by the gaps between them (the row's background).
    color = transform(color_field(color_by), _color_mapper(colors))
    compute = fig.hbar(y="y", left="left", right="right", height=COMPUTE_HEIGHT, source=bars,
                       fill_color=color, line_color=color, line_width=0.5, name="compute")
    computes = [compute, _instants(fig, compute, COMPUTE_HEIGHT)]
    theirs = []
    if others is not None:
        tenant = transform("c_tenant", _color_mapper(colors))
        hatched = fig.hbar(y="y", left="left", right="right", height=COMPUTE_HEIGHT,
                           source=others, fill_color=tenant, line_color=tenant, fill_alpha=0.5,
                           line_width=0.5, hatch_pattern="left_diagonal_line",
                           hatch_color="white", hatch_alpha=0.7, name="others")
        theirs = [hatched, _instants(fig, hatched, COMPUTE_HEIGHT)]
    link_color = transform("link", _link_mapper())
    strip = fig.hbar(y="y", left="left", right="right", height=TRANSFER_HEIGHT,
                     source=transfers, fill_color=link_color, line_color=link_color,
                     hatch_pattern="right_diagonal_line", hatch_color="white",
                     hatch_alpha=0.6, name="transfers")
    moved = [strip, _instants(fig, strip, TRANSFER_HEIGHT)]
    ici = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=segments,
                      view=_link_view("ici"), line_color="#777777", line_width=1,
                      line_alpha=0.6, name="ici-links")
    dcn = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=segments,
                      view=_link_view("dcn"), line_color="#000000", line_width=1,
                      line_alpha=0.6, line_dash="dashed", name="dcn-links")
    # Zoomed out, transfers and the links between islands would hatch every row black: drawn
    # only while the bars in view are DENSE_PX pixels wide or more on average. Decided in the
    # page when it first lays the plot out (``inner_width`` is set then: a report or a view
    # opening on many bars hides them at load) and on every zoom, pan and stream, so zooming
    # with the mouse is covered too; the figure starts with the same decision made here for
    # a typical width.
    hide = CustomJS(args=dict(bars=bars, fig=fig, links=[*moved, ici, dcn], rows=max(1, rows),
                              min_px=DENSE_PX), code=_DENSE_JS)
    fig.x_range.js_on_change("start", hide)
    fig.x_range.js_on_change("end", hide)
    fig.js_on_change("inner_width", hide)
    bars.js_on_change("streaming", hide)
    bars.js_on_change("data", hide)
    for renderer in (*moved, ici, dcn):
        renderer.visible = not dense(bars.data, fig.x_range, rows)
    formatters = _formatters(names)
    fig.add_tools(HoverTool(renderers=computes, formatters=formatters, tooltips=[
        *_BAR_TIPS, ("device", "@device (island @island)"), ("status", "@status{custom}")]))
    if others is not None:
        fig.add_tools(HoverTool(renderers=theirs, formatters=formatters, tooltips=[
            ("tenant", "@tenant{custom}"), *_BAR_TIPS, ("device", "@device (island @island)"),
            ("status", "@status{custom}")]))
    transfer_tips = [("link", "@link{custom}"), ("bytes", "@nbytes{custom}"),
                     ("bandwidth", "@bandwidth{custom}"), ("status", "@status{custom}")]
    fig.add_tools(HoverTool(renderers=moved, formatters=formatters, tooltips=[
        *_BAR_TIPS, *transfer_tips, ("to device", "@device (island @island)")]))
    fig.add_tools(HoverTool(renderers=[ici, dcn], line_policy="interp", formatters=formatters,
                            tooltips=[*_SEGMENT_TIPS, *transfer_tips,
                                      ("devices", "@src_device → @dst_device")]))
    return fig


def dense(bars: dict, x_range: Range1d, rows: int, width: float = ASSUMED_WIDTH) -> bool:
    """Whether the bars in view are narrower than ``DENSE_PX`` pixels on average at
    ``width`` pixels: the page's rule (``_DENSE_JS``) for hiding transfers and links.

    >>> dense({"left": [0.0] * 2000, "right": [1.0] * 2000}, Range1d(0, 1), rows=1)
    True
    """
    left, right = np.asarray(bars.get("left", ())), np.asarray(bars.get("right", ()))
    if not len(left):
        return False
    n = int(np.count_nonzero((right >= x_range.start) & (left <= x_range.end)))
    return n * DENSE_PX > width * max(1, rows)


def set_color_by(fig, color_by: str) -> None:
    """Colour the computation bars of a ``schedule_figure`` by program or by client."""
    name = color_field(color_by)
    for renderer in ("compute", "compute-instants"):
        glyph = fig.select_one({"name": renderer}).glyph
        # Same colour mapper, other index column: nothing but the field name goes to the page.
        glyph.fill_color = glyph.line_color = transform(name, glyph.fill_color.transform)


def _swatches(colors: dict[str, str], hatched: bool = False, older: int = 0,
              what: str = "") -> str:
    # a hatched swatch: the colour at the others' alpha, crossed by white lines like their bars
    fill = ("background:repeating-linear-gradient(45deg,{c}80 0 3px,#fff 3px 4px)" if hatched
            else "background:{c}")
    more = (f'<span class="pw-legend-older" style="margin-right:10px;white-space:nowrap;'
            f'color:#555">+ {older} older {_escape(what)}{"s" if older != 1 else ""} (hover a '
            'bar for its name)</span>') if older else ""
    return "".join(
        f'<span style="margin-right:10px;white-space:nowrap"><span style="display:inline-block;'
        f'width:11px;height:11px;{fill.format(c=c)};border:1px solid #333;margin-right:3px;'
        f'vertical-align:middle"></span>{_escape(k)}</span>' for k, c in colors.items()) + more


def legend_html(colors: dict[str, str], title: str,
                tenants: dict[str, str] | None = None, older: int = 0,
                older_tenants: int = 0) -> str:
    """Small HTML swatches: a legend that costs nothing in the plot. ``tenants``: a shared
    pool's other tenants whose work is shown (hatched), each with its colour. ``older``
    (``older_tenants``): how many more names are shown, counted in one entry."""
    others = ('<span style="margin-left:8px;white-space:nowrap"><b>other tenants:</b> '
              f'{_swatches(tenants, True, older_tenants, "tenant")}</span>'
              ) if tenants or older_tenants else ""
    links = ('<span style="margin-left:8px;white-space:nowrap">transfers: '
             '<b style="color:#777">━ ICI</b> <b style="color:#000">╍ DCN</b> '
             '<b style="color:#BBB">▬ host</b></span>')
    return (f'<div style="font-size:12px"><b>{_escape(title)}:</b> '
            f'{_swatches(colors, older=older, what=title)}{others}{links}</div>')


def _escape(text: str) -> str:
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))

"""``pw.report(ctl, path)``: a standalone HTML report that opens without a kernel.

It holds the schedule (every event, up to ``max_rows`` bars), utilization per row (a device,
host or group of hosts, as in the views) over the whole run, a transfer table per link, and
each client's share of device time. BokehJS is embedded inline: the file opens offline,
nothing is fetched from a CDN.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool, Range1d
from bokeh.plotting import figure
from bokeh.resources import INLINE

from ..runtime.trace import Event
from ..runtime.units import human_bytes
from .columns import (
    DeviceLayout,
    client_share,
    human_rate,
    newest,
    tail,
    transfer_summary,
)
from .encoding import Codebook, compute_arrays, link_arrays, own_and_others, transfer_arrays
from .figures import legend_html, names_source, schedule_figure
from .inputs import check_controller, device_ids, positive_int
from .names import LEGEND_NAMES, Recent
from .palette import COLORS


def _row_utilization(events: Sequence[Event], layout: DeviceLayout, start: float,
                     end: float) -> dict[float, float]:
    """Busy fraction of ``[start, end]`` per row of ``layout`` (any of its devices computing;
    overlaps on a row counted once)."""
    if not end > start:
        return {}
    busy = layout.busy(((e.t_start, e.t_end, e.devices) for e in events if e.kind == "compute"),
                       start, end)
    return {y: b / (end - start) for y, b in busy.items()}


def _utilization_figure(events: Sequence[Event], layout: DeviceLayout, start: float, end: float):
    rows = sorted(layout.labels.items())  # a row per device, host or group of hosts
    util = _row_utilization(events, layout, start, end)
    factors = [tuple(label.split(" · ", 1)) for _, label in rows]
    shares = [util.get(y, 0.0) for y, _ in rows]
    source = ColumnDataSource({"x": factors, "u": shares, "text": [f"{u:.1%}" for u in shares]})
    fig = figure(title="Utilization per device over the run", height=240,
                 sizing_mode="stretch_width", x_range=FactorRange(*factors),
                 y_range=Range1d(0, 1.05), tools="", toolbar_location=None)
    fig.vbar(x="x", top="u", width=0.8, source=source, fill_color="#0072B2", line_color=None)
    fig.add_tools(HoverTool(tooltips=[("row", "@x"), ("busy", "@text")]))
    fig.xaxis.major_label_orientation = 0.8
    fig.yaxis.axis_label = "busy fraction"
    return fig


def _share_figure(events: Sequence[Event]):
    share = client_share(events)
    total = sum(share.values()) or 1.0
    names = sorted(share, key=share.get, reverse=True)
    source = ColumnDataSource({"client": names, "share": [share[n] / total for n in names],
                               "seconds": [f"{share[n]:.4f} device-s" for n in names],
                               "color": [COLORS.color("client", n) for n in names]})
    fig = figure(title="Share of device time per client", height=200,
                 sizing_mode="stretch_width", y_range=names or ["(no computations)"],
                 x_range=Range1d(0, 1.05), tools="", toolbar_location=None)
    fig.hbar(y="client", right="share", height=0.6, source=source, fill_color="color",
             line_color="#333333")
    fig.add_tools(HoverTool(tooltips=[("client", "@client"), ("share", "@share{0.0%}"),
                                      ("time", "@seconds")]))
    return fig


def _transfer_table(events: Sequence[Event]) -> Div:
    rows = transfer_summary(events)
    if not rows:
        return Div(text="<h3>Transfers</h3><p>No transfers were recorded.</p>")
    body = "".join(
        f"<tr><td>{html.escape(r['link'])}</td><td>{r['src'] if r['src'] is not None else 'host'}"
        f"</td><td>{r['dst']}</td><td>{r['count']}</td><td>{human_bytes(r['nbytes'])}</td>"
        f"<td>{r['seconds'] * 1e3:.3f} ms</td><td>{human_rate(r['bandwidth']) or '—'}</td></tr>"
        for r in rows)
    return Div(text=("<h3>Transfers</h3><table><tr><th>link</th><th>from island</th>"
                     "<th>to island</th><th>count</th><th>bytes</th><th>time</th>"
                     f"<th>achieved bandwidth</th></tr>{body}</table>"),
               sizing_mode="stretch_width")


def report(ctl, path: str | Path, events: Iterable[Event] | None = None,
           title: str = "pwkernel run report", max_rows: int = 200_000,
           rows: str = "auto", devices: Iterable[int] | None = None) -> Path:
    """Write a standalone HTML report of ``ctl``'s trace (or of ``events``) to ``path``.

    >>> pw.report(ctl, "run.html")   # doctest: +SKIP
    PosixPath('run.html')

    ``path``: a str or path-like; ``max_rows`` (an int > 0) caps the bars drawn in the
    schedule (the newest are kept); the utilization, transfer and share sections always use
    every event. ``rows``: one row per ``"device"``, ``"host"`` or ``"island"``; ``"auto"``
    (default) as the live views: a row per device up to 64, then hosts are grouped (a
    2048-chip pod: 64 rows of 32 chips), in the schedule and the utilization alike.
    ``devices``: only these devices' rows and the events on them (as a drilled-down view
    shows them: ``view.save_report()`` of one writes what it draws).
    """
    check_controller(ctl)
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a file path (str or pathlib.Path), got {path!r}; "
                        "e.g. pw.report(ctl, 'run.html').")
    if not os.fspath(path):  # (a ValueError, as trace.save's for the same path)
        raise ValueError("pw.report(ctl, ''): the path names no file. Pass a file name such "
                         "as 'run.html'.")
    path = Path(path)
    if "\0" in str(path):  # (else a bare "embedded null byte" once the page is built)
        raise ValueError(f"pw.report({str(path)[:120]!r}): the path has a NUL byte, which no "
                         "file name may hold. Pass a file name such as 'run.html'.")
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__} {title!r}; e.g. "
                        "pw.report(ctl, 'run.html', title='step 1000').")
    max_rows = positive_int(max_rows, "max_rows (the most bars the schedule draws)")
    devices = device_ids(devices)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; give a file name in it, e.g. "
                                f"pw.report(ctl, {str(path / 'run.html')!r}).")
    if path.parent and not path.parent.exists():
        raise FileNotFoundError(f"the folder {str(path.parent)!r} for the report does not "
                                "exist; create it first or choose another path.")
    layout = DeviceLayout.from_controller(ctl, rows, devices=devices)
    evs = sorted(layout.drawn(ctl.trace.events() if events is None else list(events)),
                 key=lambda e: e.index)
    t0 = min((e.t_submit for e in evs), default=0.0)
    t_end = max((e.t_end for e in evs), default=t0)
    compute = [e for e in evs if e.kind == "compute"]
    moved = [e for e in evs if e.kind == "transfer"]
    own, others = own_and_others(compute)  # a shared pool's other tenants: drawn apart
    drawn_compute, drawn_moved = newest(own, max_rows, layout), newest(moved, max_rows, layout)
    # The live view's typed columns: binary in the file too, with names looked up on hover.
    book = Codebook()
    bars = ColumnDataSource(tail(compute_arrays(drawn_compute, layout, t0, book), max_rows))
    strips = ColumnDataSource(tail(transfer_arrays(drawn_moved, layout, t0, book), max_rows))
    segs = ColumnDataSource(tail(link_arrays(drawn_moved, layout, t0, book), max_rows))
    theirs = ColumnDataSource(tail(compute_arrays(newest(others, max_rows, layout), layout,
                                                  t0, book), max_rows)) if others else None
    sched = schedule_figure(layout, bars, strips, segs, names_source(book.names),
                            title="Gang schedule", x_range=Range1d(0.0, max(t_end - t0, 1e-6)),
                            others=theirs)
    programs = {e.program: None for e in evs if not e.tenant}
    # the legend: the newest programs (and other tenants), then one entry counting the older
    shown, theirs_shown = Recent(LEGEND_NAMES), Recent(LEGEND_NAMES)
    own_evs = [e for e in evs if not e.tenant]
    shown.note([e.program for e in own_evs], [e.index for e in own_evs])
    theirs_shown.note([e.tenant for e in others], [e.index for e in others])
    clients = sorted({e.client for e in evs})
    summary = (f"<h2>{html.escape(title)}</h2><p>{len(evs)} events ({len(compute)} "
               f"computations, {len(moved)} transfers) over {(t_end - t0) * 1e3:.3f} ms on "
               f"{len(layout.rows)} devices in {len(layout.islands)} islands; "
               f"{len(programs)} programs, {len(clients)} clients.</p>")
    doc = column(
        Div(text=summary, sizing_mode="stretch_width"),
        Div(text=legend_html({p: COLORS.color("program", p) for p in shown.newest()},
                             "program",
                             {t: COLORS.color("tenant", t) for t in theirs_shown.newest()},
                             older=shown.older, older_tenants=theirs_shown.older),
            sizing_mode="stretch_width"),
        sched, _utilization_figure(own, layout, t0, t_end), _transfer_table(evs),
        _share_figure(evs), sizing_mode="stretch_width")
    path.write_text(file_html(doc, resources=INLINE, title=title), encoding="utf-8")
    return path

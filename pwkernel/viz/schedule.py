"""``pw.ScheduleView``: a live Gantt chart of the controller's gang schedules and transfers.

Three layers, as in dask's task stream: the trace keeps its newest events with an ever-growing
index; ``encoding.compute_arrays``/``transfer_arrays``/``link_arrays`` turn events into typed
NumPy columns (pure; strings as codes into ``view.codebook``); ``update()`` streams only the
new columns into Bokeh sources with a rollover, so the page holds at most ``max_rows`` rows
per source while ``history`` keeps as many events in Python as the trace keeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import ipywidgets as w
from bokeh.models import ColumnDataSource, Range1d

from ..runtime.trace import Event, as_events, getter
from .bokeh_model import EchoFreeBokehModel, ensure_bokehjs, resend
from .columns import DeviceLayout, length, newest, select, tail
from .encoding import (
    COMPUTE_ARRAYS,
    LINK_ARRAYS,
    TRANSFER_ARRAYS,
    Codebook,
    compute_arrays,
    decode,
    empty_arrays,
    link_arrays,
    own_and_others,
    transfer_arrays,
)
from .figures import COLOR_FIELDS, legend_html, names_source, schedule_figure, set_color_by
from .inputs import (
    check_controller,
    device_ids,
    drill_devices,
    filter_names,
    live_options,
    positive_int,
    virtual_clock,
    window_seconds,
)
from .names import CODEBOOK_FLOOR, FILTER_NAMES, LEGEND_NAMES, Recent, compact, filter_options
from .palette import COLORS
from .report import report
from .updater import DEFAULT_INTERVAL, LiveUpdater, close_all, close_with_page

FOLLOW, PAUSE = "follow live", "pause"
# The view reads the trace's stored tuples (``Trace.rows``), in ``Event`` field order: no
# object is made per event on the update path, and none is kept that Python's garbage
# collector would have to walk (see ``Trace``).
_INDEX, _T_SUBMIT, _T_END = getter("index"), getter("t_submit"), getter("t_end")
_PROGRAM, _CLIENT, _KIND = getter("program"), getter("client"), getter("kind")
_T_START, _TENANT = getter("t_start"), getter("tenant")


class ScheduleView(w.VBox):
    """One row per device, grouped by island; bars for computations, strips and links for
    transfers; live while programs run.

    >>> view = pw.ScheduleView(ctl, window=5.0)   # doctest: +SKIP
    >>> view                                      # doctest: +SKIP  (shows it in a notebook)
    >>> view.update(); len(view.source.data["index"])   # doctest: +SKIP
    >>> view.close()                              # doctest: +SKIP

    ``rows``: one row per ``"device"``, ``"host"`` or ``"island"`` (with its device count);
    ``"auto"`` (default) keeps rows per device while they fit (64) and groups them when they
    would not (a 2048-chip simulated pod); ``drill(...)`` opens the devices of a host, some
    hosts or an island, one row each. ``devices``: show only these devices.
    ``programs``/``clients``: show only these (None: all). ``window``: seconds of the time axis
    while following; None (default): 10 s for a live view of real time, and a view made with
    ``live=False``, or of a simulated controller (a virtual clock), fits its axis to the events
    it shows (a simulated run's microseconds, a burst of steps) until a window is set
    (``view.window.value``). ``max_rows``: rows kept in the page per source (older ones roll
    over; ``history`` keeps ``ctl.trace.capacity``, up to an eighth more). ``live=False``
    starts no thread: call ``update()`` yourself. ``until``: a ``ProgramRun`` (``fut.run``):
    the view stops following once it has ended, after drawing its end (a ``%%pathways --viz``
    cell's view). A view lives until ``view.close()``, the page closing it, or its controller
    closing.

    The sources hold NumPy columns; their string columns are codes into ``codebook`` (the
    page's copy is ``lookup``): ``view.decoded()`` gives the rows with the names.
    """

    def __init__(self, ctl, programs: Iterable[str] | str | None = None,
                 clients: Iterable[str] | str | None = None, window: float | None = None, *,
                 color_by: str = "program", max_rows: int = 20_000, live: bool = True,
                 rows: str = "auto", devices: Iterable[int] | None = None,
                 interval: float = DEFAULT_INTERVAL, until=None,
                 trace_path: str | Path = "pwkernel-trace.json",
                 report_path: str | Path = "pwkernel-report.html"):
        check_controller(ctl)
        given = window_seconds(window)
        self._fit = given is None and (virtual_clock(ctl) or not live)  # fit to the events
        window = 10.0 if given is None else given
        if color_by not in COLOR_FIELDS:
            raise ValueError(f"color_by must be one of {sorted(COLOR_FIELDS)}, got {color_by!r}.")
        max_rows = positive_int(max_rows, "max_rows")
        devices, (interval, until) = device_ids(devices), live_options(interval, until)
        self.ctl = ctl
        self.max_rows = max_rows
        self.trace_path, self.report_path = Path(trace_path), Path(report_path)
        self._report_rows = dict(rows=rows, devices=devices)  # save_report draws as this view
        self.layout_rows = DeviceLayout.from_controller(ctl, rows, devices=devices)
        self._options = dict(programs=programs, clients=clients, window=given,
                             color_by=color_by, max_rows=max_rows, interval=interval)
        self._rows: list[tuple] = []  # the events read (the trace's tuples), the newest kept
        self._cursor = 0      # next trace index to read
        self._shown = 0       # history[:_shown] has been pushed to the sources
        self._t0: float | None = None
        self._latest = 0.0    # right edge of the newest event, in view seconds
        self._earliest = float("inf")  # left edge of the oldest event shown
        self._lock = threading.RLock()
        self._updated = threading.Condition(self._lock)  # notified after every update()
        self._quiet = False   # set while the view itself changes its controls
        # bounded however many programs run (``names``): what the filters offer; what the plot
        # shows (filters applied), the legend's names, and the events' count
        self._offered = {k: Recent(FILTER_NAMES) for k in ("program", "client")}
        self._legend = {k: Recent(LEGEND_NAMES) for k in ("program", "client", "tenant")}
        self._drawn: tuple | None = None  # what the legend shows now
        self._shown_events = 0
        self._compact_at = CODEBOOK_FLOOR  # codebook names past which unused ones are dropped
        #: the other tenants of a shared pool whose computations this view has read
        self.tenants: dict[str, None] = {}
        # Typed columns only (``encoding``): strings are codes into ``codebook`` (names: ``lookup``)
        self.codebook = Codebook()
        self.lookup = names_source(self.codebook.names)
        self.source = ColumnDataSource(empty_arrays(COMPUTE_ARRAYS), name="pw-schedule-compute")
        self.transfers = ColumnDataSource(empty_arrays(TRANSFER_ARRAYS),
                                          name="pw-schedule-transfers")
        self.links = ColumnDataSource(empty_arrays(LINK_ARRAYS), name="pw-schedule-links")
        # a shared pool's other tenants: their computations, hatched, a colour per tenant
        self.others = ColumnDataSource(empty_arrays(COMPUTE_ARRAYS), name="pw-schedule-others")
        self.x_range = Range1d(0.0, float(window))
        self.figure = schedule_figure(self.layout_rows, self.source, self.transfers, self.links,
                                      self.lookup, color_by=color_by, x_range=self.x_range,
                                      others=self.others)
        self._build_controls(window, color_by, filter_names(programs, "programs"),
                             filter_names(clients, "clients"))
        self._refresh_legend()
        # The history so far goes into the sources before the widget is made: the page draws
        # the plot from the document the widget holds then (see ``bokeh_model``).
        self.plot: EchoFreeBokehModel | None = None
        self._updater: LiveUpdater | None = None
        self.update()
        self.plot = EchoFreeBokehModel(self.figure, lock=self._lock)
        super().__init__([self._toolbar, self._filters, self.legend, self.plot, self.status])
        self._until = until
        self._updater = LiveUpdater(ctl, self.update, interval, until=until) if live else None
        self._refresh_status()
        close_with_page(self)  # a page that closes the view stops its thread

    def drill(self, island: int | None = None, hosts: Iterable[int] | int | None = None,
              devices: Iterable[int] | None = None, **options) -> ScheduleView:
        """A new view of some devices, one row each: those of ``island``, of ``hosts`` (a
        host id or several; needs a controller that knows its hosts, e.g. a simulator), or
        ``devices``. The other options are this view's unless given.

        >>> view.drill(hosts=range(8))        # doctest: +SKIP
        """
        chosen = drill_devices(self.ctl, island, hosts, devices)
        opts = {**self._options, "live": self._updater_alive(), **options}
        return ScheduleView(self.ctl, devices=chosen, **opts)

    # --- controls ------------------------------------------------------------------------
    def _build_controls(self, window: float, color_by: str, programs: tuple[str, ...],
                        clients: tuple[str, ...]) -> None:
        small = w.Layout(width="auto")
        self.mode = w.ToggleButtons(options=[FOLLOW, PAUSE], value=FOLLOW,
                                    style={"button_width": "90px"})
        self.window = w.BoundedFloatText(value=float(window), min=1e-6, max=1e6, step=1.0,
                                         description="window (s)", layout=w.Layout(width="170px"))
        self.color_by = w.Dropdown(options=list(COLOR_FIELDS), value=color_by,
                                   description="colour by", layout=w.Layout(width="190px"))
        self.export_trace = w.Button(description="export trace", icon="download", layout=small)
        self.export_report = w.Button(description="export report", icon="file", layout=small)
        self.program_filter = w.SelectMultiple(options=programs, value=programs, rows=3,
                                               description="programs")
        self.client_filter = w.SelectMultiple(options=clients, value=clients, rows=3,
                                              description="clients")
        self.message = w.HTML()
        self.legend = w.HTML()
        self.status = w.HTML()
        self.mode.observe(self._on_mode, "value")
        self.window.observe(self._on_window, "value")
        self.color_by.observe(self._on_color_by, "value")
        self.program_filter.observe(self._on_filter, "value")
        self.client_filter.observe(self._on_filter, "value")
        self.export_trace.on_click(lambda _: self.save_trace())
        self.export_report.on_click(lambda _: self.save_report())
        self._toolbar = w.HBox([self.mode, self.window, self.color_by, self.export_trace,
                                self.export_report, self.message])
        self._filters = w.HBox([self.program_filter, self.client_filter])

    @property
    def following(self) -> bool:
        return self.mode.value == FOLLOW

    @property
    def programs(self) -> tuple[str, ...] | None:
        """The programs shown (None: all)."""
        return tuple(self.program_filter.value) or None

    @property
    def clients(self) -> tuple[str, ...] | None:
        """The clients shown (None: all)."""
        return tuple(self.client_filter.value) or None

    def _on_mode(self, change) -> None:
        if self.following:
            self.update()  # catch up with what arrived while paused

    def _batch(self) -> AbstractContextManager:
        """The plot's batch (one message per update); nothing before the widget exists."""
        return nullcontext() if self.plot is None else self.plot.batch()

    def _on_window(self, change) -> None:
        self._fit = self._fit and self._quiet  # a window set by hand: kept from now on
        with self._lock, self._batch():
            self._follow()

    def _on_color_by(self, change) -> None:
        with self._lock, self._batch():
            set_color_by(self.figure, change["new"])
            self._refresh_legend()

    def _on_filter(self, change) -> None:
        if not self._quiet:
            self.rebuild()

    # --- data ----------------------------------------------------------------------------
    def update(self) -> int:
        """Read the events recorded since the last call and stream them into the plot; returns
        how many were read. While paused, events are kept in ``history`` and shown on resume."""
        with self._lock, self._batch():
            new = self.ctl.trace.rows(since=self._cursor)  # indices >= the cursor
            if new:
                self._cursor = _INDEX(new[-1]) + 1
                if self._t0 is None:
                    self._t0 = min(map(_T_SUBMIT, new))
                self._rows.extend(new)
                self._note_names(new)
                keep = self.ctl.trace.capacity  # cut in steps of an eighth: O(1) a row
                if keep is not None and (cut := len(self._rows) - keep) > keep // 8:
                    del self._rows[:cut]
                    self._shown = max(0, self._shown - cut)
                    self._forget_before(_INDEX(self._rows[0]))
            if self.following and self._shown < len(self._rows):
                self._push(self._rows[self._shown:])
                self._shown = len(self._rows)
            self._refresh_status()
            self._updated.notify_all()
            return len(new)

    def wait_for(self, count: int, timeout: float | None = None) -> bool:
        """Block until the view has read at least ``count`` events; False on timeout:
        ``view.wait_for(ctl.trace.next_index, timeout=5.0)``."""
        with self._updated:
            return self._updated.wait_for(lambda: self._cursor >= count, timeout)

    def rebuild(self) -> None:
        """Redraw from ``history``: the newest ``max_rows`` rows, and every name.

        The filters call it when they change. Pages repair themselves (a page that drew the
        plot from an older bundle gets every row again once it reports being drawn, see
        ``bokeh_model``); this sends every row and name to every page at once all the same.
        """
        with self._lock, self._batch():
            shown = self._filtered(self._rows)
            t0 = self._t0 or 0.0
            compute, transfers, segments, others = self._arrays(shown, t0)
            self._send_names()
            resend(self.lookup)  # all names again: repairs a page that missed some
            self.source.data = compute
            self.transfers.data = transfers
            self.links.data = segments
            self.others.data = others
            self._compact_names()
            self._shown = len(self._rows)
            self._latest = max(map(_T_END, shown), default=t0) - t0
            self._earliest = min(map(_T_START, shown), default=float("inf")) - t0
            for names in self._legend.values():
                names.clear()
            self._shown_events = 0
            self._note_shown(shown)
            self._refresh_legend()
            self._follow()
            self._refresh_status()

    @property
    def history(self) -> list[Event]:
        """The events this view has read, as many as the trace keeps (built on each access:
        keep the list if you need it more than once)."""
        with self._lock:
            return as_events(self._rows)

    def _filtered(self, rows: list[tuple]) -> list[tuple]:
        rows = self.layout_rows.drawn(rows)  # a drill-down: the events on its devices only
        programs, clients = self.programs, self.clients
        if programs is None and clients is None:
            return rows  # the usual case: no per-event pass at all
        return select(as_events(rows), programs, clients)

    def _push(self, events: list[tuple]) -> None:
        shown = self._filtered(events)
        if not shown:
            return
        self._note_shown(shown)
        t0 = self._t0 or 0.0
        self._latest = max(self._latest, max(map(_T_END, shown)) - t0)
        self._earliest = min(self._earliest, min(map(_T_START, shown)) - t0)
        arrays = self._arrays(shown, t0)
        self._send_names()  # before the rows that use them, so hovers never miss a name
        sources = (self.source, self.transfers, self.links, self.others)
        for source, cols in zip(sources, arrays, strict=True):
            if length(cols):
                source.stream(cols, rollover=self.max_rows)
        self._compact_names()
        self._follow()

    def _arrays(self, events: list[tuple], t0: float) -> tuple[dict, dict, dict, dict]:
        """Typed columns of the newest ``max_rows`` rows per source (computations, transfers,
        links, other tenants' computations): a burst larger than the rollover would only be
        dropped by the browser after crossing the wire."""
        kinds = list(map(_KIND, events))  # no Python code per event in the common case
        if "transfer" in kinds:
            compute = [e for e, k in zip(events, kinds, strict=True) if k == "compute"]
            moved = as_events([e for e, k in zip(events, kinds, strict=True)
                               if k == "transfer"])
        else:
            compute, moved = events, []
        compute, others = own_and_others(compute)
        # An event has at most one bar per device: below this many, every event fits.
        fits = self.max_rows // max(1, self.layout_rows.n_rows)
        book, rows = self.codebook, self.layout_rows
        compute, moved, others = (x if len(x) <= fits else newest(x, self.max_rows, rows)
                                  for x in (compute, moved, others))
        return (tail(compute_arrays(compute, rows, t0, book), self.max_rows),
                tail(transfer_arrays(moved, rows, t0, book), self.max_rows),
                tail(link_arrays(moved, rows, t0, book), self.max_rows),
                tail(compute_arrays(others, rows, t0, book), self.max_rows))

    def _send_names(self) -> None:
        sent = length(self.lookup.data)
        if sent < len(self.codebook):
            self.lookup.stream({"text": self.codebook.names[sent:]})

    def _compact_names(self) -> None:
        """Past twice the names its rows used when last compacted, the codebook keeps only
        those the page's rows use (rows re-coded, in this update's one message)."""
        if len(self.codebook) > self._compact_at:
            sources = (self.source, self.transfers, self.links, self.others)
            self._compact_at = max(CODEBOOK_FLOOR,
                                   2 * compact(self.codebook, sources, self.lookup))

    def decoded(self, source: ColumnDataSource | None = None) -> dict[str, list]:
        """The rows of ``source`` (default: the computation bars) with names, not codes.

        >>> view.decoded()["program"][:2]   # doctest: +SKIP
        ['fig2', 'fig2']
        """
        with self._lock:
            return decode(dict((source or self.source).data), self.codebook)

    def _follow(self) -> None:
        if not self.following:
            return
        if self._fit and self._earliest < self._latest:
            pad = (self._latest - self._earliest) * 0.02
            self._quiet, quiet = True, self._quiet
            try:
                self.window.value = self._latest - self._earliest + 2 * pad
            finally:
                self._quiet = quiet
            self.x_range.update(start=self._earliest - pad, end=self._latest + pad)
            return
        end = max(self._latest, float(self.window.value))
        self.x_range.update(start=end - float(self.window.value), end=end)

    def _note_shown(self, events: list[tuple]) -> None:
        """Count the events shown; note their names for the legend (other tenants apart)."""
        self._shown_events += len(events)
        own, others = own_and_others(events)
        for key, rows, field in (("program", own, _PROGRAM), ("client", own, _CLIENT),
                                 ("tenant", others, _TENANT)):
            if rows:
                self._legend[key].note(map(field, rows), map(_INDEX, rows))
        self._refresh_legend(changed_only=True)

    def _note_names(self, events: list[Event]) -> None:
        """Names join the filters' choices (the newest ``FILTER_NAMES``, newest first, and
        the selected ones), and other tenants ``tenants``."""
        others = own_and_others(events)[1]
        if others:
            self.tenants |= dict.fromkeys(map(_TENANT, others))
        for key, field in (("program", _PROGRAM), ("client", _CLIENT)):
            self._offered[key].note(map(field, events), map(_INDEX, events))
        self._refresh_filters()

    def _forget_before(self, first: int) -> None:
        """Names whose events all left ``history`` leave the legend and the filters."""
        for names in (*self._offered.values(), *self._legend.values()):
            names.prune(first)
        self._refresh_filters()
        self._refresh_legend(changed_only=True)

    def _refresh_filters(self) -> None:
        for key, sel in (("program", self.program_filter), ("client", self.client_filter)):
            options = filter_options(self._offered[key], sel.value)
            if set(options) != set(sel.options):  # a name joined or left: not a new order
                value, self._quiet = sel.value, True
                try:
                    sel.options = options
                    sel.value = value
                finally:
                    self._quiet = False

    def _refresh_legend(self, changed_only: bool = False) -> None:
        """The names of what the plot shows (the filters applied), with their colours: the
        newest ``LEGEND_NAMES``, then one entry counting the older ones."""
        key = self.color_by.value
        drawn = (key, self._legend[key].shown(), self._legend["tenant"].shown())
        if changed_only and drawn == self._drawn:
            return
        self._drawn = drawn
        own, tenants = self._legend[key], self._legend["tenant"]
        self.legend.value = legend_html(
            {n: COLORS.color(key, n) for n in own.newest()}, key,
            {n: COLORS.color("tenant", n) for n in tenants.newest()},
            older=own.older, older_tenants=tenants.older)

    def _refresh_status(self) -> None:
        if getattr(self.ctl, "closed", False):
            live = "controller closed · final"
        elif getattr(self, "_until", None) is not None and self._until.done():
            live = "ended · final"
        elif self._updater_alive():
            live = "live"
        else:
            live = "not live"
        mode = "following" if self.following else "paused"
        events = f"{len(self._rows)} events"
        if self.programs is not None or self.clients is not None:
            events = f"{self._shown_events} of {events} (filtered)"
        self.status.value = (f'<span style="font-size:11px;color:#555">{events} · '
                             f'{length(self.source.data)} bars in view · {mode} · '
                             f'{live}</span>')

    def _updater_alive(self) -> bool:
        updater = getattr(self, "_updater", None)
        return updater is not None and updater.is_alive()

    # --- exports and life cycle --------------------------------------------------------
    def save_trace(self, path: str | Path | None = None) -> Path:
        """Write the controller's trace as Perfetto / Chrome-trace JSON."""
        out = self.ctl.trace.save(path or self.trace_path)
        self.message.value = f"trace saved to <code>{out}</code> (open in ui.perfetto.dev)"
        return out

    def save_report(self, path: str | Path | None = None) -> Path:
        """Write a standalone HTML report of every event this view has seen, on its rows."""
        out = report(self.ctl, path or self.report_path, events=self.history, **self._report_rows)
        self.message.value = f"report saved to <code>{out}</code>"
        return out

    @property
    def updater(self) -> LiveUpdater | None:
        return self._updater

    def stop(self) -> None:
        """Stop live updates (the plot stays; ``update()`` still works by hand). The plot's
        bundle is made again as it is now: a page opened later (a second tab) draws it whole."""
        if self._updater is not None:
            self._updater.stop()
        with self._lock:
            self._refresh_status()
            self.plot.refresh()

    def close(self) -> None:
        """Stop the updater thread and close every widget of the view."""
        if getattr(self, "_updater", None) is not None:
            self._updater.stop()
        # getattr: ipywidgets' __del__ also calls close() on a view whose __init__ failed.
        for name in ("plot", "mode", "window", "color_by", "export_trace", "export_report",
                     "program_filter", "client_filter", "message", "legend", "status",
                     "_toolbar", "_filters"):
            close_all(getattr(self, name, None))  # with its layout, style, children
        close_all(getattr(self, "layout", None))
        super().close()

    def _repr_mimebundle_(self, **kwargs):
        ensure_bokehjs()  # the BokehModel renders only when BokehJS is in the page
        # The page draws the plot from the widget's bundle: make it carry every row so far
        # (a view made after runs, or shown a second time, would otherwise start empty).
        self.plot.refresh()
        return super()._repr_mimebundle_(**kwargs)


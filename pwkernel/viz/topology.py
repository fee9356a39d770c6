"""``pw.TopologyView``: islands and devices, which slices map where, and how busy they are.

Per device: utilization over the last ``window`` seconds (the trace's computations, plus those
the snapshot shows running; on a virtual clock, a simulator's, by default over the whole run:
its work takes microseconds) and memory held by live buffers; per island: computations
queued and running in its gang scheduler. Everything but the trace comes from
``ctl.snapshot()``, twice a second: snapshots, not a stream.

With more devices than fit (``rows="auto"``, as ``ScheduleView``), a bar stands for a host, a
group of hosts or an island (its label gives the device count): its utilization is the
fraction of the window in which any of its devices computed, its memory the sum. A simulator
(``pwkernel.backends.sim.Simulator``) can be shown too: its clock is virtual, and it has no
live buffers or queues to report.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext

import ipywidgets as w
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Range1d
from bokeh.plotting import figure

from ..runtime.controller import Controller
from ..runtime.snapshot import Snapshot
from ..runtime.tasks import TaskState
from ..runtime.trace import Event
from ..runtime.units import human_bytes
from .bokeh_model import EchoFreeBokehModel, ensure_bokehjs
from .columns import DeviceLayout
from .inputs import check_controller, live_options, virtual_clock, window_seconds
from .updater import LiveUpdater, close_all, close_with_page

TOPOLOGY_COLUMNS = ("x", "device", "island", "utilization", "util_text", "memory",
                    "memory_text", "slices", "color")
_ISLAND_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")


def slice_map(snap: Snapshot) -> dict[int, list[str]]:
    """Device id -> descriptions of the live slices mapped onto it."""
    out: dict[int, list[str]] = {d: [] for i in snap.islands for d in i.device_ids}
    for vs in snap.slices:
        shape = "x".join(map(str, vs.shape))
        for d in vs.device_ids:
            out.setdefault(d, []).append(f"slice {vs.id} ({shape})")
    return out


def running(snap: Snapshot | None, now: float,
            virtual: bool = False) -> list[tuple[float, tuple[int, ...]]]:
    """(launch time, devices) of every computation running now: busy, though the trace has
    no event for it until it ends (a long training step would otherwise read 0 %). One its
    scheduler made RUNNING whose launch has not yet been timed (``t_launch`` 0.0: the backend
    launches it a moment later) is busy from ``now``; before, it read busy since the clock's
    zero, a whole window at 100 % for a frame. On a ``virtual`` clock 0.0 is a real time."""
    if snap is None or snap.closed:
        return []
    return [(n.t_launch if n.t_launch or virtual else now, n.devices)
            for r in snap.runs for n in r.nodes if n.compute and n.state is TaskState.RUNNING]


class TopologyView(w.VBox):
    """Islands, devices, slice placement, live utilization, memory and queue depth.

    >>> view = pw.TopologyView(ctl)   # doctest: +SKIP
    >>> view.update(); view.source.data["utilization"]   # doctest: +SKIP
    >>> view.close()                  # doctest: +SKIP
    """

    #: computations kept in Python for utilization over the whole run (a virtual clock's
    #: default): past twice this many, the busy time of the older ones is folded into totals
    hold = 10_000

    def __init__(self, ctl, window: float | None = None, *, live: bool = True,
                 interval: float = 0.5, rows: str = "auto"):
        check_controller(ctl)
        window, (interval, _) = window_seconds(window), live_options(interval)
        self.ctl = ctl
        #: seconds of utilization shown; None: the whole run (default on a virtual clock)
        self.window_s = 10.0 if window is None and not virtual_clock(ctl) else window
        self._lock = threading.RLock()
        self._cursor = 0
        self._recent: deque[Event] = deque()
        self._first = float("inf")  # when the first computation seen started
        # over the whole run: busy seconds per row before ``_folded_to``, of computations let go
        self._folded: dict[float, float] = {}
        self._folded_to = -float("inf")
        self.layout_rows = DeviceLayout.from_controller(ctl, rows)
        self.factors = [tuple(label.split(" · ", 1)) for _, label in
                        sorted(self.layout_rows.labels.items())]
        self.source = ColumnDataSource({k: [] for k in TOPOLOGY_COLUMNS},
                                       name="pw-topology-devices")
        tips = [("device", "@device (island @island)"), ("utilization", "@util_text"),
                ("memory", "@memory_text"), ("slices", "@slices")]
        span = "whole run" if self.window_s is None else f"last {self.window_s:g} s"
        util = figure(title=f"Utilization ({span})", height=220,
                      sizing_mode="stretch_width", x_range=FactorRange(*self.factors),
                      y_range=Range1d(0, 1.05), tools="", toolbar_location=None)
        util.vbar(x="x", top="utilization", width=0.8, source=self.source, fill_color="color",
                  line_color=None)
        util.add_tools(HoverTool(tooltips=tips))
        util.yaxis.axis_label = "busy fraction"
        mem = figure(title="Memory held by live buffers", height=200,
                     sizing_mode="stretch_width", x_range=util.x_range, tools="",
                     toolbar_location=None)
        mem.vbar(x="x", top="memory", width=0.8, source=self.source, fill_color="color",
                 fill_alpha=0.6, line_color=None)
        mem.add_tools(HoverTool(tooltips=tips))
        mem.yaxis.axis_label = "bytes"
        for fig in (util, mem):
            fig.xaxis.major_label_orientation = 0.8
            fig.xgrid.grid_line_color = None
        self.figure = column(util, mem, sizing_mode="stretch_width")
        self.islands = w.HTML()
        # The first picture goes into the source before the widget is made: the page draws
        # the plot from the document the widget holds then (see ``bokeh_model``).
        self.plot: EchoFreeBokehModel | None = None
        self.update()
        self.plot = EchoFreeBokehModel(self.figure, lock=self._lock)
        super().__init__([self.islands, self.plot])
        self._updater = LiveUpdater(ctl, self.update, interval,
                                    name="pwkernel-topology-updater") if live else None
        close_with_page(self)  # a page that closes the view stops its thread

    def update(self) -> None:
        """Take a snapshot of utilization, memory, slices and queues, and redraw."""
        batch: AbstractContextManager = nullcontext() if self.plot is None else self.plot.batch()
        with self._lock, batch:
            # a simulator has no live buffers, queues or slices to report. The snapshot comes
            # before the trace: a computation that ends in between is then in one of them.
            snap = self.ctl.snapshot() if isinstance(self.ctl, Controller) else None
            for e in self.ctl.trace.events(since=self._cursor):
                if e.index >= self._cursor:
                    self._cursor = e.index + 1
                    if e.kind == "compute" and not e.tenant:  # own work (not a pool's others)
                        self._recent.append(e)
                        self._first = min(self._first, e.t_start)
            if isinstance(self.ctl, Controller):  # its executor's clock is its trace's
                now = self.ctl.executor.now()
            else:  # a Simulator: its virtual clock
                now = float(getattr(self.ctl, "now", time.perf_counter()))
            going = running(snap, now, virtual_clock(self.ctl))
            if self.window_s is None:  # since the first computation
                start = min(self._first, now)
                self._fold(min((t for t, _ in going), default=now))
            else:
                start = now - self.window_s
            while self._recent and self._recent[0].t_end < start:
                self._recent.popleft()
            util = self._row_utilization(start, now, going)
            live = snap is not None and not snap.closed
            memory = snap.memory if live else {}
            slices = slice_map(snap) if live else {}
            layout = self.layout_rows
            members: dict[float, list[int]] = {}
            for d, y in layout.rows.items():
                members.setdefault(y, []).append(d)
            data: dict[str, list] = {k: [] for k in TOPOLOGY_COLUMNS}
            islands = {d: n for n, isl in enumerate(self.ctl.islands) for d in isl.device_ids}
            for x, (y, devices) in zip(self.factors, sorted(members.items()), strict=True):
                mem = sum(memory.get(d, 0) for d in devices)
                names = sorted({v for d in devices for v in slices.get(d, [])})
                n = islands[devices[0]]
                one = devices[0] if len(devices) == 1 else x[1]
                row = {"x": x, "device": one, "island": self.ctl.islands[n].id,
                       "utilization": util.get(y, 0.0), "util_text": f"{util.get(y, 0.0):.0%}",
                       "memory": mem, "memory_text": human_bytes(mem),
                       "slices": ", ".join(names) or "none",
                       "color": _ISLAND_COLORS[n % len(_ISLAND_COLORS)]}
                for k, v in row.items():
                    data[k].append(v)
            self.source.data = data
            if snap is None:
                self.islands.value = f"<i>simulated: t = {now:.6g} s (virtual)</i>"
            else:  # a closed controller says so
                self.islands.value = self._islands_html(snap, slices)

    def _row_utilization(self, start: float, end: float,
                         now_running: list[tuple[float, tuple[int, ...]]] = ()
                         ) -> dict[float, float]:
        """Busy fraction of each row (any of its devices computing) in ``[start, end]``: the
        ended computations read from the trace, and ``now_running`` (launch time, devices)
        until ``end``."""
        if not end > start:
            return {}
        whole = self.window_s is None  # the folded busy time counts, and what follows it
        lo = max(start, self._folded_to) if whole else start
        ended = ((e.t_start, e.t_end, e.devices) for e in self._recent)
        going = ((t, end, devices) for t, devices in now_running)
        busy = self.layout_rows.busy((*ended, *going), lo, end)
        for y, seconds in (self._folded.items() if whole else ()):
            busy[y] = busy.get(y, 0.0) + seconds
        return {y: b / (end - start) for y, b in busy.items()}

    def _fold(self, before: float) -> None:
        """Past ``2 * hold`` computations kept, add the busy time of all but the newest
        ``hold`` (up to ``before``: no computation still running started earlier, so none
        that ends later has time before it) to the per-row totals, and let them go."""
        if len(self._recent) <= 2 * self.hold:
            return
        ends = sorted(e.t_end for e in self._recent)
        cut = min(ends[-self.hold - 1], before)
        if not cut > self._folded_to:
            return
        spans = ((e.t_start, e.t_end, e.devices) for e in self._recent)
        for y, seconds in self.layout_rows.busy(spans, self._folded_to, cut).items():
            self._folded[y] = self._folded.get(y, 0.0) + seconds
        self._folded_to = cut
        self._recent = deque(e for e in self._recent if e.t_end > cut)

    def _islands_html(self, snap: Snapshot | None, slices: dict[int, list[str]]) -> str:
        if snap is None or snap.closed:
            return "<i>controller closed</i>"
        rows = []
        for isl in snap.islands:
            mapped = sorted({s for d in isl.device_ids for s in slices.get(d, [])})
            rows.append(f"<tr><td>island {isl.id}</td><td>{isl.platform}</td>"
                        f"<td>{', '.join(map(str, isl.device_ids))}</td>"
                        f"<td>{isl.running}</td><td>{isl.queued}</td>"
                        f"<td>{'; '.join(mapped) or '—'}</td></tr>")
        head = ("<tr><th>island</th><th>platform</th><th>devices</th><th>running</th>"
                "<th>queued</th><th>slices</th></tr>")
        return (f'<table style="font-size:12px">{head}{"".join(rows)}</table>'
                f'<div style="font-size:11px;color:#555">policy {snap.policy} · dispatch '
                f'{snap.dispatch} · {len(snap.runs)} programs running</div>')

    @property
    def held(self) -> int:
        """How many computations the view keeps in Python (at most ``2 * hold`` past an
        update over the whole run; those of the last ``window`` seconds otherwise)."""
        with self._lock:
            return len(self._recent)

    @property
    def updater(self) -> LiveUpdater | None:
        return self._updater

    def close(self) -> None:
        """Stop the updater thread and close the widgets."""
        if getattr(self, "_updater", None) is not None:
            self._updater.stop()
        for name in ("plot", "islands"):  # getattr: __init__ may have failed half-way
            close_all(getattr(self, name, None))  # with its layout, style, children
        close_all(getattr(self, "layout", None))
        super().close()

    def _repr_mimebundle_(self, **kwargs):
        ensure_bokehjs()
        self.plot.refresh()  # the page draws the plot from the widget's bundle: the newest
        return super()._repr_mimebundle_(**kwargs)

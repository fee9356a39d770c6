"""Live views that a cell showed, closed when the cell runs again and no longer shows them.

A frontend clears a cell's outputs when the cell runs again, so a live view that the cell
showed (``pw.ScheduleView``, ``pw.TopologyView``) leaves the page; but its model stays open in
the kernel, and its thread kept reading the trace and sending the page updates that nothing
showed: one more thread for each rerun of ``view = pw.ScheduleView(ctl); view``, until the
controller closed. Now, after a cell ran, each view its previous run showed is closed unless
this run showed it again, another cell shows it, or a notebook name holds it (``view`` in a
later cell shows it again).

Cells are told apart by the id the frontend sends with each one (JupyterLab, Notebook 7,
VS Code); a cell run without one (a console) closes nothing.
"""

from __future__ import annotations

from typing import Any

from IPython.utils.dir2 import get_real_method

from ..viz.schedule import ScheduleView
from ..viz.topology import TopologyView

LIVE_VIEWS = (ScheduleView, TopologyView)


class ShownViews:
    """The live views each cell's latest run showed (by the frontend's cell id)."""

    def __init__(self, user_ns: dict[str, Any]):
        self.user_ns = user_ns
        self.by_cell: dict[str, list[Any]] = {}
        self.cell: str | None = None   # the cell running now (None: no id, or none runs)
        self.now: list[Any] = []       # the live views it has shown so far

    def started(self, info: Any) -> None:
        self.cell, self.now = getattr(info, "cell_id", None), []

    def shown(self, view: Any) -> None:
        if self.cell is not None and not any(v is view for v in self.now):
            self.now.append(view)

    def ended(self, _result: Any = None) -> list[Any]:
        """The cell ended: close the views its previous run showed that nothing shows or
        holds now; returns them."""
        cell, self.cell = self.cell, None
        if cell is None:
            return []
        before = self.by_cell.pop(cell, [])
        if self.now:
            self.by_cell[cell] = self.now
        self.now = []
        kept = {id(v) for views in self.by_cell.values() for v in views}
        kept |= {id(v) for name, v in list(self.user_ns.items())
                 if isinstance(v, LIVE_VIEWS) and not name.startswith("_")}
        closed = [v for v in before if id(v) not in kept]
        for view in closed:
            view.close()
        return closed

    def bundle(self, view: Any) -> Any:
        """The view's own display (ipywidgets' mimebundle), noted as shown by this cell."""
        self.shown(view)
        return get_real_method(view, "_repr_mimebundle_")()


def register(ip) -> ShownViews:
    views = ShownViews(ip.user_ns)
    for cls in LIVE_VIEWS:
        ip.display_formatter.mimebundle_formatter.for_type(cls, views.bundle)
    ip.events.register("pre_run_cell", views.started)
    ip.events.register("post_run_cell", views.ended)
    return views


def unregister(ip, views: ShownViews | None) -> None:
    for cls in LIVE_VIEWS:
        ip.display_formatter.mimebundle_formatter.type_printers.pop(cls, None)
    if views is None:
        return
    for event, handler in (("pre_run_cell", views.started), ("post_run_cell", views.ended)):
        try:
            ip.events.unregister(event, handler)
        except ValueError:
            pass

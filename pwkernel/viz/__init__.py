"""Live views of gang schedules and transfers, and standalone HTML reports.

>>> view = pw.ScheduleView(ctl)      # doctest: +SKIP  (a live Gantt chart, in a notebook)
>>> topo = pw.TopologyView(ctl)      # doctest: +SKIP  (islands, slices, utilization, memory)
>>> pw.report(ctl, "run.html")       # doctest: +SKIP  (opens offline, no kernel needed)
"""

from .report import report
from .schedule import ScheduleView
from .topology import TopologyView

__all__ = ["ScheduleView", "TopologyView", "report"]

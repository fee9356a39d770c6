"""Live views of gang schedules and transfers, and standalone HTML reports.

>>> view = pw.ScheduleView(ctl)      # doctest: +SKIP  (a live Gantt chart, in a notebook)
>>> topo = pw.TopologyView(ctl)      # doctest: +SKIP  (islands, slices, utilization, memory)
>>> pw.report(ctl, "run.html")       # doctest: +SKIP  (opens offline, no kernel needed)
"""

from ..runtime.keywords import suggests_keywords
from .report import report
from .schedule import ScheduleView
from .topology import TopologyView

# (here, where pw takes them from: a misspelt keyword names the one meant)
report = suggests_keywords("pw.report")(report)
ScheduleView = suggests_keywords("pw.ScheduleView")(ScheduleView)
TopologyView = suggests_keywords("pw.TopologyView")(TopologyView)

__all__ = ["ScheduleView", "TopologyView", "report"]

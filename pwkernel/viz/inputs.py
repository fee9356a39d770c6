"""What every view checks first: that it was given something to show (a ``pw.Controller``, or
a simulator: anything with a trace and islands)."""

from __future__ import annotations

from typing import Any


def check_controller(ctl: Any) -> Any:
    """``ctl`` if it has a ``trace`` and ``islands``; else a TypeError that names the fix."""
    if not (hasattr(ctl, "trace") and hasattr(ctl, "islands")):
        raise TypeError(f"a view needs a pw.Controller, got {type(ctl).__name__}. "
                        "Maybe you want pw.ScheduleView(pw.controller()).")
    return ctl

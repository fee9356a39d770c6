"""What every view checks first: that it was given a controller."""

from __future__ import annotations

from typing import Any

from ..runtime.controller import Controller


def check_controller(ctl: Any) -> Controller:
    """``ctl`` if it is a ``pw.Controller``; else a TypeError that names the fix."""
    if not isinstance(ctl, Controller):
        raise TypeError(f"a view needs a pw.Controller, got {type(ctl).__name__}. "
                        "Maybe you want pw.ScheduleView(pw.controller()).")
    return ctl

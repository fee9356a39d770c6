"""What every view checks first: that it was given something to show (a ``pw.Controller``, or
a simulator: anything with a trace and islands), and arguments of the kinds it takes (NumPy
numbers too), refused in one line that says what was expected."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

WINDOW_RANGE = (1e-6, 1e6)  # seconds a view's time window may span (its window box's bounds)


def check_controller(ctl: Any) -> Any:
    """``ctl`` if it has a ``trace`` and ``islands``; else a TypeError that names the fix."""
    if not (hasattr(ctl, "trace") and hasattr(ctl, "islands")):
        raise TypeError(f"a view needs a pw.Controller, got {type(ctl).__name__}. "
                        "Maybe you want pw.ScheduleView(pw.controller()).")
    return ctl


def virtual_clock(ctl: Any) -> bool:
    """Whether ``ctl`` runs on a virtual clock: a simulated controller, or a ``Simulator``
    given directly (it has no executor)."""
    executor = getattr(ctl, "executor", None)
    return executor is None or bool(getattr(executor, "virtual", False))


def window_seconds(value: Any) -> float | None:
    """A view's ``window`` as float seconds within ``WINDOW_RANGE`` (None stays None)."""
    if value is None:
        return None
    lo, hi = WINDOW_RANGE
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not lo <= value <= hi:
        raise ValueError(f"window must be a positive number of seconds from {lo:g} to {hi:g}, "
                         f"got {value!r}. Maybe you want window=10.0 (the last 10 s).")
    return float(value)


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int > 0 (a NumPy integer too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}.")
    return int(value)


def live_options(interval: Any, until: Any = None) -> tuple[float, Any]:
    """A live view's ``interval`` (finite seconds > 0: an infinite one overflowed the updater
    thread's wait) and ``until`` (None, or what it follows until done: a ``ProgramRun``)."""
    if (isinstance(interval, bool) or not isinstance(interval, numbers.Real)
            or not 0 < interval < float("inf")):
        kind = TypeError if not isinstance(interval, numbers.Real) else ValueError
        raise kind(f"the update interval must be a positive number of seconds, got "
                   f"{interval!r}. Maybe you want interval=0.5 (twice a second).")
    if until is not None and not callable(getattr(until, "done", None)):
        raise TypeError(f"until must be a pw.ProgramRun (fut.run) or None, got "
                        f"{type(until).__name__} {until!r}. Maybe you want until=fut.run (the "
                        "view stops following once that program has ended).")
    return float(interval), until


def filter_names(value: Iterable[str] | str | None, what: str) -> tuple[str, ...]:
    """A filter's names: one name, several, or None (no filter: ``()``)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    hint = (f" The window is a keyword argument: window={value!r}."
            if isinstance(value, numbers.Real) else "")
    if not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a name or names (str), got {value!r}; e.g. "
                        f"{what}=['train'].{hint}")
    found = tuple(value)
    bad = [v for v in found if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{what} must be names (str), got {bad!r}; e.g. {what}=['train'].")
    return found


def device_ids(value: Iterable[int] | None) -> tuple[int, ...] | None:
    """A view's ``devices``: device ids (None: every device)."""
    if value is None:
        return None
    if not isinstance(value, Iterable) or isinstance(value, str):
        raise TypeError(f"devices must be device ids (a list of int), got {value!r}; e.g. "
                        "devices=[0, 1], or devices=None for all of them.")
    found = tuple(value)
    bad = [d for d in found if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
    if bad:
        raise TypeError(f"devices must be device ids (int), got {bad!r}; e.g. devices=[0, 1].")
    return tuple(int(d) for d in found)


def drill_devices(ctl, island, hosts, devices) -> list[int]:
    """The devices a drill-down asks for (exactly one way of naming them)."""
    given = [x is not None for x in (island, hosts, devices)]
    if sum(given) != 1:
        raise ValueError("drill needs exactly one of island=, hosts= or devices=, got "
                         f"island={island!r}, hosts={hosts!r}, devices={devices!r}. Maybe you "
                         "want view.drill(hosts=range(8)).")
    everything = [d for isl in ctl.islands for d in isl.device_ids]
    if island is not None:
        chosen = [d for isl in ctl.islands if isl.id == island for d in isl.device_ids]
    elif hosts is not None:
        host_of = getattr(ctl, "host_of", None)
        if host_of is None:
            raise ValueError(f"{type(ctl).__name__} does not say which host each device is "
                             "on; drill by island= or devices= instead.")
        wanted = {hosts} if isinstance(hosts, int) else set(hosts)
        chosen = [d for d in everything if int(host_of[d]) in wanted]
    else:
        known = set(everything)
        chosen = [int(d) for d in devices]
        missing = [d for d in chosen if d not in known]
        if missing:
            raise ValueError(f"devices {missing} are not in this view's islands (devices "
                             f"{min(known)}..{max(known)}).")
    if not chosen:
        raise ValueError(f"no devices match island={island!r}, hosts={hosts!r}; this view "
                         f"has islands {[isl.id for isl in ctl.islands]}.")
    return chosen

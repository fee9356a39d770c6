"""A compact text account of what one program run did: what ran where, and how long.

It is what ``%%pathways --viz`` prints when the live schedule view is not available (a
terminal, or no ``pwkernel.viz.ScheduleView``).

>>> print(summary_text(ctl, run))    # doctest: +SKIP
cell[4] (run 7, client default): 3 computations, 1 transfer, 4.2 ms from submit to last end
  compute   cell[4]            island 0 devices [0-3]    1.3 ms  queued 0.1 ms
"""

from __future__ import annotations

from collections import defaultdict

from ..runtime.units import device_ids, human_seconds

MAX_LINES = 12


def summary_text(ctl, run) -> str:
    events = [e for e in ctl.trace.events() if e.program_id == run.id]
    if not events:
        return f"{run.name} (run {run.id}): nothing ran (cancelled, or the trace was disabled)."
    kinds = defaultdict(int)
    for e in events:
        kinds[e.kind] += 1
    counts = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in
                       (("computation", kinds["compute"]), ("transfer", kinds["transfer"])) if n)
    span = max(e.t_end for e in events) - run.t_submit
    failed = sum(e.status != "ok" for e in events)
    head = (f"{run.name} (run {run.id}, client {run.client}): {counts}, {human_seconds(span)} from "
            f"submit to last end" + (f", {failed} failed" if failed else ""))
    # One line per (kind, name, place); repeated nodes (a loop in the cell) are summed.
    groups: dict[tuple, list] = defaultdict(list)
    for e in events:
        where = (f"island {e.island} devices {device_ids(e.devices)}" if e.kind == "compute" else
                 f"{'host' if e.src is None else f'island {e.src}'} -> island {e.dst} "
                 f"({e.link})")
        groups[(e.kind, e.name, where)].append(e)
    lines = [head]
    for (kind, name, where), group in list(groups.items())[:MAX_LINES]:
        busy = sum(e.duration for e in group)
        queued = sum(max(0.0, e.t_start - e.t_submit) for e in group)
        times = f" x{len(group)}" if len(group) > 1 else ""
        lines.append(f"  {kind:<9} {name + times:<18} {where:<28} {human_seconds(busy):>9}  "
                     f"queued {human_seconds(queued)}")
    if len(groups) > MAX_LINES:
        lines.append(f"  ... {len(groups) - MAX_LINES} more (ctl.trace.events() has them all)")
    return "\n".join(lines)

"""Pipeline schedules: the order in which a training step calls each stage's forwards and
backwards, as plain data (no JAX, no runtime), so it can be read, printed and tested alone.

A schedule is first an order per stage (what that stage's devices run, one after another),
then one global order of calls that respects every data dependency (microbatch m's forward on
stage s needs its forward on stage s-1; its backward on stage s needs the backward on stage s+1
and the forward on stage s). The step program makes its ``pw.function`` calls in the global
order, and threads a token through each stage's calls in the stage's order, so the island's
gang scheduler runs each stage's work in exactly that order (see ``pipeline.py`` for why the
call order alone is not enough).

- ``GPIPE``: every stage runs all its forwards, then all its backwards. Stage 0 keeps the
  residuals of all M microbatches alive until its first backward.
- ``ONE_F_ONE_B`` (PipeDream-Flush): stage s runs ``min(S - s - 1, M)`` warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards. Stage s keeps at
  most ``S - s`` microbatches' residuals alive; the bubble is the same as GPipe's.

>>> [c.name for c in stage_order(Schedule.ONE_F_ONE_B, stage=0, stages=2, microbatches=3)]
['s0.fwd[m0]', 's0.fwd[m1]', 's0.bwd[m0]', 's0.fwd[m2]', 's0.bwd[m1]', 's0.bwd[m2]']
>>> [c.name for c in order("gpipe", stages=2, microbatches=2)][:4]
['s0.fwd[m0]', 's0.fwd[m1]', 's1.fwd[m0]', 's1.fwd[m1]']
"""

from __future__ import annotations

import difflib
import re
from enum import StrEnum
from typing import NamedTuple


class Schedule(StrEnum):
    """How a step orders its microbatches' forwards and backwards (see the module's doc)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: Schedule | str) -> Schedule:
        try:
            return cls(value)
        except ValueError:
            names = [s.value for s in cls]
            near = difflib.get_close_matches(str(value).lower(), names, n=1) or ["1f1b"]
            raise ValueError(f"schedule must be one of {names}, got {value!r}. Maybe you want "
                             f"schedule={near[0]!r}.") from None


class Kind(StrEnum):
    """What a stage call does. ``UPDATE`` is the optimizer step, once per stage per step."""

    FWD = "fwd"
    BWD = "bwd"
    UPDATE = "update"


class Call(NamedTuple):
    """One call of a stage's function on one microbatch."""

    stage: int
    kind: Kind
    microbatch: int

    @property
    def name(self) -> str:
        """Its name in the trace: ``"s1.fwd[m2]"``."""
        return call_name(self.stage, self.kind, self.microbatch)


def call_name(stage: int, kind: Kind | str, microbatch: int | None = None) -> str:
    """``"s1.fwd[m2]"`` for a forward or backward, ``"s1.update"`` for an update."""
    kind = Kind(kind)
    return f"s{stage}.{kind.value}" + ("" if microbatch is None else f"[m{microbatch}]")


_NAME = re.compile(r"^s(?P<stage>\d+)\.(?P<kind>fwd|bwd|update)(?:\[m(?P<m>\d+)\])?$")


def parse_name(name: str) -> Call | None:
    """The call a trace event's name stands for, or None for other events (transfers...);
    an update has microbatch -1."""
    match = _NAME.match(name)
    if match is None:
        return None
    m = match["m"]
    return Call(int(match["stage"]), Kind(match["kind"]), -1 if m is None else int(m))


def stage_order(schedule: Schedule | str, stage: int, stages: int,
                microbatches: int) -> list[Call]:
    """What stage ``stage`` of ``stages`` runs, in order, for ``microbatches`` microbatches."""
    schedule = Schedule.parse(schedule)
    _check(stages, microbatches)
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in [0, {stages}), got {stage}.")
    fwd = [Call(stage, Kind.FWD, m) for m in range(microbatches)]
    bwd = [Call(stage, Kind.BWD, m) for m in range(microbatches)]
    if schedule is Schedule.GPIPE:
        return fwd + bwd
    warm = min(stages - stage - 1, microbatches)
    out = fwd[:warm]
    for i in range(microbatches - warm):
        out += [fwd[warm + i], bwd[i]]
    return out + bwd[microbatches - warm:]


def order(schedule: Schedule | str, stages: int, microbatches: int) -> list[Call]:
    """Every stage's calls merged into one order the program can make them in: a call comes
    after the calls whose outputs it reads, and each stage's calls keep the stage's order.
    Stages take turns (lowest stage first), each going as far as its inputs allow."""
    _check(stages, microbatches)
    queues = [stage_order(schedule, s, stages, microbatches) for s in range(stages)]
    done: set[tuple[int, Kind, int]] = set()
    out: list[Call] = []
    while any(queues):
        progressed = False
        for q in queues:
            while q and _inputs_ready(q[0], stages, done):
                call = q.pop(0)
                done.add(tuple(call))
                out.append(call)
                progressed = True
        if not progressed:  # cannot happen for the schedules above: a guard for new ones
            raise RuntimeError(f"schedule {schedule} waits in a circle: next calls "
                               f"{[q[0].name for q in queues if q]}.")
    return out


def _inputs_ready(call: Call, stages: int, done: set) -> bool:
    s, kind, m = call
    if kind is Kind.FWD:
        return s == 0 or (s - 1, Kind.FWD, m) in done
    return (s, Kind.FWD, m) in done and (s == stages - 1 or (s + 1, Kind.BWD, m) in done)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"a pipeline needs stages >= 1 and microbatches >= 1, got "
                         f"stages={stages}, microbatches={microbatches}.")


def in_flight(calls: list[Call]) -> int:
    """The most microbatches whose forward ran and backward did not yet, along ``calls`` (one
    stage's order): how many microbatches' residuals that stage holds at its peak."""
    live = peak = 0
    for call in calls:
        live += 1 if call.kind is Kind.FWD else -1 if call.kind is Kind.BWD else 0
        peak = max(peak, live)
    return peak

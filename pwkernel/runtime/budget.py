"""The memory budget: whose buffers take the memory a waiting computation needs, and whether
waiting can ever end.

A computation (or copy) that does not fit the budget waits for buffers to be freed. Buffers are
freed in two ways: the runtime frees a value once the computations reading it have run, and the
user frees what only they reference (``del fut``). So when nothing is running or in flight
anywhere, a computation at the head of its devices' queue can still start only if it would fit
once every buffer *only the user* references were gone. If even that would not make room, the
memory is pinned by values that wait for work that cannot run: the programs involved are stuck,
and the runtime fails one of them with a ``MemoryBudgetError`` that says whose buffers take
what.

A live buffer is pinned by the runtime while its program is still running (its values are the
program's own, outputs included) or while a queued computation or copy of any program reads
it. Everything else only the user can free.

When every computation that waits could start once the user drops some of their futures, it
waits for them (back-pressure), and the runtime says so once with a ``MemoryWaitWarning``
(``wait_message``): what waits, and the user's largest buffers in its way.

This module is pure: the dispatcher gathers the facts under its locks and asks ``stuck``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .objects import BufferRecord
from .units import human_bytes


@dataclass(frozen=True, slots=True)
class Waiting:
    """A computation or copy at the head of its devices' queue that waits only for memory."""

    name: str           # the node's name
    island: int
    devices: frozenset[int]
    nbytes: int         # bytes it needs on each of its devices
    run: int            # its program run
    program: str
    client: str
    task: int = -1      # its task id (what tells one wait from the next)


@dataclass(frozen=True, slots=True)
class LiveBuffer:
    """A live buffer on the island, and whether it is pinned (only the runtime can free it)."""

    record: BufferRecord
    pinned: bool
    # the runs (id, program) whose queued computations read it, when only they pin it (its
    # own program has ended: a value the user passed on to a later program)
    read_by: tuple[tuple[int, str], ...] = ()
    name: str | None = None  # its future's name, if a future holds it


Held = LiveBuffer  # its name before the glossary (docs/architecture.md) kept "hold" for islands


def fits_once_user_frees(w: Waiting, budget: int, in_use: Mapping[int, int],
                         live: Iterable[LiveBuffer]) -> bool:
    """Would ``w`` fit if the user dropped every buffer that only they reference?"""
    freeable = dict.fromkeys(w.devices, 0)
    for h in live:
        if h.record.reserved and not h.pinned:
            for d, n in h.record.nbytes.items():
                if d in freeable:
                    freeable[d] += n
    return all(in_use.get(d, 0) - freeable[d] + w.nbytes <= budget for d in w.devices)


def stuck(waiting: list[Waiting], budget: int, in_use: Mapping[int, int], live: list[LiveBuffer],
          queued_runs: Iterable[int], freed_by_user: Iterable[int] = ()
          ) -> tuple[Waiting, int] | None:
    """When nothing runs or is in flight anywhere: the first waiting computation that cannot
    start even once the user frees what they reference, and the program run to fail for it; None
    when each could (that is back-pressure, and it waits).

    ``freed_by_user``: runs whose work waits elsewhere (another island) for memory the user
    can free: what they pin goes once that work runs, so it counts as the user's to free.

    The run chosen is the youngest of those that pin memory on the stuck computation's
    devices and have work queued on the island (failing it frees that memory); when none
    does, the stuck computation's own run. A buffer of an ended program that queued work
    reads is pinned by its readers, not by its program."""
    later = set(freed_by_user)
    if later:
        live = [LiveBuffer(h.record, False) if h.record.program_id in later else h
                for h in live]
    for w in waiting:
        if not fits_once_user_frees(w, budget, in_use, live):
            pinning = set()
            for h in live:
                if h.pinned and w.devices & h.record.nbytes.keys():
                    pinning |= ({rid for rid, _ in h.read_by} if h.read_by
                                else {h.record.program_id})
            candidates = pinning & set(queued_runs)
            return w, (max(candidates) if candidates else w.run)
    return None


def message(stuck: Waiting, victim: str, budget: int, in_use: Mapping[int, int],
            live: list[LiveBuffer]) -> str:
    """What the ``MemoryBudgetError`` says: the budget, what waits, and whose buffers take what.
    ``victim``: the program stopped, in words."""
    device = max(sorted(stuck.devices), key=lambda d: in_use.get(d, 0))
    by_owner: dict[tuple, list[int]] = {}
    for h in live:
        n = h.record.nbytes.get(device)
        if n and h.record.reserved:
            r = h.record
            by_owner.setdefault((r.program_id, r.program, r.client, h.pinned, h.read_by),
                                []).append(n)
    owners = sorted(by_owner.items(), key=lambda kv: -sum(kv[1]))
    lines = [f"  {human_bytes(sum(ns))} in {len(ns)} buffer{'s' * (len(ns) != 1)} of program "
             f"{prog!r} (run {rid}, client {client!r}), "
             + _why_held(pinned, read_by)
             for (rid, prog, client, pinned, read_by), ns in owners]
    return (
        f"{victim} was stopped: it cannot go on under the memory budget of {human_bytes(budget)} "
        f"per device. {stuck.name!r} (program {stuck.program!r}, run {stuck.run}, client "
        f"{stuck.client!r}) on island {stuck.island} needs {human_bytes(stuck.nbytes)} more on "
        f"devices {sorted(stuck.devices)}, and nothing is running that could free memory "
        f"there. Held on device {device} ({human_bytes(in_use.get(device, 0))} in use):\n"
        + "\n".join(lines or ["  (nothing)"])
        + "\nMaybe you want a larger memory_budget (pw.Controller(memory_budget=...)), or a "
        "program that keeps fewer values alive at once (e.g. consume each value before making "
        "the next)."
    )


def _why_held(pinned: bool, read_by: tuple[tuple[int, str], ...]) -> str:
    if not pinned:
        return "held only by your references"
    if not read_by:
        return "held for its computations that have not run"
    readers = ", ".join(f"program {name!r} (run {rid})" for rid, name in read_by)
    return f"its program has ended; held because computations of {readers} that have not " \
           "run read them"


def wait_message(w: Waiting, budget: int, in_use: Mapping[int, int], live: Iterable[LiveBuffer],
                 others: int = 0, most: int = 5) -> str:
    """What the ``MemoryWaitWarning`` says: ``w`` waits for memory that only the user's
    references hold, with the ``most`` largest of those buffers on its devices. ``others``:
    how many more computations wait likewise."""
    device = max(sorted(w.devices), key=lambda d: in_use.get(d, 0))
    mine = sorted(((max(n for d, n in h.record.nbytes.items() if d in w.devices), h)
                   for h in live if h.record.reserved and not h.pinned
                   and w.devices & h.record.nbytes.keys()), key=lambda nh: -nh[0])
    lines = [f"  {human_bytes(n)}: future {h.name or '(unnamed)'!r} of program "
             f"{h.record.program!r} (run {h.record.program_id})" for n, h in mine[:most]]
    if len(mine) > most:
        rest = mine[most:]
        lines.append(f"  and {len(rest)} more ({human_bytes(sum(n for n, _ in rest))})")
    also = (f" {others} other computation{'s' * (others != 1)} on island {w.island} "
            f"wait{'s' * (others == 1)} likewise." if others else "")
    return (
        f"{w.name!r} (program {w.program!r}, run {w.run}, client {w.client!r}) on island "
        f"{w.island} waits for memory: it needs {human_bytes(w.nbytes)} more on devices "
        f"{sorted(w.devices)} under the memory budget of {human_bytes(budget)} per device "
        f"({human_bytes(in_use.get(device, 0))} in use on device {device}), nothing is running "
        f"that could free any, and the room it needs is held only by your own futures, so it "
        f"waits until you drop them.{also} Your largest on its devices:\n"
        + "\n".join(lines or ["  (none)"])
        + "\nDrop them: del fut, or take fut.result() and drop the future; or raise "
        "memory_budget (pw.Controller(memory_budget=...))."
    )

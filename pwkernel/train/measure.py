"""What a training step did, measured: the bubble and the residuals alive, read from the trace,
and device memory sampled while a step runs. Shared by the tutorial, the benchmark and tests.

- ``bubble(events)``: the share of device time left idle inside a step (pipelining's cost).
- ``stage_order_seen(events)``: each stage's forwards and backwards in the order its devices
  ran them, read back from the trace's names (``s1.fwd[m2]``) and start times.
- ``peak_residuals(events, residual_bytes)``: per stage, the most residual bytes alive at once,
  taking microbatch m's residuals on stage s as alive from the start of ``s{s}.fwd[m{m}]`` to
  the end of ``s{s}.bwd[m{m}]`` (the backward is their last reader).
- ``MemorySampler(ctl)``: ``ctl.memory()`` sampled from a thread while a block runs.

>>> from pwkernel.runtime.trace import Event
>>> ev = [Event(0, "compute", "s0.fwd[m0]", "p", 1, "c", 0, (0,), 0.0, 0.0, 1.0),
...       Event(1, "compute", "s0.bwd[m0]", "p", 1, "c", 0, (0,), 0.0, 2.0, 3.0),
...       Event(2, "compute", "s1.fwd[m0]", "p", 1, "c", 0, (1,), 0.0, 1.0, 2.0)]
>>> round(bubble(ev), 3)        # device 0 busy 2 of 3 s, device 1 busy 1 of 3 s
0.5
>>> peak_residuals(ev, [100, 10])
[100, 10]
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence

from ..runtime.keywords import suggests_keywords
from ..runtime.trace import Event
from .schedule import Call, Kind, parse_name


def _computations(events: Iterable[Event]) -> list[Event]:
    return [e for e in events if e.kind == "compute" and e.status == "ok"]


def steps(events: Iterable[Event], program: str | None = None) -> list[list[Event]]:
    """The computations of ``events`` grouped by the program run they belong to (one list per
    step, in order), only those of programs named ``program`` if given."""
    runs: dict[int, list[Event]] = defaultdict(list)
    for e in _computations(events):
        if program is None or e.program == program:
            runs[e.program_id].append(e)
    return [runs[k] for k in sorted(runs)]


def bubble(events: Iterable[Event]) -> float:
    """The idle share of device time from the first computation's start to the last one's end,
    over every device that ran one of ``events``' computations: 0 when every device was busy
    all along. Give the events of one step (``steps(...)[i]``)."""
    comp = _computations(events)
    if not comp:
        raise ValueError("bubble() needs the trace events of at least one computation; got "
                         "none. Maybe you want ctl.trace.events(since=k) after the step.")
    t0, t1 = min(e.t_start for e in comp), max(e.t_end for e in comp)
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in comp:
        for d in e.devices:
            spans[d].append((e.t_start, e.t_end))
    if t1 <= t0:
        return 0.0
    busy = sum(_union(s) for s in spans.values())
    return 1.0 - busy / (len(spans) * (t1 - t0))


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def stage_order_seen(events: Iterable[Event]) -> dict[int, list[Call]]:
    """Each stage's forward and backward calls in the order they started on its devices."""
    seen: dict[int, list[tuple[float, int, Call]]] = defaultdict(list)
    for e in _computations(events):
        call = parse_name(e.name)
        if call is not None and call.kind is not Kind.UPDATE:
            seen[call.stage].append((e.t_start, e.index, call))
    return {s: [c for _, _, c in sorted(v)] for s, v in sorted(seen.items())}


def peak_residuals(events: Iterable[Event], residual_bytes: Sequence[int]) -> list[int]:
    """Per stage, the most bytes of microbatch residuals alive at once during ``events`` (one
    or more steps): ``residual_bytes[s]`` for each microbatch between the start of its forward
    and the end of its backward on stage s (``Pipeline.residual_bytes``). Marks at equal times
    go in the trace's order, which on a stage's devices is the order they ran the calls in."""
    if residual_bytes is None:
        raise TypeError("peak_residuals needs residual_bytes, bytes per microbatch for each "
                        "stage, got None: Pipeline.residual_bytes is known after the "
                        "pipeline's first step. Maybe you want to call it after pipe.step(...), "
                        "or give [1] * stages to count microbatches.")
    marks: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for e in _computations(events):
        call = parse_name(e.name)
        if call is None or call.kind is Kind.UPDATE:
            continue
        if call.stage >= len(residual_bytes):
            raise ValueError(f"the trace has stage {call.stage} but residual_bytes has "
                             f"{len(residual_bytes)} entries (one per stage).")
        n = residual_bytes[call.stage]
        # At equal times, the order the stage's devices ran the calls in, which is the order
        # their ends were recorded (the trace's index): a backward ending as the next forward
        # starts does not overlap it, but a forward and the backward behind it, both stamped
        # at the instant a late end was seen (zero-length spans), do.
        marks[call.stage].append((e.t_start, e.index, n) if call.kind is Kind.FWD
                                 else (e.t_end, e.index, -n))
    out = []
    for s in range(len(residual_bytes)):
        live = peak = 0
        for _, _, delta in sorted(marks.get(s, [])):
            live += delta
            peak = max(peak, live)
        out.append(peak)
    return out


@suggests_keywords("pw.train.MemorySampler")
class MemorySampler:
    """Samples ``ctl.memory()`` from a thread while the ``with`` block runs.

    ``baseline``: bytes per device when the block began; ``peak``: the most seen per device;
    ``peak_above_baseline``: the largest rise on any one device (what a step added on top of
    what was already held, e.g. its activations). Sampling misses peaks shorter than
    ``interval`` plus a thread wake-up; ``peak_residuals`` reads the trace instead.

    >>> with MemorySampler(ctl) as mem:                    # doctest: +SKIP
    ...     state, loss = pipe.step(state, batch); wait((state, loss))
    >>> mem.peak_above_baseline                            # doctest: +SKIP
    """

    def __init__(self, ctl, interval: float = 2e-4):
        self.ctl, self.interval = ctl, interval
        self.baseline: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for d, n in self.ctl.memory().items():
            if n > self.peak.get(d.id, -1):
                self.peak[d.id] = n
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self.baseline = {d.id: n for d, n in self.ctl.memory().items()}
        self.peak = dict(self.baseline)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pw-train-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()

    @property
    def peak_above_baseline(self) -> int:
        return max((self.peak[d] - self.baseline.get(d, 0) for d in self.peak), default=0)

"""What a program run asks of whoever dispatches it: the port between ``tasks.py`` and its owner.

A ``ProgramRun`` (``tasks.py``) moves its tasks through their states and ends them; what it
cannot do itself (count values for the nodes waiting on them, tell an island's scheduler that
devices are free, start a copy, close the run's books) it asks of its owner through this small
interface, which ``Dispatcher`` implements. The run never sees the dispatcher's islands, queues
or executor, and this module imports none of them, so the runtime's modules stay in one
direction: owner <- tasks <- islands <- dispatcher.

Why a port and not returned instructions (``handle(event) -> instructions``, as the gang
scheduler does): a task's end is the hot path of dispatch (one per computation, often seen in
the launching thread right after the call); building instruction objects and a loop to carry
them out would cost host time on every one of them, where a call through this port costs one
method call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class RunOwner(Protocol):
    """The dispatcher, as a run sees it (``Dispatcher`` implements it)."""

    #: time is a virtual clock that moves only while someone waits (the simulator)
    virtual: bool
    #: bytes per device the island schedulers may reserve, or None
    memory_budget: int | None
    #: a launch holds its inputs' buffers (the executor's ``launch_holds_inputs``): a run lets
    #: go of a value it made once the value's last reader has launched (optional: False)
    launch_holds_inputs: bool
    #: the event log (``runtime.trace.Trace``)
    trace: Any

    def now(self) -> float:
        """The clock of every time the runtime keeps."""

    def arrived(self, run: Any, *slots: int, gates_only: bool = False) -> None:
        """Values of ``run`` are there (launched in parallel dispatch, ended in sequential):
        count them for the nodes that wait on them (``gates_only``: only for the donating
        nodes they gate, ``plan.py``: their producer failed)."""

    def start_copy(self, task: Any) -> None:
        """The destination's scheduler admitted this copy (it is RUNNING): start it."""

    def computation_ended(self, task: Any, seconds: float) -> None:
        """A launched computation ended: its devices are free for what its island queued."""

    def release_memory(self, island: int, devices: Sequence[int], nbytes: int) -> None:
        """Give ``nbytes`` per device of ``devices`` back to ``island``'s scheduler."""

    def drop_queued(self, island: int, tasks: Sequence[Any]) -> list:
        """Take ``tasks`` out of ``island``'s scheduler in one step; returns those dropped
        (the others launched meanwhile)."""

    def work_began(self) -> None:
        """One more piece of work in flight (counted under a memory budget)."""

    def work_ended(self) -> None:
        """One piece of work in flight ended, its frees done."""

    def check_memory_when_idle(self) -> None:
        """Look for work stuck waiting for memory once nothing runs."""

    def run_ended(self, run: Any) -> None:
        """``run`` is over, bookkeeping included."""

    def expedite(self, task: Any, timeout: float | None) -> None:
        """A thread is about to wait for ``task``'s outputs (the executor may hurry)."""

    def settle(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Under a virtual clock: move it until ``predicate()`` holds."""

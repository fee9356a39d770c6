"""Ctrl-C at any moment of a ``%%pathways`` cell's run, once its program was submitted:
before the cell waits (its display made, its wait set up) as while it waits, the program is
cancelled, the cell binds nothing, and the next cell runs on the same controller.

The interrupt is raised at a chosen point, right after the real work there is done: what
Python's ``SIGINT`` handler does between two bytecodes, at a moment a test can pick."""

from __future__ import annotations

import re
import signal
import threading

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.notebook import cell as cells
from pwkernel.notebook import endings, extension
from pwkernel.notebook.magics import PathwaysMagics
from pwkernel.runtime.tasks import TaskState
from tests.helpers.programs import gate
from tests.helpers.shell import run

# (where the interrupt lands, the cell's flags): between the submission and the wait, in the
# magic (its display) and at the wait's start (its futures' event), blocking or not
POINTS = [(PathwaysMagics, "_show", ""), (endings, "all_resolved", ""),
          (PathwaysMagics, "_show", " --no-block")]


@pytest.mark.parametrize(("owner", "point", "flags"), POINTS,
                         ids=["before-wait", "wait-start", "no-block"])
def test_an_interrupt_after_the_submission_cancels_the_cells_program(ip, monkeypatch, owner,
                                                                   point, flags):
    release = _slice_held(ip)
    seen: list = []
    real = getattr(owner, point)

    def interrupted(*args, **kwargs):
        seen.append(list(_cell_run(args).tasks))  # (a run lets go of its tasks at its end)
        real(*args, **kwargs)  # (the work there done first)
        monkeypatch.setattr(owner, point, real)  # (once: the next cell runs as usual)
        raise KeyboardInterrupt
    monkeypatch.setattr(owner, point, interrupted)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            run(ip, f"%%pathways --slice s{flags}\nnever_bound = jnp.ones(2) * 3\n")
    finally:
        release.set()
    assert seen, f"the cell never reached {point}"
    ctl = extension.state().ctl
    assert ctl.wait(60)
    assert "never_bound" not in ip.user_ns
    states = [t.state for t in seen[0]]
    assert states and set(states) == {TaskState.CANCELLED}, states  # none ran after Ctrl-C
    assert "cancelled the queued computations" in str(info.value), info.value
    run(ip, "held.result(60);")
    run(ip, "%%pathways --slice s\nafter = jnp.ones(2) * 3\n")  # the controller goes on
    np.testing.assert_allclose(np.asarray(ip.user_ns["after"]), [3.0, 3.0])


def _slice_held(ip) -> threading.Event:
    """Slice ``s`` (2 devices) busy with ``held = blocker(...)`` until the event returned is
    set: a cell's program queues behind it."""
    run(ip, "%pathways slice s 2")
    entered, release = threading.Event(), threading.Event()
    ip.user_ns["blocker"] = pw.function(gate(entered, release, ip.user_ns["s"].mesh),
                                        slice=ip.user_ns["s"], in_specs=pw.BATCH)
    run(ip, "held = blocker(np.ones(2, np.float32))")
    assert entered.wait(60)
    return release


def _cell_run(args):
    """The cell's run from the arguments of the point the interrupt came at."""
    if isinstance(args[0], list):  # all_resolved(outputs)
        return args[0][0].run
    return args[-1]  # _show(self, a, ctl, run)


class _InterruptedAfterFirst(dict):
    """A cell's bound names whose binding a Ctrl-C lands in, after the first name: the
    SIGINT handler in place runs there, as Python runs it between two bytecodes."""

    def items(self):
        for i, item in enumerate(super().items()):
            if i == 1:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            yield item


@pytest.mark.parametrize("flags", ["", " --no-block"])
def test_an_interrupt_while_a_cell_binds_its_names_binds_all_of_them(ip, monkeypatch, flags):
    run(ip, "%pathways slice s 2")
    ip.user_ns.update(a="old", b="old", c="old")
    real = cells.bound_values
    monkeypatch.setattr(cells, "bound_values",
                        lambda *args: _InterruptedAfterFirst(real(*args)))
    with pytest.raises(KeyboardInterrupt):  # (raised once they are bound, or before any)
        run(ip, f"%%pathways --slice s{flags}\na = jnp.ones(2)\nb = a + 1\nc = b + 1\n")
        threading.Event().wait(60)  # (a kept interrupt comes GRACE after the binding)
    monkeypatch.setattr(cells, "bound_values", real)
    seen = [ip.user_ns[n] for n in "abc"]
    assert all(isinstance(v, pw.Future) for v in seen), seen  # all bound, not the first only
    for value, want in zip(seen, [1.0, 2.0, 3.0], strict=True):
        np.testing.assert_allclose(np.asarray(value.result(60)), [want, want])
    run(ip, "%%pathways --slice s\nafter = a + c\n")  # the next cell reads them
    np.testing.assert_allclose(np.asarray(ip.user_ns["after"]), [4.0, 4.0])


def test_an_interrupt_while_a_cell_submits_cancels_its_whole_program(ip, monkeypatch):
    """Ctrl-C as the runtime takes the cell's program: the submission ends whole (it runs
    under the runtime's hold), then the program is cancelled and the cell binds nothing.
    Raised inside it, the program went on, out of the cell's reach."""
    release = _slice_held(ip)
    ctl = extension.state().ctl
    real, taken = ctl.submit, []

    def interrupted(*args, **kwargs):
        futs = real(*args, **kwargs)
        taken.append(list(futs[0].run.tasks))  # (a run lets go of its tasks at its end)
        monkeypatch.delattr(ctl, "submit")  # (once: the next cell submits as usual)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # (as Python runs it)
        return futs
    monkeypatch.setattr(ctl, "submit", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            run(ip, "%%pathways --slice s\nnever_bound = jnp.ones(2) * 3\n")
    finally:
        release.set()
    assert taken, "the cell never submitted"
    assert ctl.wait(60)
    assert "cancelled the queued computations" in str(info.value), info.value
    states = [t.state for t in taken[0]]
    assert states and set(states) == {TaskState.CANCELLED}, states
    assert "never_bound" not in ip.user_ns
    run(ip, "held.result(60);")
    run(ip, "%%pathways --slice s\nafter = jnp.ones(2) * 3\n")
    np.testing.assert_allclose(np.asarray(ip.user_ns["after"]), [3.0, 3.0])


@pytest.mark.parametrize("stop", ["interrupt", "timeout"])
def test_a_step_already_running_when_the_cell_is_stopped_keeps_the_training_state(
        ip, monkeypatch, stop):
    """Ctrl-C (or ``--timeout``) while ``w = step(w); l = total(w)`` waits, its step (with
    ``donate_argnums``) already running: the step is not recalled, it consumed ``w``'s buffers
    and runs to its end, so the cell binds ``w`` to its result and says so; ``total``, still
    queued, is cancelled and ``l`` keeps what it held (or, launched behind the step, is
    bound). Before, the cell bound nothing: ``w`` held the donated buffers and the new state
    was dropped, the training state lost."""
    run(ip, "%pathways slice s 2")
    entered, release = threading.Event(), threading.Event()
    held = gate(entered, release, ip.user_ns["s"].mesh)
    ip.user_ns["step"] = pw.function(lambda w: held(w) * 2 + 1, slice=ip.user_ns["s"],
                                     in_specs=pw.BATCH, donate_argnums=0)
    ip.user_ns["total"] = pw.function(lambda w: w.sum(), slice=ip.user_ns["s"])
    run(ip, "%%pathways --slice s\nw = jax.device_put(jnp.arange(4.0), jax.P('x'))\nl = 0.0\n")
    real = endings.all_resolved

    def running_then_stopped(outputs):
        assert entered.wait(60)  # the step runs: launched, its input donated
        monkeypatch.setattr(endings, "all_resolved", real)
        if stop == "interrupt":
            raise KeyboardInterrupt
        return real(outputs)
    monkeypatch.setattr(endings, "all_resolved", running_then_stopped)
    flags = " --timeout 0.01" if stop == "timeout" else ""
    try:
        with pytest.raises((KeyboardInterrupt, TimeoutError)) as info:
            run(ip, f"%%pathways --slice s{flags}\nw = step(w)\nl = total(w)\n")
    finally:
        release.set()
    said = str(info.value)  # (``total`` may have launched too, behind the step)
    assert re.search(r"; bound (l, )?w to the futures of its computations already launched",
                     said), said
    assert extension.state().ctl.wait(60)
    np.testing.assert_allclose(np.asarray(ip.user_ns["w"]), [1.0, 3.0, 5.0, 7.0])
    want = 16.0 if "bound l, w" in said else 0.0  # (else cancelled: it keeps what it held)
    np.testing.assert_allclose(np.asarray(ip.user_ns["l"]), want)
    run(ip, "%%pathways --slice s\nw = step(w)\nl = total(w)\n")  # training goes on
    np.testing.assert_allclose(np.asarray(ip.user_ns["w"]), [3.0, 7.0, 11.0, 15.0])
    np.testing.assert_allclose(np.asarray(ip.user_ns["l"]), 36.0)

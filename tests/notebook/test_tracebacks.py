"""What a notebook shows when a %%pathways cell fails: IPython's traceback of the user's
frames only (the cell's lines, the functions it calls), never pwkernel's frames or source.

Each test reads the traceback as IPython renders it (``InteractiveShell`` prints it to
stdout), as a notebook user sees it."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.notebook import extension
from tests.helpers.programs import gate
from tests.helpers.shell import run


@pytest.fixture
def nb(ip, capsys):
    run(ip, "%pathways slice s 2")
    run(ip, "import threading, _thread")
    capsys.readouterr()
    return ip


def shown(ip, capsys, cell: str, error: type[BaseException]) -> str:
    """Run ``cell``, which fails with ``error``; the traceback text IPython printed."""
    result = ip.run_cell(cell)
    assert isinstance(result.error_in_exec, error), result.error_in_exec
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # (no colours)
    return text


def assert_users_frames_only(text: str) -> None:
    """No frame of pwkernel's (its path, its source); every frame shown is a cell's."""
    assert os.path.join("pwkernel", "") not in text, text
    assert "__tracebackhide__" not in text and "raise CellTimeout(" not in text, text
    headers = [line for line in text.splitlines()
               if line.startswith(("File ", "Cell In["))]
    assert headers and all(h.startswith("Cell In[") for h in headers), text


def test_a_timed_out_cell_shows_its_magic_line(nb, capsys):
    """``--timeout`` that runs out: the ``%%pathways`` line (where the limit was set) and
    ``CellTimeout``; before, the frame of ``magics.py`` that raised it, with its source."""
    entered, release = threading.Event(), threading.Event()
    nb.user_ns["blocker"] = pw.function(gate(entered, release, nb.user_ns["s"].mesh),
                                        slice=nb.user_ns["s"], in_specs=pw.BATCH)
    run(nb, "held = blocker(np.ones(2, np.float32))")  # the slice's devices are busy
    assert entered.wait(60)
    try:
        text = shown(nb, capsys, "%%pathways --slice s --timeout 0.2\n"
                     "never_bound = jnp.ones(2) * 3\n", TimeoutError)
    finally:
        release.set()
    run(nb, "held.result(60);")
    assert_users_frames_only(text)
    assert "----> 1 %%pathways --slice s --timeout 0.2" in text, text
    assert "CellTimeout: cell[" in text and "did not end within --timeout 0.2 s" in text
    assert "never_bound" not in nb.user_ns


def test_an_interrupt_while_the_cell_waits_shows_its_magic_line(nb, capsys):
    """Ctrl-C while the cell waits for its program (here sent by the program's own host
    callback, so it comes once the program runs): the cell's line and the
    ``KeyboardInterrupt``; before, the frame of ``magics.py`` that re-raised it."""
    release = threading.Event()
    nb.user_ns["release"] = release
    run(nb, "def poke(v):\n    _thread.interrupt_main()\n    release.wait(60)\n    return v\n")
    try:
        text = shown(nb, capsys, "%%pathways --slice s\nw = jnp.ones(2)\n"
                     "w2 = jax.pure_callback(poke, jax.ShapeDtypeStruct((2,), jnp.float32), w)\n",
                     KeyboardInterrupt)
    finally:
        release.set()
    assert extension.state().ctl.wait(60)
    assert_users_frames_only(text)
    assert "----> 1 %%pathways --slice s" in text and "KeyboardInterrupt" in text, text


def test_an_interrupt_while_the_cells_python_runs_shows_the_line_it_ran(nb, capsys):
    """Ctrl-C (here the cell's own raise) while the cell's Python is traced: the line that
    was running, and the one-line note that nothing was submitted; before, the frame of
    ``magics.py`` that re-raised it, and not the user's line."""
    text = shown(nb, capsys, "%%pathways --slice s\nq = jnp.ones(2)\nraise KeyboardInterrupt\n",
                 KeyboardInterrupt)
    assert_users_frames_only(text)
    assert "----> 3 raise KeyboardInterrupt" in text, text
    assert re.search(r"KeyboardInterrupt: cell\[\d+\] interrupted while its Python ran; "
                     "nothing of it was submitted", text), text



def test_an_interrupt_in_a_plain_python_loop_says_what_it_means(nb, capsys):
    """Ctrl-C (here the cell's own raise) in a ``while`` loop, which runs as plain Python
    (it reads values): the line, and a note that what it bound stays bound; before, a bare
    ``KeyboardInterrupt:`` with no word of the cell. The user's own message is kept."""
    text = shown(nb, capsys, "%%pathways --slice s\nn = 0\nwhile True:\n    n += 1\n"
                 "    if n == 3: raise KeyboardInterrupt\nq = jnp.ones(2) * n\n",
                 KeyboardInterrupt)
    assert_users_frames_only(text)
    assert "----> 5     if n == 3: raise KeyboardInterrupt" in text, text
    assert re.search(r"KeyboardInterrupt: cell\[\d+\] interrupted while its Python ran as "
                     "plain Python .*what it bound stays bound", text), text
    assert nb.user_ns["n"] == 3 and "q" not in nb.user_ns
    text = shown(nb, capsys, "%%pathways --slice s\nif n: raise KeyboardInterrupt('mine')\n",
                 KeyboardInterrupt)
    assert "KeyboardInterrupt: mine" in text, text

def test_a_cell_cancelled_while_queued_shows_its_magic_line(nb, capsys):
    """Cancel (the sidebar's button, ``run.cancel()``) while the cell's program has queued
    steps: the cell's line and ``CancelledError``; before, the frame of ``Future.result`` in
    ``pwkernel/runtime/objects.py``, with its source."""
    entered, release = threading.Event(), threading.Event()
    ctl = extension.state().ctl
    nb.user_ns["step"] = pw.function(gate(entered, release), slice=ctl.slice(1, island=0))
    nb.user_ns["x"] = np.ones(4, np.float32)

    def cancel_the_cell() -> None:
        if entered.wait(60):
            for r in ctl.runs():
                r.cancel()
        release.set()
    canceller = threading.Thread(target=cancel_the_cell)
    canceller.start()
    try:
        text = shown(nb, capsys, "%%pathways\ny = step(x)\ny = step(y)\n", pw.CancelledError)
    finally:
        release.set()
        canceller.join(60)
    assert ctl.wait(60)
    assert_users_frames_only(text)
    assert "----> 1 %%pathways" in text and "CancelledError: program 'cell[" in text, text


@pytest.mark.parametrize(("cell", "line", "error"), [
    # an error in the user's code, traced (a function the cell calls)
    ("def f(v):\n    raise ValueError('user code raised')\ny = f(jnp.ones(2))\n",
     "----> 3     raise ValueError", ValueError),
    # in a plain-Python statement (one that needs a value)
    ("y = jnp.ones(2)\nprint(float(y.sum()))\nint('x')\n", "----> 4 int('x')", ValueError),
    # a compiled function (of an earlier cell) called with a missing argument
    ("z = g(jnp.ones(2))\n", "----> 2 z = g(jnp.ones(2))", pw.ProgramError),
    # a host callback that raised while the program ran
    ("def bad(v):\n    raise ValueError(f'bad {v}')\n"
     "w = jax.pure_callback(bad, jax.ShapeDtypeStruct((2,), jnp.float32), jnp.ones(2))\n",
     "----> 3     raise ValueError", ValueError),
    ("z = jnp.ones(2) + undefined_name\n", "----> 2 z = jnp.ones(2) + undefined_name",
     NameError),
])
def test_errors_in_the_cells_code_show_its_lines(nb, capsys, cell, line, error):
    run(nb, "g = pw.function(lambda a, b: a + b, slice=s)")
    capsys.readouterr()
    text = shown(nb, capsys, "%%pathways --slice s\n" + cell, error)
    assert_users_frames_only(text)
    assert line in text, text


@pytest.mark.parametrize(("cell", "line", "error"), [
    ("\n\ny = jnp.ones(2)\nz = jnp.ones(3) @ y\n", "----> 5 z = jnp.ones(3) @ y", TypeError),
    ("\n \ny = jnp.ones(2)\nprint(float(y.sum()))\nint('x')\n", "----> 6 int('x')",
     ValueError),
    ("\ndef f(v):\n    raise ValueError('user code raised')\ny = f(jnp.ones(2))\n",
     "----> 5 y = f(jnp.ones(2))", ValueError),
])
def test_blank_lines_under_the_magic_line_keep_the_cells_line_numbers(nb, capsys, cell, line,
                                                                      error):
    """IPython drops a cell's leading blank lines before its code runs; the traceback counts
    them, as the notebook shows the cell. Before, each line shown was off by that many."""
    text = shown(nb, capsys, "%%pathways --slice s\n" + cell, error)
    assert_users_frames_only(text)
    assert line in text, text

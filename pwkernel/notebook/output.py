"""Where a cell's computations print: the cell that ran them.

Computations run in the runtime's worker threads and XLA's own threads. ipykernel attributes
output written from such threads to the *latest* execute request (its global parent header),
which is the right cell only while that cell is still running. Two things make it right after
that too, for ``jax.debug.print`` calls written in a ``%%pathways`` cell:

- the cell's prints are rewritten to ``CellOutput.debug_print``, whose callback writes with the
  cell's own parent header (``OutStream.set_thread_parent``) while the cell runs;
- once the cell has returned (``--no-block``), frontends drop messages for finished requests,
  so the lines go into a display the cell created (``display(..., display_id=True)``) and are
  shown by updating it. Updates sent while the kernel was idle are sent again when the next
  cell starts (``pre_run_cell``), so frontends that ignored them (nbclient) get them.
"""

from __future__ import annotations

import html
import sys
import threading

import jax


class CellOutput:
    """The output channel of one ``%%pathways`` cell."""

    def __init__(self, name: str):
        self.name = name
        stream = sys.stdout
        self._stream = stream
        self._parent = getattr(stream, "parent_header", None)
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._status = "running"
        self._handle = None
        self._dirty = False

    # --- jax.debug.print replacement ------------------------------------------------------
    def debug_print(self, fmt: str, *args, **kwargs) -> None:
        """``jax.debug.print(fmt, *args, **kwargs)`` that prints into this cell."""
        jax.debug.callback(lambda *a, **k: self.write(fmt.format(*a, **k) + "\n"),
                           *args, **kwargs)

    def write(self, text: str) -> None:
        if self._handle is not None:
            with self._lock:
                self._lines.append(text)
                self._dirty = True
            self.refresh()
            return
        setter = getattr(self._stream, "set_thread_parent", None)
        if setter is None or not self._parent:
            self._stream.write(text)
            self._stream.flush()
            return
        token = setter(self._parent)
        try:
            self._stream.write(text)
            self._stream.flush()
        finally:
            self._stream.reset_thread_parent(token)

    # --- live display after the cell returned (--no-block) ---------------------------------
    def detach(self) -> None:
        """The cell returns now: show later output in a display that stays in the cell."""
        from IPython.display import display

        self._handle = display(self, display_id=True)

    def finish(self, status: str) -> None:
        with self._lock:
            self._status = status
            self._dirty = True
        self.refresh()

    def refresh(self) -> None:
        if self._handle is None:
            return
        with self._lock:
            self._dirty = False
        try:
            self._handle.update(self)
        except Exception:  # the kernel is shutting down: nothing to show it on
            pass

    def resend(self) -> bool:
        """Send the display again (a new cell started); False once it is final."""
        self.refresh()
        return self._status == "running"

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def __repr__(self) -> str:
        return f"[{self.name}: {self._status}]\n{self.text}".rstrip("\n")

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        body = html.escape(self.text)
        return (f"<div><code>{html.escape(self.name)}: {html.escape(self._status)}</code>"
                f"<pre style='margin:2px 0'>{body}</pre></div>")


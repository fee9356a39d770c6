"""The bridge from Bokeh documents to ipywidgets, made safe for streaming from a thread.

Two problems with using ``jupyter_bokeh.BokehModel`` as it is:

- jupyter_bokeh 4.1's frontend replays every patch it receives back to the kernel as a
  "jsevent" (its change handler runs after the patch is applied). A streamed
  ``ColumnsStreamed`` then gets appended a second time on the Python side: the browser shows
  N rows, the kernel holds 2N. ``EchoFreeBokehModel`` ignores data events that come from the
  frontend: in these views only the kernel writes data, so nothing legitimate is lost.
  Range and selection changes (pan, zoom, tap) still flow back.
- Bokeh documents are not thread-safe. The views change their documents from an updater
  thread while the kernel's shell thread applies frontend events; ``lock`` serializes both.

The BokehModel widget renders only if BokehJS is already in the page; ``ensure_bokehjs()``
puts it there from the installed package (inline, never from a CDN).
"""

from __future__ import annotations

import threading
from typing import Any

from bokeh.models import LayoutDOM
from jupyter_bokeh import BokehModel

# Data changes the frontend may echo back; the kernel is the only writer of data here.
_ECHOED_KINDS = frozenset({"ColumnsStreamed", "ColumnsPatched", "ColumnDataChanged"})

_bokehjs_loaded = False
_bokehjs_lock = threading.Lock()


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def ensure_bokehjs(force: bool = False) -> bool:
    """Load BokehJS into the notebook page, inline, once per kernel; True if it was sent now.

    Outside a Jupyter kernel (plain Python, pytest) there is no page, and nothing happens.
    """
    global _bokehjs_loaded
    if not _in_kernel():
        return False
    with _bokehjs_lock:
        if _bokehjs_loaded and not force:
            return False
        from bokeh.io import output_notebook
        from bokeh.resources import INLINE

        output_notebook(resources=INLINE, hide_banner=True)
        _bokehjs_loaded = True
        return True


class EchoFreeBokehModel(BokehModel):
    """A ``BokehModel`` that drops data events echoed by the frontend and takes a lock.

    >>> from bokeh.plotting import figure
    >>> w = EchoFreeBokehModel(figure())
    >>> w.close()
    """

    def __init__(self, model: LayoutDOM, lock: threading.RLock | None = None, **kwargs: Any):
        self.lock = lock or threading.RLock()
        self.ignored_echoes = 0  # how many echoed data events were dropped (for diagnostics)
        super().__init__(model, **kwargs)

    def close(self) -> None:
        # jupyter_bokeh's close() unregisters from the document without checking it was still
        # registered, so a second close (e.g. ipywidgets' __del__) raised KeyError.
        if self.comm is None:
            return
        with self.lock:
            try:
                super().close()
            except KeyError:
                pass

    @staticmethod
    def _is_data_echo(content: dict[str, Any]) -> bool:
        kind = content.get("kind")
        if kind in _ECHOED_KINDS:
            return True
        # A whole new ``data`` dict echoed back would also overwrite rows streamed since.
        return kind == "ModelChanged" and content.get("attr") == "data"

    def _sync_model(self, _model: BokehModel, content: dict[str, Any], _buffers: list[Any]
                    ) -> None:
        if content.get("event", "") == "jsevent" and self._is_data_echo(content):
            self.ignored_echoes += 1
            return
        with self.lock:
            super()._sync_model(_model, content, _buffers)

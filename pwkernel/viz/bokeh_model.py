"""The bridge from Bokeh documents to ipywidgets, made safe for streaming from a thread.

Two problems with using ``jupyter_bokeh.BokehModel`` as it is:

- jupyter_bokeh 4.1's frontend replays every patch it receives back to the kernel as a
  "jsevent" (its change handler runs after the patch is applied). A streamed
  ``ColumnsStreamed`` then gets appended a second time on the Python side: the browser shows
  N rows, the kernel holds 2N. ``EchoFreeBokehModel`` ignores data events that come from the
  frontend: in these views only the kernel writes data, so nothing legitimate is lost.
  Range and selection changes (pan, zoom, tap) still flow back, except a property's echo
  of a value the kernel sent it (``_sent``: the last ``ECHO_MEMORY`` per property). The page
  echoes late (one message each time the kernel goes idle, so all through a long cell), and an
  old axis bound applied then would undo the bounds set since: ``view.x_range`` would read
  what the page showed seconds ago.
- Bokeh documents are not thread-safe. The views change their documents from an updater
  thread while the kernel's shell thread applies frontend events; ``lock`` serializes both.

Besides, jupyter_bokeh sends every document change as its own Bokeh message, in three widget
messages plus two per binary array. ``EchoFreeBokehModel.batch()`` gathers the changes made
inside it (the streams of three sources, the names, the time axis) into one Bokeh message, so
a live update sends its header, metadata and content once. (Arrays stay binary: BokehJS's
inline base64 form needs gzip, and the page applied level 0 and level 1 streams wrongly.)

A page draws the widget from its ``render_bundle`` (the whole document, made when the widget
was created) and then applies only the patches it receives after drawing: a view displayed
after rows were streamed, displayed a second time, or drawn while rows were streaming would
miss them. ``refresh()`` remakes the bundle from the document as it is now (the views call it
when they are displayed), and when a page reports its drawing done (Bokeh's
``DocumentReady``) after patches it may have missed, every data source is sent to it again.

The BokehModel widget renders only if BokehJS is already in the page; ``ensure_bokehjs()``
puts it there from the installed package (inline, never from a CDN), when the first widget is
made in a kernel (a view shown only inside a container is never displayed itself).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bokeh.core.serialization import Serializer
from bokeh.document.events import (
    ColumnDataChangedEvent,
    DocumentPatchedEvent,
    ModelChangedEvent,
)
from bokeh.events import DocumentReady
from bokeh.model import Model
from bokeh.models import ColumnDataSource, GlyphRenderer, LayoutDOM, Range1d
from bokeh.protocol.messages.patch_doc import PatchJson, patch_doc
from jupyter_bokeh import BokehModel

# Data changes the frontend may echo back; the kernel is the only writer of data here.
_ECHOED_KINDS = frozenset({"ColumnsStreamed", "ColumnsPatched", "ColumnDataChanged"})

# How many values sent per model property are known as echoes when they come back.
ECHO_MEMORY = 256
_SCALARS = (bool, int, float, str)
# The message that tells the page (extension/src/bokehdocs.ts) a closing widget's plot root.
RELEASE = "pw-release"

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
        # BokehJS goes to the page now, not only when a view is displayed: a view shown
        # inside a container (``widgets.HBox([view])``) is never displayed itself, and its
        # plot would find no BokehJS in the page.
        ensure_bokehjs()
        self.lock = lock or threading.RLock()
        self.ignored_echoes = 0  # how many echoed data events were dropped (for diagnostics)
        self.patches_sent = 0  # Bokeh messages sent to the page (each is 3+ widget messages)
        self._held: list[DocumentPatchedEvent] | None = None  # changes gathered by batch()
        self.bundled_at = 0  # patches_sent when render_bundle was made
        self.page_repairs = 0  # data resent to a page that drew an older bundle
        # (model id, property) -> the values last sent for it (a dict as an ordered set)
        self._sent: dict[tuple[str, str], dict[Any, None]] = {}
        super().__init__(model, **kwargs)
        self._document.on_event(DocumentReady, self._on_page_ready)

    def refresh(self) -> bool:
        """Remake ``render_bundle`` (what a page draws the widget from) from the document as
        it is now, if patches went out since it was made; True if it did. Pages showing the
        widget draw it again from the new bundle.

        >>> from bokeh.plotting import figure
        >>> w = EchoFreeBokehModel(figure())
        >>> w.refresh()   # nothing changed since the widget was made
        False
        >>> w._model.title.text = "a"; w.refresh()
        True
        >>> w.close()
        """
        with self.lock:
            if (self.patches_sent == self.bundled_at or self._document is None
                    or self.comm is None):  # closed: no page will draw it again
                return False
            self.render_bundle = self._model_to_traits(self._model)
            self.bundled_at = self.patches_sent
            return True

    def _on_page_ready(self, event: DocumentReady) -> None:
        """A page drew the widget: it has the bundle, and only the patches sent after that.
        Patches went out since the bundle was made, so it may lack some rows, and show the
        time axis and colours the bundle had (a second browser tab, a reloaded page): send
        every data source's data, every range's bounds and every glyph's colours again, in
        one message."""
        with self.lock:
            if self.patches_sent == self.bundled_at or self._document is None:
                return
            self.page_repairs += 1
            with self.batch():
                for model in list(self._document.models):
                    if isinstance(model, ColumnDataSource):
                        resend(model)
                    elif isinstance(model, Range1d):
                        resend(model, "start", "end")
                    elif isinstance(model, GlyphRenderer):
                        resend(model.glyph, *(a for a in ("fill_color", "line_color")
                                              if a in model.glyph.properties()))

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Send the document changes made inside as one message to the page, on exit.

        >>> from bokeh.plotting import figure
        >>> w = EchoFreeBokehModel(figure())
        >>> with w.batch():
        ...     w._model.title.text = "a"; w._model.width = 300
        >>> w.patches_sent
        1
        >>> w.close()
        """
        with self.lock:
            if self._held is not None:  # nested: the outer batch sends
                yield
                return
            self._held = []
            try:
                yield
            finally:
                held, self._held = self._held, None
                if held:
                    self._send_patch(held)

    def _document_patched(self, event: DocumentPatchedEvent) -> None:
        if event.setter is self:
            return
        if self._held is not None:
            self._held.append(event)
        else:
            self._send_patch([event])

    def _send_patch(self, events: list[DocumentPatchedEvent]) -> None:
        """One Bokeh PATCH-DOC message for ``events``, in the fragments jupyter_bokeh's page
        side expects: header, metadata, content, then a (header, bytes) pair per buffer."""
        doc = events[0].document
        serializer = Serializer(references=doc.models.synced_references)
        content = PatchJson(events=serializer.encode(events))
        doc.models.flush_synced(lambda model: not serializer.has_ref(model))
        msg = patch_doc(patch_doc.create_header(), {}, content)
        msg.add_buffers(*serializer.buffers)
        self._note_sent(events)
        for fragment in (msg.header_json, msg.metadata_json, msg.content_json):
            self.send({"msg": "patch", "payload": fragment})
        for buffer in msg.buffers:
            self.send({"msg": "patch", "payload": json.dumps(buffer.ref)})
            self.send({"msg": "patch"}, [buffer.to_bytes()])
        self.patches_sent += 1

    def _note_sent(self, events: list[DocumentPatchedEvent]) -> None:
        for event in events:
            if isinstance(event, ModelChangedEvent) and isinstance(event.new, _SCALARS):
                values = self._sent.setdefault((event.model.id, event.attr), {})
                values.pop(event.new, None)
                values[event.new] = None
                if len(values) > ECHO_MEMORY:
                    del values[next(iter(values))]

    def close(self) -> None:
        # jupyter_bokeh's close() unregisters from the document without checking it was still
        # registered, so a second close (e.g. ipywidgets' __del__) raised KeyError.
        if self.comm is None:
            return
        with self.lock:
            # The page lists every Bokeh document it drew and keeps it: told the plot's root,
            # pwkernel's JupyterLab extension releases this widget's once its comm closes.
            self.send({"msg": RELEASE, "root": self._model.id})
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

    def _is_sent_value(self, content: dict[str, Any]) -> bool:
        """A property change carrying a value the kernel sent that property: the page's echo
        of a patch (possibly long after it, the bounds having moved on since)."""
        new, model = content.get("new"), content.get("model")
        if content.get("kind") != "ModelChanged" or not isinstance(new, _SCALARS) \
                or not isinstance(model, dict):
            return False
        return new in self._sent.get((model.get("id"), content.get("attr")), ())

    def _sync_model(self, _model: BokehModel, content: dict[str, Any], _buffers: list[Any]
                    ) -> None:
        if content.get("event", "") != "jsevent":
            return
        with self.lock:
            if self._is_data_echo(content) or self._is_sent_value(content):
                self.ignored_echoes += 1
                return
            super()._sync_model(_model, content, _buffers)


def resend(model: Model, *attrs: str) -> None:
    """Send ``attrs`` of ``model`` to the page again (assigning an equal value sends nothing),
    or, for a data source given no attrs, all its data: repairs a page that missed changes."""
    doc = model.document
    if doc is None:
        return
    if isinstance(model, ColumnDataSource) and not attrs:
        doc.callbacks.trigger_on_change(ColumnDataChangedEvent(doc, model, "data"))
    for attr in attrs:
        doc.callbacks.trigger_on_change(ModelChangedEvent(doc, model, attr, getattr(model, attr)))

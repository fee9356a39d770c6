"""What the page gets: a view displayed after runs, or a second time, draws every row; a page
that drew the plot while rows were streaming gets them once it says it is ready; hovers find
every name. And the words around the plot: status, legend, counts, the topology's header.

``Page`` plays jupyter_bokeh's page side in Python, as its BokehView does: it draws the plot
from the widget's ``render_bundle`` (the JSON the kernel sent), then applies only the Bokeh
patches the kernel sends after that; what was sent before it drew is lost to it.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from bokeh.core.json_encoder import serialize_json
from bokeh.core.serialization import Serializer
from bokeh.document import Document
from bokeh.document.events import MessageSentEvent
from bokeh.events import DocumentReady
from bokeh.protocol import Protocol
from bokeh.protocol.receiver import Receiver

import pwkernel as pw
from tests.helpers.programs import make_programs, run


class Page:
    """One drawing of a widget's plot in a page."""

    def __init__(self, widget):
        self.widget = widget
        self.doc: Document | None = None
        self.receiver = Receiver(Protocol())
        self.lost = 0  # patch fragments that came before the page drew the plot
        previous = widget.send

        def send(content, buffers=None):
            self.receive(content, buffers or [])
            previous(content, buffers)

        widget.send = send

    def draw(self) -> None:
        """Draw from the bundle as the page has it (it crossed the wire as JSON)."""
        bundle = json.loads(serialize_json(self.widget.render_bundle))
        (doc_json,) = bundle["docs_json"].values()
        self.doc = Document.from_json(doc_json)

    def receive(self, content: dict, buffers: list) -> None:
        if content.get("msg") != "patch":
            return
        if self.doc is None:
            self.lost += 1
            return
        fragment = content["payload"] if "payload" in content else buffers[0]
        message = asyncio.run(self.receiver.consume(fragment))
        if message is not None:
            message.apply_to_document(self.doc)

    def ready(self) -> None:
        """What BokehJS sends once it has drawn the document: ``DocumentReady``."""
        doc = self.widget._model.document
        event = MessageSentEvent(doc, "bokeh_event", DocumentReady())
        content = Serializer(references=set(doc.models)).encode(event)
        self.widget._sync_model(self.widget, {**content, "event": "jsevent"}, [])

    def column(self, source: str, name: str) -> list:
        return np.asarray(self.doc.get_model_by_name(source).data[name]).tolist()

    def names(self) -> list[str]:
        return list(self.doc.get_model_by_name("pw-schedule-names").data["text"])


def display(view) -> None:
    """What IPython's ``display(view)`` asks of the view (outside a kernel, no page)."""
    view._repr_mimebundle_()


@pytest.fixture
def programs(ctl):
    return make_programs(ctl)


def runs(ctl, program, n=1):
    for _ in range(n):
        run(program)
    assert ctl.wait(60.0)


def assert_page_has_the_rows(page, view):
    """The page's rows are the kernel's, and every code in them has its name in the page
    (what the hover tooltips look up: a missing name shows as a bare number)."""
    for source in (view.source, view.transfers, view.links):
        kernel = source.data["index"].tolist()
        assert page.column(source.name, "index") == kernel, source.name
    assert len(view.source.data["index"]) > 0 and len(view.transfers.data["index"]) > 0
    names = page.names()
    assert names == view.codebook.names
    for source in (view.source, view.transfers, view.links):
        for col in ("name", "program", "client", "status"):
            codes = page.column(source.name, col)
            assert all(0 <= c < len(names) for c in codes), (source.name, col)
    shown = view.decoded()
    page_programs = [names[c] for c in page.column("pw-schedule-compute", "program")]
    assert page_programs == shown["program"] and set(page_programs) == {"fig2"}


def test_a_view_made_after_runs_shows_its_history_in_the_page(ctl, programs):
    runs(ctl, programs[0], 2)
    view = pw.ScheduleView(ctl, live=False)
    try:
        page = Page(view.plot)
        display(view)
        page.draw()
        assert_page_has_the_rows(page, view)
        # the bundle made with the widget already held them: displaying sent nothing again
        assert view.plot.patches_sent == view.plot.bundled_at == 0
    finally:
        view.close()


def test_a_view_shown_again_in_another_cell_shows_every_row(ctl, programs):
    view = pw.ScheduleView(ctl, live=False)
    try:
        first = Page(view.plot)
        display(view)
        first.draw()
        runs(ctl, programs[0])
        view.update()  # streamed to the first page only
        assert_page_has_the_rows(first, view)
        runs(ctl, programs[0])
        view.update()
        second = Page(view.plot)
        display(view)  # a later cell: its page draws the bundle made now
        second.draw()
        first.draw()  # jupyter_bokeh redraws every page of the widget on a new bundle
        assert_page_has_the_rows(second, view)
        assert_page_has_the_rows(first, view)
        runs(ctl, programs[0])
        view.update()  # both pages get the new rows
        assert_page_has_the_rows(first, view)
        assert_page_has_the_rows(second, view)
    finally:
        view.close()


def test_a_page_that_drew_while_rows_streamed_gets_them_when_ready(ctl, programs):
    """``%%pathways --viz``: the view is displayed, then rows stream while the page is still
    drawing it (lost to it); the page's DocumentReady makes the kernel send them again."""
    runs(ctl, programs[0])
    view = pw.ScheduleView(ctl, live=False)
    try:
        page = Page(view.plot)
        display(view)
        runs(ctl, programs[0])
        view.update()  # streamed before the page drew the plot
        assert page.lost > 0
        page.draw()
        assert len(page.column("pw-schedule-compute", "index")) < len(view.source.data["index"])
        page.ready()
        assert_page_has_the_rows(page, view)
        assert view.plot.page_repairs == 1
        # a page that missed nothing costs nothing
        other = Page(view.plot)
        display(view)
        other.draw()
        sent = view.plot.patches_sent
        other.ready()
        assert view.plot.patches_sent == sent and view.plot.page_repairs == 1
        assert_page_has_the_rows(other, view)
    finally:
        view.close()


def test_a_topology_view_made_after_runs_shows_its_bars_in_the_page(ctl, programs):
    runs(ctl, programs[0])
    topo = pw.TopologyView(ctl, window=600.0, live=False)
    try:
        page = Page(topo.plot)
        display(topo)
        page.draw()
        util = page.column("pw-topology-devices", "utilization")
        assert util == list(topo.source.data["utilization"]) and any(u > 0 for u in util)
        assert page.column("pw-topology-devices", "memory") == list(topo.source.data["memory"])
    finally:
        topo.close()


def test_status_says_the_controller_closed():
    ctl = pw.Controller(islands=(4, 4))
    view = pw.ScheduleView(ctl, interval=0.02)
    try:
        fig2, _ = make_programs(ctl)
        runs(ctl, fig2)
        assert view.wait_for(ctl.trace.next_index, timeout=30.0)
        assert "· live" in view.status.value
        ctl.close()
        view.updater.join(30.0)  # the updater ends with the controller, after a last update
        assert not view.updater.is_alive()
        assert "controller closed" in view.status.value and "live" not in view.status.value
        late = pw.ScheduleView(ctl, live=False)  # made on a closed controller: the same
        assert "controller closed" in late.status.value
        late.close()
    finally:
        view.close()
        ctl.close()


def test_topology_view_says_the_controller_closed():
    ctl = pw.Controller(islands=(4, 4))
    topo = pw.TopologyView(ctl, interval=0.02)
    try:
        assert "queued" in topo.islands.value
        ctl.close()
        topo.updater.join(30.0)  # the updater ends with the controller, after a last update
        assert not topo.updater.is_alive()
        assert "controller closed" in topo.islands.value
        assert "simulated" not in topo.islands.value
        late = pw.TopologyView(ctl, live=False)
        assert "controller closed" in late.islands.value
        late.close()
    finally:
        topo.close()
        ctl.close()


def legend_names(view) -> set[str]:
    """The names the legend shows (its swatches, before the transfers' key)."""
    import re

    head = view.legend.value.split("transfers:")[0]
    return set(re.findall(r"</span>([^<]+)</span>", head))


def test_filters_apply_to_the_legend_and_the_count(ctl, programs):
    fig2, local = programs
    view = pw.ScheduleView(ctl, live=False)
    try:
        with ctl.client("alice"):
            runs(ctl, fig2)
        with ctl.client("bob"):
            runs(ctl, local)
        view.update()
        total = ctl.trace.next_index
        programs_seen = set(view.decoded()["program"])
        assert len(programs_seen) == 2 and legend_names(view) == programs_seen
        assert f"{total} events" in view.status.value
        view.program_filter.value = ("fig2",)
        assert legend_names(view) == {"fig2"}
        fig2_events = sum(1 for e in ctl.trace.events() if e.program == "fig2")
        assert f"{fig2_events} of {total} events" in view.status.value
        view.color_by.value = "client"
        assert legend_names(view) == {"alice"}
        view.program_filter.value = ()
        view.client_filter.value = ("bob",)
        assert legend_names(view) == {"bob"}
        with ctl.client("bob"):
            runs(ctl, fig2)  # a new event of a shown client: the count and legend follow
        view.update()
        bob = sum(1 for e in ctl.trace.events() if e.client == "bob")
        assert f"{bob} of {ctl.trace.next_index} events" in view.status.value
        view.client_filter.value = ()
        assert legend_names(view) == {"alice", "bob"}
        assert f"{ctl.trace.next_index} events ·" in view.status.value
    finally:
        view.close()


def report_document(path) -> Document:
    """The Bokeh document a report's page loads (the JSON embedded in the file)."""
    import re

    found = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>',
                      path.read_text(encoding="utf-8"), re.S)
    (doc_json,) = json.loads(found.group(1)).values()
    return Document.from_json(doc_json)


def test_a_report_of_many_computations_opens_with_transfers_and_links_hidden(ctl, programs,
                                                                             tmp_path):
    runs(ctl, programs[0])
    events = sorted(ctl.trace.events(), key=lambda e: e.index)
    small = report_document(pw.report(ctl, tmp_path / "small.html", events=events))
    template = next(e for e in events if e.kind == "compute")
    top = max(e.index for e in events) + 1
    many = [template._replace(index=top + i, t_start=template.t_start + i * 1e-4,
                              t_end=template.t_start + i * 1e-4 + 5e-5) for i in range(5000)]
    big = report_document(pw.report(ctl, tmp_path / "big.html", events=events + many))
    for doc, visible in ((small, True), (big, False)):
        for name in ("transfers", "ici-links", "dcn-links"):
            assert doc.get_model_by_name(name).visible is visible, name
    # and the page decides again once it has laid the plot out (at its real width)
    laid_out = [m for m in big.models
                if "change:inner_width" in getattr(m, "js_property_callbacks", {})]
    assert [m.select_one({"name": "compute"}) for m in laid_out] == [
        big.get_model_by_name("compute")]

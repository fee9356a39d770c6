"""A view open all day: hundreds of programs (a notebook's ``%%pathways`` cells are one
program each, ``cell[N]``) leave its legend, its filters, its codebook and the colour
registry bounded, and each program its colour while it is shown."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.viz.palette import COLORS, OKABE_ITO, ColorRegistry

PROGRAMS = 300
LEGEND, FILTER = 10, 50  # the documented bounds (docs/live-views.md)


def run_programs(ctl, view, first: int, count: int, slice_) -> None:
    """``count`` one-node programs ``p{first}``..., each read by the view as a live view
    reads them (an update after each)."""
    x = np.ones(2, np.float32)
    for i in range(first, first + count):
        pw.function(lambda v: v + 1, slice=slice_, name=f"p{i}")(x).result()
        view.update()


def legend_names(view) -> list[str]:
    return re.findall(r'vertical-align:middle"></span>([^<]*)</span>', view.legend.value)


@pytest.fixture
def many(ctl):
    view = pw.ScheduleView(ctl, live=False, max_rows=100)
    run_programs(ctl, view, 0, PROGRAMS, ctl.slice(2, island=0))
    yield view
    view.close()


def test_the_documented_bounds_are_the_views():
    from pwkernel.viz import names

    assert (names.LEGEND_NAMES, names.FILTER_NAMES) == (LEGEND, FILTER)


def test_after_300_programs_the_legend_and_filter_are_bounded_newest_first(many):
    newest = [f"p{i}" for i in range(PROGRAMS - 1, -1, -1)]
    assert len(many.history) >= PROGRAMS  # every program's events are still in the view
    assert tuple(many.program_filter.options) == tuple(newest[:FILTER])
    assert legend_names(many)[:LEGEND] == newest[:LEGEND]
    assert len(legend_names(many)) == LEGEND
    assert f"+ {PROGRAMS - LEGEND} older programs" in many.legend.value


def test_after_300_programs_the_codebook_holds_the_pages_names(many):
    shown = set(many.decoded()["program"]) | set(many.decoded(many.transfers)["program"])
    assert shown and shown < {f"p{i}" for i in range(PROGRAMS)}  # the newest rows only
    # the names the page's rows use, the links, a status and a client: not one per program
    assert len(many.codebook) <= 2 * (len(shown) + 8)
    assert len(many.codebook) < PROGRAMS
    assert list(many.lookup.data["text"]) == many.codebook.names  # the page's copy agrees
    assert {f"p{PROGRAMS - 1}", "ici", "ok"} <= set(many.codebook.names)


def test_a_program_keeps_its_colour_while_shown(ctl):
    view = pw.ScheduleView(ctl, live=False)
    pair = ctl.slice(2, island=0)
    run_programs(ctl, view, 1000, 1, pair)
    colour = COLORS.color("program", "p1000")
    before = view.source.data["c_program"][0]
    run_programs(ctl, view, 1001, 40, pair)
    view.rebuild()  # drawn again from the history: the same colour
    rows = np.asarray(view.decoded()["program"]) == "p1000"
    assert rows.any() and set(view.source.data["c_program"][rows].tolist()) == {before}
    assert COLORS.color("program", "p1000") == colour
    view.close()


def test_the_colour_registry_is_bounded_and_keeps_the_keys_in_use():
    reg = ColorRegistry(OKABE_ITO, limit=64)
    kept = reg.index("program", "train")
    for i in range(PROGRAMS):
        reg.index("program", f"cell[{i}]")
        assert reg.index("program", "train") == kept  # used every cell: never forgotten
    assert len(reg.assigned("program")) <= 64
    newest = [reg.index("program", f"cell[{i}]") for i in range(PROGRAMS - 7, PROGRAMS)]
    assert len(set(newest)) == len(OKABE_ITO)  # the newest seven: seven colours


def test_a_selected_program_stays_in_the_filter_and_names_leave_with_their_events(ctl):
    ctl.trace.capacity = 80
    view = pw.ScheduleView(ctl, programs=["p0"], live=False)
    run_programs(ctl, view, 0, 120, ctl.slice(2, island=0))
    assert "p0" in view.program_filter.options and view.programs == ("p0",)
    view.program_filter.value = ()
    run_programs(ctl, view, 120, 1, ctl.slice(2, island=0))
    kept = {e.program for e in view.history}
    assert set(view.program_filter.options) == set(
        sorted(kept, key=lambda p: -int(p[1:]))[:FILTER])
    assert "p0" not in view.program_filter.options  # its events left the view
    view.close()


def test_a_report_of_300_programs_names_the_newest_in_its_legend(many, ctl, tmp_path):
    page = pw.report(ctl, tmp_path / "run.html").read_text()
    page = html.unescape(page).replace('\\"', '"')  # (the document's JSON, in the page)
    legend = page[page.index("<b>program:</b>"):]
    legend = legend[:legend.index("transfers:")]
    named = re.findall(r'vertical-align:middle"></span>([^<]*)</span>', legend)
    assert named == [f"p{i}" for i in range(PROGRAMS - 1, PROGRAMS - 1 - LEGEND, -1)]
    assert f"+ {PROGRAMS - LEGEND} older programs" in legend
    assert f"{PROGRAMS} programs" in page  # the summary counts every one

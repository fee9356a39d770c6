"""Other tenants' computations (a shared pool's, events with ``tenant``) in the views: their
own source in the schedule view, hatched and coloured per tenant, a legend entry each, the
report likewise; this controller's work stays as it was. The events are recorded into a real
controller's trace beside its own real work, as the Ray backend records a pool's
(``tests/backends/ray/test_pool_views.py`` runs it on a real pool)."""

from __future__ import annotations

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.viz import columns as C
from pwkernel.viz import encoding as E
from pwkernel.viz.palette import COLORS


def record_other(ctl, tenant: str, devices: tuple[int, ...], t: float, name: str = "step"):
    ctl.trace.record(kind="compute", name=name, program=tenant, program_id=-1,
                     client=f"{tenant}/default", island=0, devices=devices, t_submit=t,
                     t_start=t, t_end=t + 0.001, tenant=tenant)


@pytest.fixture
def mixed(ctl):
    """The controller's own run, then two other tenants' computations on its devices."""
    double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0), name="double")
    assert double(np.ones(4)).result(60).tolist() == [2.0] * 4
    t = ctl.trace.events()[-1].t_end
    record_other(ctl, "bob", (0, 1), t + 0.01)
    record_other(ctl, "carol", (2, 3), t + 0.02)
    record_other(ctl, "bob", (1,), t + 0.03, "other")
    return ctl


def test_the_schedule_view_draws_other_tenants_apart(mixed):
    view = pw.ScheduleView(mixed, live=False)
    try:
        own, theirs = view.decoded(), view.decoded(view.others)
        assert set(own["tenant"]) == {""} and "double" in own["name"]
        assert theirs["tenant"] == ["bob", "bob", "carol", "carol", "bob"]
        assert theirs["client"][0] == "bob/default" and theirs["device"] == [0, 1, 2, 3, 1]
        palette = COLORS.mapper_palette
        assert [palette[i] for i in view.others.data["c_tenant"]] == [
            COLORS.color("tenant", t) for t in theirs["tenant"]]
        assert COLORS.color("tenant", "bob") != COLORS.color("tenant", "carol")
        assert list(view.tenants) == ["bob", "carol"]
        legend = view.legend.value
        assert "other tenants:" in legend and "bob" in legend and "carol" in legend
        own_part = legend.split("other tenants:")[0]  # the programs' part: own work only
        assert "double" in own_part and "bob" not in own_part
        glyph = view.figure.select_one({"name": "others"}).glyph
        assert glyph.hatch_pattern == "left_diagonal_line" and glyph.fill_alpha < 1
        # a rebuild (the filters', a repaired page's) keeps them apart too
        view.rebuild()
        assert view.decoded(view.others)["tenant"] == theirs["tenant"]
        assert set(view.decoded()["tenant"]) == {""}
        assert "bob" in view.program_filter.options  # filterable: their program is their name
    finally:
        view.close()


def test_a_view_of_own_work_only_has_an_empty_others_source(ctl):
    double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=0), name="double")
    double(np.ones(4)).result(60)
    view = pw.ScheduleView(ctl, live=False)
    try:
        assert len(view.others.data["index"]) == 0 and view.tenants == {}
        assert "other tenants" not in view.legend.value
    finally:
        view.close()


def test_typed_columns_of_other_tenants_match_the_plain_ones(mixed):
    events = [e for e in mixed.trace.events() if e.kind == "compute"]
    layout = C.DeviceLayout.from_controller(mixed)
    book = E.Codebook()
    cols = E.compute_arrays(events, layout, 0.0, book)
    ref = C.rectangles(events, layout, 0.0)
    assert book.decode(cols["tenant"]) == ref["tenant"]
    palette = COLORS.mapper_palette
    assert [palette[i] if t else "" for i, t in zip(cols["c_tenant"], ref["tenant"],
                                                   strict=True)] == ref["c_tenant"]
    own, others = E.own_and_others(events)
    assert [e.tenant for e in others] == ["bob", "carol", "bob"]
    assert own and all(not e.tenant for e in own)
    assert E.own_and_others(own) == (own, [])


def test_the_report_draws_other_tenants_with_a_legend(mixed, tmp_path):
    page = pw.report(mixed, tmp_path / "run.html").read_text()
    assert "other tenants:" in page and "carol" in page
    assert '"others"' in page  # the renderer of their bars

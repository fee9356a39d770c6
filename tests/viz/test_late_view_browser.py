"""In a real JupyterLab page: a ScheduleView made after programs ran shows their history, a
hover over one of its bars shows names (not codes), the same view shown again in a later cell
shows every row in both outputs, and a view displayed while its cell runs programs (as
``%%pathways --viz`` does) holds every row once the cell ends."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.helpers.lab import (
    FIG2_CELL,
    chromium_page,
    hover_tooltip,
    jupyter_lab,
    kernel_client,
    needs_chromium,
    open_notebook,
    run_code,
    write_notebook,
)

NOTEBOOK = "late-view.ipynb"

SETUP = FIG2_CELL + """\
from IPython.display import display

def runs(n):
    for i in range(n):
        with ctl.client("carol"):
            for out in fig2(np.arange(8, dtype=np.float32)):
                out.result()
    ctl.wait(60)

runs(30)
"""
LATE = """\
view = pw.ScheduleView(ctl, window=5.0)
view
"""
AGAIN = """\
runs(10)
view.wait_for(ctl.trace.next_index, 60)
view
"""
VIZ = """\
v2 = pw.ScheduleView(ctl, programs=["fig2"])
display(v2)
runs(100)
v2.wait_for(ctl.trace.next_index, 60)
print("viz cell done")
"""

# For each copy of the source with this id in the page: whether it is drawn (a document the
# page still lists may have no view: a repair's bundle replaced its output), its length, and
# the names (through the page's lookup, as the hover does) of its newest bar's coded columns.
COPIES_JS = """(id) => {
  const out = [];
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    const src = doc.get_model_by_id(id);
    if (src == null) continue;
    const drawn = window.Bokeh.index.find_one(doc.get_model_by_name("compute")) != null;
    const names = doc.get_model_by_name("pw-schedule-names").get_column("text");
    const last = src.get_length() - 1;
    const newest = last < 0 ? [] : ["name", "program", "client", "status"].map(
        (c) => String(names[src.get_column(c)[last]]));
    out.push({drawn, copy: [src.get_length(), newest]});
  }
  return out;
}"""
# Zoom the newest drawn copy of ``id`` onto its newest bar that has a width (a span can be
# zero long: an end seen before the previous one on its devices starts and ends there, and
# a range of no width has no scale); return that bar's middle in the page. A document the
# page still lists may have no view (a repair's bundle replaced its output): such copies are
# passed over, and when none is drawn the error says why per copy.
BAR_XY_JS = """(id) => {
  const why = [];
  const docs = window.Bokeh.documents.filter((d) => d.get_model_by_id(id) != null);
  for (const doc of docs.reverse()) {
    const renderer = doc.get_model_by_name("compute");
    const view = window.Bokeh.index.find_one(renderer);
    if (view == null) { why.push("no view"); continue; }
    const plot = view.parent, src = renderer.data_source;
    const lefts = src.get_column("left"), rights = src.get_column("right");
    let last = src.get_length() - 1;
    while (last > 0 && !(rights[last] > lefts[last])) last -= 1;
    const left = lefts[last], right = rights[last];
    plot.model.x_range.setv({start: left - (right - left), end: right + (right - left)});
    plot.canvas_view.el.scrollIntoView({block: "center"});
    const sx = plot.frame.x_scale.compute((left + right) / 2);
    const sy = plot.frame.y_scale.compute(src.get_column("y")[last]);
    const box = plot.canvas_view.el.getBoundingClientRect();
    const xy = [box.left + sx, box.top + sy];
    if (xy.every(Number.isFinite)) return xy;
    why.push(`no layout yet (${JSON.stringify([sx, sy, box.left, box.top])})`);
  }
  throw new Error(`no drawn copy of ${id} among ${docs.length}: ${why.join("; ")}`);
}"""


def wait_for_copies(page, source_id, rows, names, at_least, timeout=120.0):
    """Until every drawn copy of ``source_id`` (at least ``at_least``) holds the kernel's
    ``rows`` rows and newest ``names``."""
    want = [rows, names]
    try:
        page.wait_for_function(
            f"""(want) => {{ const copies = ({COPIES_JS})(want.id);
                const drawn = copies.filter((c) => c.drawn);
                return drawn.length >= want.at_least && drawn.every(
                    (c) => JSON.stringify(c.copy) === JSON.stringify(want.copy)); }}""",
            arg={"id": source_id, "at_least": at_least, "copy": want},
            timeout=timeout * 1000)
    except PlaywrightTimeout:
        raise AssertionError(f"the page's copies of {source_id}: "
                             f"{page.evaluate(COPIES_JS, source_id)}; the kernel's: "
                             f"{want}") from None


def newest_bar_xy(page, source_id: str) -> tuple[float, float]:
    """The page point of the newest bar with a width of ``source_id``'s newest drawn copy, as
    soon as it has one (a drawing just made from a new bundle has no layout yet): the
    coordinates come from the same poll that found them, so a copy replaced in between cannot
    be read."""
    try:
        return tuple(page.wait_for_function(
            f"(id) => {{ try {{ return ({BAR_XY_JS})(id) }} catch (e) {{ return false }} }}",
            arg=source_id).json_value())
    except PlaywrightTimeout:
        why = page.evaluate(f"(id) => {{ try {{ ({BAR_XY_JS})(id); return 'drawn now' }} "
                            "catch (e) { return String(e) } }", source_id)
        raise AssertionError(f"no bar of {source_id} to hover: {why}") from None


def hover_newest_bar(page, source_id: str) -> list[str]:
    values: list[str] = []
    for _ in range(3):  # a page's repair still in the kernel's queue may reset the axis
        values = hover_tooltip(page, *newest_bar_xy(page, source_id))
        if values:
            break
    return values


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_late_and_repeated_views_show_every_row_and_name(tmp_path):
    needs_chromium()
    with jupyter_lab(tmp_path, {"PWKERNEL_ISLANDS": "4,4"}) as lab:
        write_notebook(lab.root / NOTEBOOK, [SETUP, LATE, AGAIN, VIZ])
        with chromium_page(tmp_path / "profile") as page:
            open_notebook(page, lab, NOTEBOOK)
            page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
            page.get_by_text("Run Selected Cell and All Below", exact=True).click()
            page.wait_for_function("() => /viz cell done/.test(document.body.innerText)")
            # Asked after the cells (the shell queue is FIFO), once the views hold everything.
            with kernel_client(lab, NOTEBOOK) as client:
                out = run_code(client, """
import json
def state(v):
    rows = v.decoded()
    wide = max(i for i, (l, r) in enumerate(zip(rows["left"], rows["right"])) if r > l)
    return [v.source.id, len(rows["index"]),
            [rows[c][-1] for c in ("name", "program", "client", "status")],
            [rows[c][wide] for c in ("name", "program", "client", "status")]]
print(json.dumps([state(view), state(v2)]))""")
            (first_id, first_rows, first_names, wide_names), (viz_id, viz_rows, viz_names, _) = \
                json.loads(out)
            assert first_rows > 0 and first_names[1:] == ["fig2", "carol", "ok"]
            # both outputs of ``view`` (made after runs, then shown again) hold every row
            wait_for_copies(page, first_id, first_rows, first_names, at_least=2)
            # the view displayed while its cell ran programs: repaired once the cell ended
            wait_for_copies(page, viz_id, viz_rows, viz_names, at_least=1)
            # a real hover shows names, looked up from the codes (on the newest bar with a
            # width, found by the same rule in the page's copy, equal to the kernel's)
            values = hover_newest_bar(page, first_id)
            assert values[:3] == wide_names[:3], values
            assert values[-1] == "ok", values
            assert page.errors == [], f"errors in the page: {page.errors}"

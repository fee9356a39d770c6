"""In a real JupyterLab page with the pwkernel kernel: rerunning ``view = pw.ScheduleView(ctl);
view`` keeps only the plot on the page. Each rerun closes the previous view (reruns.py), and
pwkernel's JupyterLab extension releases that view's Bokeh document: before, BokehJS's
``Bokeh.documents`` kept every copy the page ever drew, with all its rows and views."""

from __future__ import annotations

import contextlib
import json

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from pwkernel.notebook import kernelspec
from tests.helpers.lab import (
    FIG2_CELL,
    chromium_page,
    kernel_client,
    needs_chromium,
    run_code,
)
from tests.helpers.sidebar_lab import lab_with_pwkernel, write_notebook

NOTEBOOK = "rerun-view.ipynb"
RERUNS = 5
SETUP = FIG2_CELL + """\
for i in range(100):
    with ctl.client("carol"):
        for out in fig2(np.arange(8, dtype=np.float32)):
            out.result()
ctl.wait(60)
"""
STATE = "import json; print(json.dumps([view.source.id, len(view.source.data['index'])]))"
VIEW = "view = pw.ScheduleView(ctl)\nview\n"

# What the page holds: every listed document, the documents drawn in an output now on the page
# (a root view whose element is in the page), the rows of every data source of each kind, and
# the root views in BokehJS's index.
HELD_JS = """() => {
  const count = (docs) => docs.reduce((n, doc) => n + [...doc.all_models].reduce(
      (k, m) => k + (typeof m.get_length === "function" ? (m.get_length() || 0) : 0), 0), 0);
  const docs = window.Bokeh.documents;
  const shown = docs.filter((doc) => doc.roots().some((root) => {
    const view = window.Bokeh.index.find_one(root);
    return view != null && view.el.isConnected;
  }));
  return {docs: docs.length, shown: shown.length, rows: count(docs), shown_rows: count(shown),
          index: window.Bokeh.index.roots.length,
          shown_index: shown.reduce((n, doc) => n + doc.views_manager.roots.length, 0)};
}"""
# The view's copy ``id`` with ``rows`` rows is drawn in the page.
DRAWN_JS = """([id, rows]) => (window.Bokeh && window.Bokeh.documents || []).some((doc) => {
  const src = doc.get_model_by_id(id);
  return src != null && src.get_length() === rows &&
      window.Bokeh.index.find_one(doc.get_model_by_name("compute")) != null;
})"""


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_rerun_view_cell_keeps_only_the_shown_plot(tmp_path):
    needs_chromium()
    # the pwkernel kernel (which closes a rerun cell's views) and this checkout's extension
    with lab_with_pwkernel(tmp_path, {"PWKERNEL_ISLANDS": "4,4"}) as lab:
        write_notebook(lab.root / NOTEBOOK, [SETUP, VIEW])
        with chromium_page(tmp_path / "profile") as page:
            page.set_default_timeout(180_000)
            page.goto(lab.notebook_url(NOTEBOOK))
            page.get_by_text(f"{kernelspec.DISPLAY_NAME} | Idle").wait_for()
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(0).locator(".jp-InputPrompt").click()
            page.keyboard.press("Escape")
            page.keyboard.press("Shift+Enter")
            cells.nth(0).locator(".jp-InputPrompt", has_text="[1]").wait_for()
            with kernel_client(lab, NOTEBOOK) as client:
                for k in range(RERUNS):
                    cells.nth(1).locator(".jp-InputPrompt").click()
                    page.keyboard.press("Escape")
                    page.keyboard.press("Control+Enter")
                    # each run_code below takes an execution count too
                    cells.nth(1).locator(".jp-InputPrompt", has_text=f"[{2 * k + 2}]").wait_for()
                    source, rows = json.loads(run_code(client, STATE))
                    page.wait_for_function(DRAWN_JS, arg=[source, rows])
            # the closed views' documents go once their widgets' comms closed
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_function(f"() => {{ const h = ({HELD_JS})(); "
                                       "return h.docs === h.shown; }", timeout=30_000)
            held = page.evaluate(HELD_JS)
            assert rows > 0 and held["shown"] == 1, held
            # what the page holds is what it shows: one plot's document, rows and views
            assert held["docs"] == held["shown"] and held["rows"] == held["shown_rows"] and \
                held["index"] == held["shown_index"], held
            assert page.errors == [], f"errors in the page: {page.errors}"

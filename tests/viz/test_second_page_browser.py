"""In a real JupyterLab: a schedule view that followed programs, opened again in a second
browser tab (or after a reload: a page that draws the widget from the kernel's state) shows the
same time axis as the first page, so its newest bars are in view, not the axis the widget was
first drawn with."""

from __future__ import annotations

import json

import pytest

from tests.helpers.lab import (
    FIG2_CELL,
    chromium_page,
    jupyter_lab,
    kernel_client,
    needs_chromium,
    open_notebook,
    run_code,
    write_notebook,
)

NOTEBOOK = "second-page.ipynb"

VIEW = FIG2_CELL + """\
view = pw.ScheduleView(ctl, window=0.0005)
view
"""
RUNS = """\
for _ in range(20):
    [out.result() for out in fig2(np.arange(8, dtype=np.float32))]
ctl.wait(60)
view.wait_for(ctl.trace.next_index, 60)
view.stop()
print("runs done")
"""

# The x range of every drawn copy of the view's plot, as [start, end].
RANGES_JS = """(id) => {
  const out = [];
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    const r = doc.get_model_by_id(id);
    if (r != null) out.push([r.start, r.end]);
  }
  return out;
}"""


def _kernel_side(lab) -> str:
    """What the kernel's widget did for the pages (for a failure's message): Bokeh messages
    sent, those the bundle pages draw from already holds, repairs sent to pages that drew it."""
    with kernel_client(lab, NOTEBOOK) as client:
        return run_code(client, "p = view.plot\nprint(dict(patches_sent=p.patches_sent, "
                                "bundled_at=p.bundled_at, page_repairs=p.page_repairs, "
                                "x_range=[view.x_range.start, view.x_range.end]))")


def _shows_range(page, which: str, want: dict, timeout_ms: int, lab=None) -> None:
    """Wait until every drawn copy of the plot on ``page`` has the kernel's x range."""
    check = f"""(want) => {{ const copies = ({RANGES_JS})(want.id);
        return copies.length >= 1 && copies.every((c) => c.every(
            (v, i) => Math.abs(v - want.range[i]) < 1e-9)); }}"""
    try:
        page.wait_for_function(check, arg=want, timeout=timeout_ms)
    except Exception:
        raise AssertionError(f"the {which} page's x range: "
                             f"{page.evaluate(RANGES_JS, want['id'])}; the kernel's: "
                             f"{want['range']}; its widget: "
                             f"{_kernel_side(lab) if lab else '?'}") from None


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_a_second_page_draws_the_view_as_it_is_now(tmp_path):
    needs_chromium()
    with jupyter_lab(tmp_path, {"PWKERNEL_ISLANDS": "4,4"}) as lab:
        write_notebook(lab.root / NOTEBOOK, [VIEW, RUNS])
        with chromium_page(tmp_path / "profile") as page:
            open_notebook(page, lab, NOTEBOOK)
            page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
            page.get_by_text("Run Selected Cell and All Below", exact=True).click()
            page.wait_for_function("() => /runs done/.test(document.body.innerText)")
            with kernel_client(lab, NOTEBOOK) as client:
                out = run_code(client, "import json\nprint(json.dumps([view.x_range.id, "
                                       "view.x_range.start, view.x_range.end]))")
            range_id, start, end = json.loads(out)
            # (the axis starts at [0, window]; 20 runs of fig2 take far longer than 0.5 ms)
            assert start > 0.0, "the runs should have moved the axis past its first window"
            want = {"id": range_id, "range": [start, end]}
            _shows_range(page, "first", want, 60_000, lab)
            # saved with its outputs (BokehJS and the widget), as a user's notebook is
            page.keyboard.press("Control+s")
            page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')")
            saved = json.loads((lab.root / NOTEBOOK).read_text())
            assert saved["cells"][0]["outputs"], "the notebook was saved without its outputs"
            second = page.context.new_page()
            second.goto(lab.notebook_url(NOTEBOOK))
            _shows_range(second, "second", want, 120_000, lab)
            assert page.errors == [], f"errors in the page: {page.errors}"

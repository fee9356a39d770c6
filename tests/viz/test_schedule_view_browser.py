"""ScheduleView in a real JupyterLab page: the plot grows while programs run, the page has no
errors, and the browser's rows are the kernel's rows (the stream echo is not doubled)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.helpers.doc_images import ARTIFACTS, keep
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

NOTEBOOK = "live-schedule.ipynb"

SETUP = FIG2_CELL + """\
import pathlib

with ctl.client("alice"):
    pass
view = pw.ScheduleView(ctl, window=2.0)     # zoomed out: thousands of bars in view
view
"""

# Runs programs until the test drops a file in the root dir (bounded either way).
LOOP = """\
stop, runs = pathlib.Path("stop-programs"), 0
while not stop.exists() and runs < 20_000:
    with ctl.client("alice" if runs % 3 == 0 else "bob"):
        outs = fig2(np.arange(8, dtype=np.float32))
    for out in outs:
        out.result()
    runs += 1
print("programs run:", runs)
"""

FLUSH = """\
view.stop()
ctl.wait(30)
view.update()
print("kernel rows:", len(view.source.data["index"]))
"""

# The compute source in the page, found through BokehJS's documents.
ROWS_JS = """() => {
  const docs = (window.Bokeh && window.Bokeh.documents) || [];
  let found = null;
  for (const doc of docs) {
    const m = doc.get_model_by_name("pw-schedule-compute");
    if (m) found = m;
  }
  return found === null ? -1 : found.get_length();
}"""
# True once the page has judged the view zoomed out (bars in view under 2 px on average) and
# hidden the transfers and links: the state whose readability the screenshot checks.
ZOOMED_OUT_JS = """() => {
  const docs = (window.Bokeh && window.Bokeh.documents) || [];
  for (const doc of docs) {
    const r = doc.get_model_by_name("transfers");
    if (r) return r.visible === false;
  }
  return false;
}"""
INDEX_JS = ROWS_JS.replace("found.get_length()", "Array.from(found.get_column('index'))")
NEWEST_JS = ROWS_JS.replace("found.get_length()", "Math.max(...found.get_column('index'))")
# The page's names for the codes of the newest bar: what the hover tooltip shows.
NAMES_JS = ROWS_JS.replace("return found === null ? -1 : found.get_length();", """
  let names = null;
  for (const doc of docs) names = doc.get_model_by_name("pw-schedule-names") || names;
  const text = names.get_column("text"), last = found.get_length() - 1;
  return ["name", "program", "client", "status"].map(
      (c) => text[found.get_column(c)[last]]);""")


def shares(png: Path) -> tuple[float, float]:
    """The share of near-black pixels, and of pixels in the program's colour (fig2: the
    palette's first, orange), in a screenshot."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    dark = (rgb.max(axis=2) < 70).mean()
    orange = np.array([0xE6, 0x9F, 0x00])
    colored = (np.abs(rgb - orange).max(axis=2) < 40).mean()
    return float(dark), float(colored)


def view_area(page):
    """The first cell's outputs: the controls and the plot of the ScheduleView."""
    return page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea")


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_schedule_view_streams_live_in_jupyterlab(tmp_path):
    needs_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyter_lab(tmp_path, {"PWKERNEL_ISLANDS": "4,4"}) as lab:
        write_notebook(lab.root / NOTEBOOK, [SETUP, LOOP, FLUSH])
        with chromium_page(tmp_path / "profile") as page:
            # The view's cell first; the programs once the page has drawn the plot (what is
            # streamed before that reaches the page only when the kernel is next idle: see
            # docs/live-views.md, "What the page gets").
            open_notebook(page, lab, NOTEBOOK)
            page.keyboard.press("Shift+Enter")
            page.wait_for_function(f"({ROWS_JS})() >= 0")
            page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
            page.get_by_text("Run Selected Cell and All Below", exact=True).click()

            # The plot appears and fills while the loop cell is still running programs.
            # (Rows stop growing at the rollover: the newest event index keeps growing.)
            page.wait_for_function(f"({ROWS_JS})() > 0")
            first = page.evaluate(NEWEST_JS)
            page.wait_for_function(f"({NEWEST_JS})() > {first}")
            grown = page.evaluate(NEWEST_JS)
            assert grown > first >= 0
            assert not (lab.root / "stop-programs").exists()  # the programs were running
            # Zoomed out (bars narrower than a pixel) the rows keep their programs' colours.
            page.wait_for_function(f"({ROWS_JS})() > 1000")
            page.wait_for_function(ZOOMED_OUT_JS)
            shot = ARTIFACTS / "schedule-view.png"
            view_area(page).screenshot(path=str(shot))  # live, while programs run
            dark, colored = shares(shot)
            assert dark < 0.04 and colored > 0.03, (
                f"zoomed out, {dark:.1%} of the view is near black and {colored:.1%} has the "
                f"program's colour: the rows are not readable (see {shot})")

            (lab.root / "stop-programs").touch()
            page.wait_for_function(
                "() => /kernel rows: \\d+/.test(document.body.innerText)")
            text = page.inner_text(".jp-Notebook")
            kernel_rows = int(re.search(r"kernel rows: (\d+)", text).group(1))
            assert re.search(r"programs run: \d+", text)
            page.wait_for_function(f"({ROWS_JS})() === {kernel_rows}", timeout=60_000)

            # Ask the kernel directly, after the browser's echoes (FIFO shell queue): the
            # echoed streams were dropped, so Python still holds exactly the page's rows.
            with kernel_client(lab, NOTEBOOK) as client:
                out = run_code(client, 'print(len(view.source.data["index"]), '
                                       'view.plot.ignored_echoes, '
                                       'view.source.data["index"].tolist())')
            rows, echoes, kernel_index = out.split(" ", 2)
            browser_index = page.evaluate(INDEX_JS)
            assert int(rows) == kernel_rows == page.evaluate(ROWS_JS)
            assert [int(i) for i in re.findall(r"\d+", kernel_index)] == browser_index
            assert int(echoes) > 0, "the frontend sent no echo: the guard was not exercised"
            # The columns are codes; the page's lookup gives back the kernel's strings.
            with kernel_client(lab, NOTEBOOK) as client:
                out = run_code(client, 'import json; rows = view.decoded(); print(json.dumps('
                                       '[rows[c][-1] for c in ("name", "program", "client", '
                                       '"status")]))')
            kernel_names = json.loads(out)
            assert kernel_names == page.evaluate(NAMES_JS)
            assert kernel_names[1:] in (["fig2", "alice", "ok"], ["fig2", "bob", "ok"])
            assert page.errors == [], f"errors in the page: {page.errors}"
    assert os.path.getsize(shot) > 10_000
    keep(shot, "schedule-view.png")  # docs/img/, when PWKERNEL_DOC_IMAGES=1

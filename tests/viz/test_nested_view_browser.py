"""In a real JupyterLab page: views shown only inside ipywidgets containers (never displayed
themselves, as tutorial 02 shows its two schedules side by side) draw their plots in a fresh
kernel, where nothing had put BokehJS in the page before."""

from __future__ import annotations

import pytest

from tests.helpers.lab import (
    FIG2_CELL,
    chromium_page,
    jupyter_lab,
    needs_chromium,
    open_notebook,
    write_notebook,
)

NOTEBOOK = "nested-views.ipynb"

NESTED = FIG2_CELL + """\
import ipywidgets as widgets

[out.result() for out in fig2(np.arange(8, dtype=np.float32))]
views = [pw.ScheduleView(ctl, window=1.0) for _ in range(2)]
topology = pw.TopologyView(ctl)
box = widgets.HBox([widgets.VBox([v], layout=widgets.Layout(width="50%")) for v in views])
print("views made")
widgets.VBox([box, topology])
"""


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_views_inside_containers_draw_in_a_fresh_kernel(tmp_path):
    needs_chromium()
    with jupyter_lab(tmp_path, {"PWKERNEL_ISLANDS": "4,4"}) as lab:
        write_notebook(lab.root / NOTEBOOK, [NESTED])
        with chromium_page(tmp_path / "profile") as page:
            open_notebook(page, lab, NOTEBOOK)
            page.keyboard.press("Shift+Enter")
            page.wait_for_function("() => /views made/.test(document.body.innerText)")
            output = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea")
            # two schedules and the topology: three Bokeh documents, each root drawn (a view
            # in the page); without BokehJS each would be an error widget instead
            page.wait_for_function(
                """() => { const docs = (window.Bokeh && window.Bokeh.documents) || [];
                           return docs.length >= 3 && docs.every((d) => d.roots().every(
                               (r) => window.Bokeh.index.find_one(r) != null)); }""",
                timeout=120_000)
            text = output.inner_text()
            assert "javascript error" not in text and "Error displaying widget" not in text, text
            assert page.errors == [], f"errors in the page: {page.errors}"

"""The sidebar's Export trace with its rows choice, in a real JupyterLab in Debian's chromium.

The sidebar's ``rows`` select sends ``rows`` in the comm's ``trace`` request, as
``%pathways trace save PATH --rows`` does: the file it writes holds the tracks picked there
(a track per island, or per device) and no others. The server, browser and notebook helpers are
those of ``test_sidebar_browser.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.sidebar_lab import CHROMIUM, chromium_page, lab_with_pwkernel, write_notebook
from tests.notebook.test_sidebar_browser import (
    KERNEL_START_MS,
    MS,
    SIDEBAR,
    message,
    open_sidebar,
    run_cell,
)

# a computation on each island's four devices: the trace has events on all eight
WORK_CELL = """\
%pathways slice left 4 --island 0
%pathways slice right 4 --island 1
import numpy as np, pwkernel as pw
double = pw.function(lambda a: a * 2, slice=left)
bump = pw.function(lambda a: a + 1, slice=right)
x = np.ones(8, np.float32)
float(double(x).result().sum()) + float(bump(x).result().sum())"""

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is not installed: `make browser` installs Debian's chromium")]


def compute_tracks(path: Path) -> set[tuple[int, str]]:
    """(island, track name) of every track a compute span of the trace file is on."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    return {(e["pid"], names[e["pid"], e["tid"]]) for e in events
            if e["ph"] == "X" and e["cat"] == "compute"}


def export(page, rows: str) -> Path:
    """Pick ``rows`` in the sidebar, click Export trace, and wait for the kernel's reply (it
    names the rows it used; each call here picks other rows than the call before)."""
    sidebar = page.locator(SIDEBAR)
    sidebar.locator("select.pw-rows").select_option(rows)
    sidebar.locator(".pw-export").click()
    page.wait_for_function(
        f"/trace saved .*rows: {rows}\\): /.test("
        f"document.querySelector('{SIDEBAR} .pw-message').textContent)", timeout=MS)
    text = message(page)
    return Path(re.search(r": (/\S+\.json)$", text).group(1))


def test_sidebar_exports_the_rows_picked_there(tmp_path):
    with lab_with_pwkernel(tmp_path / "lab") as lab, chromium_page(tmp_path / "profile") as page:
        write_notebook(lab.root / "export.ipynb", [WORK_CELL])
        page.goto(lab.notebook_url("export.ipynb"))
        open_sidebar(page)
        sidebar = page.locator(SIDEBAR)
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-connection').textContent"
            ".includes('controller not started yet')", timeout=KERNEL_START_MS)
        run_cell(page, 0)
        page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output",
                     has_text="32.0").wait_for(timeout=KERNEL_START_MS)
        # the choices are those of `%pathways trace save --rows`, the default first
        options = sidebar.locator("select.pw-rows option")
        assert [options.nth(i).get_attribute("value") for i in range(options.count())] == \
            ["auto", "device", "host", "island"]
        assert sidebar.locator("select.pw-rows").input_value() == "auto"

        by_island = export(page, "island")
        assert by_island.parent == lab.root and by_island.is_file()
        assert compute_tracks(by_island) == {(0, "all (4 devices)"), (1, "all (4 devices)")}

        by_device = export(page, "device")
        assert by_device != by_island
        assert compute_tracks(by_device) == {(d // 4, f"device {d}") for d in range(8)}
        assert not page.errors, f"errors in the page: {page.errors}"

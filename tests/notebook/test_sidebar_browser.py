"""The Pathways sidebar in a real JupyterLab, in Debian's chromium (Playwright).

One JupyterLab, one browser, one story: the sidebar finds the notebook's pwkernel controller,
shows islands, named slices and a running program, cancels, switches the policy, exports the
trace; it cancels a ``%%pathways`` cell that blocks the kernel (answered at once: the comm lives
on a kernel subshell) and inserts the schedule view; it follows the active notebook to a plain
Python kernel, loads pwkernel there, and reconnects after a kernel restart. The screenshot goes
to test-artifacts/sidebar.png (and docs/img/ with ``PWKERNEL_DOC_IMAGES=1``:
``tests/helpers/doc_images.py``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.helpers.doc_images import ARTIFACTS, keep
from tests.helpers.lab import kernel_client, run_code
from tests.helpers.sidebar_lab import CHROMIUM, chromium_page, lab_with_pwkernel, write_notebook

SCREENSHOT = ARTIFACTS / "sidebar.png"
SIDEBAR = "#pwkernel-sidebar"
KERNEL_START_MS = 180_000  # a cold kernel imports JAX on 2 shared cores
MS = 60_000

SETUP_CELL = """\
%pathways slice train 2 --island 0
%pathways slice serve 2 --island 1
import threading, jax, numpy as np, pwkernel as pw
ctl = pw.controller()
gate = threading.Event()          # the next cell opens it: until then the first step runs

def hold(v):
    gate.wait(120)
    return v

one = ctl.slice(1, island=0, axis_types="auto")   # made in Python, not by %pathways
step = pw.function(lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                   slice=one)

@pw.program
def training_step(x):
    return step(step(x))

y = training_step(np.ones(4, np.float32))      # futures at once: the program runs on
mm = pw.function(lambda a: a @ a, slice=serve)

never = threading.Event()                      # never set: each tick lasts 50 ms
def slow(v):
    never.wait(0.05)
    return v

tick = pw.function(lambda x: jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                   slice=serve)
x0 = np.ones(4, np.float32)
z = mm(np.ones((512, 512), np.float32)); z.result().shape"""
RELEASE_CELL = "gate.set(); y.run.wait(60)"
BLOCKING_CELL = """\
%%pathways
u = x0
for _ in range(400):                           # 20 s of ticks: the kernel is busy
    u = tick(u)"""
CANCELLED = "cancelled from the Pathways sidebar"
COMMS = "from pwkernel.notebook import comm; print(len(comm.connections()), comm.subscribed())"
# In the page, on the blocking cell (``el``): the time of the click on a sidebar Cancel
# button, and of the cancel error's first appearance in the cell's output. Measured there, not
# in the test: Playwright polls a locator only every 500 ms, and its click first waits for the
# button to be stable, which under CPU load alone can take most of a second.
CLOCK_JS = """(el, text) => {
  const clock = window.pwCancelClock = {click: null, output: null};
  document.addEventListener("click", (ev) => {
    if (clock.click === null && ev.target.closest("#pwkernel-sidebar .pw-cancel"))
      clock.click = performance.now();
  }, true);
  const seen = () => {
    if (clock.output !== null || !el.querySelector(".jp-OutputArea")?.textContent.includes(text))
      return;
    clock.output = performance.now();
    watch.disconnect();
  };
  const watch = new MutationObserver(seen);
  watch.observe(el, {childList: true, subtree: true, characterData: true});
}"""

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"{CHROMIUM} is not installed: `make browser` installs Debian's chromium")]


def run_cell(page, index: int) -> None:
    """Select cell ``index`` of the active notebook and run it (Shift+Enter)."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")


def open_sidebar(page, timeout_s: float = 60.0) -> None:
    """Show the sidebar. The layout restorer may open (or collapse) the left area while the
    page loads, and clicking an open tab collapses it: click until it stays visible."""
    tab = page.locator('.jp-SideBar [data-id="pwkernel-sidebar"]')
    tab.wait_for(timeout=MS)
    deadline = time.monotonic() + timeout_s
    while True:
        if not page.locator(SIDEBAR).is_visible():
            tab.click()
        try:
            page.locator(SIDEBAR).wait_for(state="visible", timeout=5_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise


def message(page) -> str:
    return page.locator(f"{SIDEBAR} .pw-message").inner_text()


def test_sidebar_follows_the_kernel(tmp_path):
    with lab_with_pwkernel(tmp_path / "lab") as lab, chromium_page(tmp_path / "profile") as page:
        write_notebook(lab.root / "sidebar.ipynb", [SETUP_CELL, RELEASE_CELL, BLOCKING_CELL])
        write_notebook(lab.root / "plain.ipynb", ["1 + 1"], kernel="python3")
        errors: list[str] = []  # console errors of ours (the lab logs its own, e.g. a 404)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                and ("pwkernel" in m.text.lower() or "pathways" in m.text.lower()) else None)
        page.goto(lab.notebook_url("sidebar.ipynb"))
        open_sidebar(page)
        sidebar = page.locator(SIDEBAR)
        assert sidebar.locator("h2").inner_text() == "Pathways"

        # the kernel answers on the comm before any cell ran, and has left JAX alone
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-connection').textContent"
            ".includes('controller not started yet')", timeout=KERNEL_START_MS)

        # a program that runs until the test opens its gate shows as running on island 0
        run_cell(page, 0)
        islands = sidebar.locator(".pw-island")
        islands.nth(1).wait_for(timeout=KERNEL_START_MS)  # the cell started the controller
        assert islands.count() == 2
        assert sidebar.locator('.pw-island[data-island="0"] .pw-device').count() == 4
        assert sidebar.locator(".pw-policy").input_value() == "fifo"
        # (the cell's matmul on island 1 may be running beside it at that moment)
        running = sidebar.locator('.pw-run[data-state="running"]', has_text="training_step")
        running.wait_for(timeout=KERNEL_START_MS)
        assert "on island 0" in running.inner_text()
        sidebar.locator('.pw-slice[data-slice="serve"]').wait_for(timeout=MS)
        serve = sidebar.locator('.pw-slice[data-slice="serve"]').inner_text()
        assert "island 1" in serve and "x=2 (explicit)" in serve
        # every slice is listed, also those made with ctl.slice(...), by their variable
        sidebar.locator('.pw-slice[data-slice="one"]').wait_for(timeout=MS)
        assert "x=1 (auto)" in sidebar.locator('.pw-slice[data-slice="one"]').inner_text()
        sidebar.locator('.pw-device[data-busy="true"]').first.wait_for(timeout=MS)
        # the held device's utilization climbs with the pushes (the window is 2 s)
        page.wait_for_function(
            f"[...document.querySelectorAll('{SIDEBAR} .pw-device[data-busy=\"true\"] "
            ".pw-dev-util')].some(e => parseInt(e.textContent) >= 90)", timeout=MS)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))
        keep(SCREENSHOT, "sidebar.png")  # docs/img/, when PWKERNEL_DOC_IMAGES=1

        # actions: cancel the queued second step, switch the policy, export the trace
        running.locator(".pw-cancel").click()
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-message').textContent"
            ".includes('1 computation(s) cancelled')", timeout=MS)
        sidebar.locator(".pw-policy").select_option("share")
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-message').textContent === 'policy: share'",
            timeout=MS)
        sidebar.locator(".pw-export").click()
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-message').textContent"
            ".includes('trace saved')", timeout=MS)
        path = Path(re.search(r": (/\S+\.json)$", message(page)).group(1))
        assert path.parent == lab.root and path.is_file()

        # opening the gate ends the program: the list empties, the policy stays
        run_cell(page, 1)
        sidebar.locator(".pw-runs .pw-empty").wait_for(timeout=MS)
        assert sidebar.locator(".pw-run").count() == 0
        assert sidebar.locator(".pw-policy").input_value() == "share"

        # a %%pathways cell blocks the kernel; meanwhile the sidebar follows another notebook
        # (a plain Python kernel: it offers to load pwkernel) and comes back: it reconnects
        # while the cell runs, Cancel is answered at once and the cell ends with the cancel
        # error within a second
        run_cell(page, 2)
        blocking = sidebar.locator('.pw-run[data-state="running"]', has_text="cell[")
        blocking.wait_for(timeout=KERNEL_START_MS)
        page.locator('.jp-SideBar [data-id="filebrowser"]').click()
        page.locator(".jp-DirListing-itemText", has_text="plain.ipynb").dblclick()
        page.locator(".jp-NotebookPanel:visible .jp-Cell", has_text="1 + 1").wait_for(
            timeout=MS)
        open_sidebar(page)
        load = sidebar.locator("button.pw-load")
        load.wait_for(state="visible", timeout=KERNEL_START_MS)
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="sidebar.ipynb").click()
        blocking.wait_for(timeout=MS)  # connected again, the cell still running
        cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(2)
        failed = cell.locator(".jp-OutputArea-output", has_text=CANCELLED)
        assert failed.count() == 0
        cell.evaluate(CLOCK_JS, CANCELLED)  # times click and output in the page itself
        blocking.locator(".pw-cancel").click()
        failed.wait_for(timeout=MS)
        assert "CancelledError" in failed.inner_text()
        clock = page.evaluate("window.pwCancelClock")
        assert None not in clock.values(), f"the page's clock missed an event: {clock}"
        ended = (clock["output"] - clock["click"]) / 1000
        assert ended < 1.0, f"the cell ended {ended:.2f} s after Cancel"
        assert re.search(r"run \d+: \d{3} computation\(s\) cancelled", message(page)), \
            message(page)
        sidebar.locator(".pw-runs .pw-empty").wait_for(timeout=MS)
        with kernel_client(lab, "sidebar.ipynb") as client:  # the comm it left was closed
            assert run_code(client, COMMS).split() == ["1", "1"]

        # "Show schedule" inserts the schedule view below the active cell and runs it
        cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
        before = cells.count()
        sidebar.locator(".pw-schedule").click()
        view = cells.filter(has_text="pw.ScheduleView(pw.controller())")
        view.wait_for(timeout=MS)
        assert cells.count() == before + 1
        view.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(
            timeout=KERNEL_START_MS)  # it ran, and without an error: the view is drawn
        view.locator("canvas").first.wait_for(timeout=MS)
        assert view.locator('[data-mime-type="application/vnd.jupyter.stderr"]').count() == 0, \
            view.locator(".jp-OutputArea").inner_text()

        # the palette has the three commands
        page.keyboard.press("Control+Shift+C")
        page.keyboard.type("Pathways")
        palette = page.locator(".lm-CommandPalette-content")
        palette.get_by_text("Pathways: Insert %%pathways cell").wait_for(timeout=MS)
        for label in ("Pathways: Show schedule", "Pathways: Export trace"):
            assert palette.get_by_text(label).count() == 1
        page.keyboard.press("Escape")

        # the same kernel on a simulated pod: 2 x 1024 devices, 64 cells per island
        with kernel_client(lab, "sidebar.ipynb") as client:
            run_code(client, "get_ipython().run_line_magic('pathways', "
                             "'attach sim --preset tpu-v4 --islands 1024,1024')")
        page.wait_for_function(
            f"document.querySelectorAll('{SIDEBAR} .pw-island[data-island=\"0\"] "
            ".pw-device').length === 64", timeout=MS)
        pod = sidebar.locator('.pw-island[data-island="0"]')
        assert pod.locator(".pw-device").first.get_attribute("data-device") == "0-15"
        assert "sim · 1024 devices" in pod.inner_text()

        # back to the plain Python kernel: load pwkernel there
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="plain.ipynb").click()
        load.wait_for(state="visible", timeout=KERNEL_START_MS)
        load.click()
        islands.nth(1).wait_for(timeout=KERNEL_START_MS)
        assert sidebar.locator(".pw-policy").input_value() == "fifo"  # a new kernel's own

        # a kernel restart: the sidebar reconnects (and the fresh kernel has no pwkernel)
        page.locator(".jp-NotebookPanel:visible .jp-Cell").first.locator(
            ".jp-InputPrompt").click()
        page.keyboard.press("Escape")
        page.keyboard.press("0")
        page.keyboard.press("0")
        page.locator(".jp-Dialog .jp-mod-accept").click()
        load.wait_for(state="visible", timeout=KERNEL_START_MS)
        load.click()
        islands.nth(1).wait_for(timeout=KERNEL_START_MS)
        assert not page.errors, f"errors in the page: {page.errors}"  # every one, not ours only
        assert not errors, errors


def test_sidebar_connects_when_pwkernel_is_loaded_in_a_cell(tmp_path):
    """A plain Python kernel: `%load_ext pwkernel` typed in a cell (not the sidebar's button)
    connects the sidebar; `%unload_ext pwkernel` offers to load it again, and loading it in a
    cell connects again."""
    with lab_with_pwkernel(tmp_path / "lab") as lab, chromium_page(tmp_path / "profile") as page:
        write_notebook(lab.root / "plain.ipynb",
                       ["%load_ext pwkernel", "%unload_ext pwkernel",
                        "%load_ext pwkernel\n%pathways status"], kernel="python3")
        page.goto(lab.notebook_url("plain.ipynb"))
        open_sidebar(page)
        sidebar = page.locator(SIDEBAR)
        load = sidebar.locator("button.pw-load")
        load.wait_for(state="visible", timeout=KERNEL_START_MS)
        run_cell(page, 0)
        page.wait_for_function(
            f"document.querySelector('{SIDEBAR} .pw-connection')?.textContent"
            ".includes('controller not started yet')", timeout=KERNEL_START_MS)
        assert not load.is_visible()
        run_cell(page, 1)
        load.wait_for(state="visible", timeout=MS)
        run_cell(page, 2)
        sidebar.locator(".pw-island").nth(1).wait_for(timeout=KERNEL_START_MS)
        assert not load.is_visible()
        assert not page.errors, f"errors in the page: {page.errors}"

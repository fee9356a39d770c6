"""Helpers for the browser tests: a private JupyterLab and a chromium page.

The server is the venv's ``jupyter lab`` on 127.0.0.1 (free port, a token, a temporary root
dir and runtime dir); its ``python3`` kernelspec is written to a temporary ``JUPYTER_PATH`` so
the notebook kernel is this interpreter, whatever else is installed. Readiness is read from
the server's own log line, not guessed with sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def needs_chromium() -> None:
    """Skip the calling browser test where Debian's Chromium is not installed."""
    import pytest

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install "
                    "chromium) to run the browser tests")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
JUPYTER = Path(sys.executable).with_name("jupyter")

#: A notebook cell's source: the paper's Figure 2 program ``fig2`` on the kernel's controller
#: ``ctl`` (two islands of 2+ devices), plus a consumer ``d`` on a second slice of island 0.
FIG2_CELL = """\
import numpy as np
import pwkernel as pw

ctl = pw.controller()                       # islands from PWKERNEL_ISLANDS=4,4
s0, s1, s2 = ctl.slice(2, island=0), ctl.slice(2, island=1), ctl.slice(2, island=0)
a = pw.function(lambda x: x * 2, slice=s0)
b = pw.function(lambda x: x + 1, slice=s1)
c = pw.function(lambda x: x / 2, slice=s1)
d = pw.function(lambda x: x - 1, slice=s2)

@pw.program
def fig2(v):
    x = a(v)
    return b(x), a(c(x)), d(x)
"""

#: Browser-side: the texts of the Bokeh hover tooltip's values now in the page.
TOOLTIP_JS = """() => {
  const found = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.classList && el.classList.contains("bk-tooltip-row-value")) found.push(el.textContent);
    }
  };
  walk(document);
  return found;
}"""


@dataclass
class LabServer:
    url: str
    token: str
    root: Path
    runtime: Path
    log: Path

    def notebook_url(self, name: str) -> str:
        return f"{self.url}lab/tree/{name}?token={self.token}"

    def api(self, path: str) -> object:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}api/{path}?token={self.token}", timeout=30) as r:
            return json.loads(r.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_kernelspec(jupyter_path: Path) -> None:
    """A ``python3`` kernelspec that runs this very interpreter (the venv's)."""
    spec = jupyter_path / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))


def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"cell{i}",
                     "metadata": {}, "outputs": [], "source": src}
                    for i, src in enumerate(cells)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb, indent=1))
    return path


def _quiet_settings(settings: Path) -> None:
    # No news or update notifications drawn over the screenshot, and no network lookups.
    target = settings / "@jupyterlab" / "apputils-extension"
    target.mkdir(parents=True, exist_ok=True)
    (target / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@contextlib.contextmanager
def jupyter_lab(base: Path, env_extra: dict[str, str], timeout: float = 180.0
                ) -> Iterator[LabServer]:
    """Run ``jupyter lab`` until the block ends; its kernels are shut down with it."""
    root, jpath, settings, ws, runtime = (base / n for n in
                                          ("root", "jupyter", "settings", "ws", "runtime"))
    for d in (root, jpath, settings, ws, runtime):
        d.mkdir(parents=True, exist_ok=True)
    write_kernelspec(jpath)
    _quiet_settings(settings)
    token, port = secrets.token_hex(16), free_port()
    env = {**os.environ, **env_extra, "JUPYTER_PATH": str(jpath),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(base / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(ws),
           "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}/"
    log = base / "lab.log"
    proc = subprocess.Popen(
        [str(JUPYTER), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # its own process group: the kernels go down with it
    ready = threading.Event()

    def pump() -> None:  # copy the log to a file; the URL line means the server listens
        with log.open("w") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                if f"127.0.0.1:{port}/" in line:
                    ready.set()
        ready.set()  # the server exited: stop waiting

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout) or proc.poll() is not None:
            raise RuntimeError(f"jupyter lab did not start within {timeout} s:\n"
                               f"{log.read_text()[-3000:]}")
        yield LabServer(url, token, root, runtime, log)
    finally:
        proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # only the group this fixture started
            proc.wait(timeout=10)
        reader.join(10)


@contextlib.contextmanager
def chromium_page(profile: Path, width: int = 1400, height: int = 1000):
    """A Playwright page in Debian's chromium, fresh profile, collecting page errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.errors = []  # type: ignore[attr-defined]
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            yield page
        finally:
            context.close()


@contextlib.contextmanager
def kernel_client(lab: LabServer, notebook: str, timeout: float = 60.0):
    """A second client on the notebook's running kernel (its shell queue is FIFO, so code
    sent here runs after every message the browser sent before it)."""
    from jupyter_client import BlockingKernelClient

    sessions = [s for s in lab.api("sessions") if s["path"].endswith(notebook)]
    assert sessions, f"no kernel session for {notebook}: {lab.api('sessions')}"
    conn = lab.runtime / f"kernel-{sessions[0]['kernel']['id']}.json"
    client = BlockingKernelClient(connection_file=str(conn))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
        yield client
    finally:
        client.stop_channels()


def run_code(client, code: str, timeout: float = 60.0) -> str:
    """Execute ``code`` in the kernel; return its stdout (raises on an error)."""
    out: list[str] = []
    errors: list[str] = []

    def hook(msg) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content.get("name") == "stdout":
            out.append(content["text"])
        elif kind == "error":
            errors.append("\n".join(content.get("traceback", [])))

    client.execute_interactive(code, timeout=timeout, output_hook=hook)
    if errors:
        raise AssertionError(f"kernel code failed:\n{code}\n{errors[0][-3000:]}")
    return "".join(out)


def hover_tooltip(page, x: float, y: float) -> list[str]:
    """Move the mouse onto page point ``(x, y)`` until Bokeh's hover tooltip shows (under load
    a plot may take the first moves before its hover tool listens: up to a minute in all);
    its values' texts."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(12):
        page.mouse.move(x - 3, y)
        page.mouse.move(x, y)
        try:
            page.wait_for_function(f"() => ({TOOLTIP_JS})().length > 0", timeout=5000)
            break
        except PlaywrightTimeout:
            continue
    return [v.strip() for v in page.evaluate(TOOLTIP_JS)]


def open_notebook(page, lab: LabServer, notebook: str) -> None:
    """Open ``notebook`` in JupyterLab, wait for its kernel to be idle, and select its first
    cell in command mode (ready for Shift+Enter or the Run menu)."""
    page.set_default_timeout(180_000)
    page.goto(lab.notebook_url(notebook))
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="visible")
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for()
    page.click(".jp-Notebook .jp-Cell >> nth=0")
    page.keyboard.press("Escape")

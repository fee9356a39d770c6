"""The README's main command: ``make lab`` serves JupyterLab, whoever runs it (root too)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

from tests.helpers import ROOT

URL = re.compile(r"(http://(?:127\.0\.0\.1|localhost):\d+/lab\?token=\w+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fetch(url: str, deadline: float) -> tuple[int, str]:
    """GET ``url``; a server still starting up (connection refused, slow first page) is
    asked again until ``deadline``."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, deadline - time.monotonic())) as r:
                return r.status, r.read().decode()
        except OSError:
            if time.monotonic() >= deadline:
                raise


def test_make_lab_serves_jupyterlab_and_stops():
    port = _free_port()
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_ARGS=--no-browser --port={port} --ServerApp.port_retries=0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHON": os.environ.get("PYTHON", "python3")})
    found: list[str] = []
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            match = URL.search(line)
            if match and not found:
                found.append(match.group(1))
                seen.set()
        seen.set()  # the output ended: make lab stopped

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(240), "make lab printed no URL within 240 s:\n" + "".join(lines)
        assert found, "make lab ended without serving:\n" + "".join(lines[-30:])
        status, body = _fetch(found[0], deadline=time.monotonic() + 240)
        assert status == 200 and "JupyterLab" in body
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the server it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=30)
    assert proc.returncode is not None

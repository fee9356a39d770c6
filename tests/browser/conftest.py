"""Browser tests: real JupyterLab servers driven by Debian's chromium through Playwright."""

from __future__ import annotations


def pytest_configure(config) -> None:
    # Registered here (not in pyproject) so `-m browser` / `-m "not browser"` work on their own.
    config.addinivalue_line(
        "markers", "browser: starts JupyterLab and a headless chromium (slow; needs "
                   "/usr/bin/chromium)")

"""The browser tests' screenshots: kept under test-artifacts/, and copied over the
documentation's images (docs/img/) only when asked, so a test run leaves the checkout as it was.

    PWKERNEL_DOC_IMAGES=1 .venv/bin/pytest tests/viz/test_schedule_view_browser.py \
        tests/notebook/test_sidebar_browser.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import ROOT

ARTIFACTS = ROOT / "test-artifacts"
ASK = "PWKERNEL_DOC_IMAGES"  # set to 1 to refresh docs/img/ from a run


def keep(shot: Path, name: str) -> Path | None:
    """Copy the screenshot ``shot`` to ``docs/img/<name>`` when ``PWKERNEL_DOC_IMAGES=1``;
    returns the path written, or None."""
    if os.environ.get(ASK) != "1":
        return None
    dest = ROOT / "docs" / "img" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, dest)
    return dest

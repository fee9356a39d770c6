"""The training tests' controller."""

from __future__ import annotations

import pytest

import pwkernel as pw


@pytest.fixture(scope="module")
def tctl():
    """One controller per test module (2 islands x 4 devices): compiled steps are reused."""
    ctl = pw.Controller(islands=(4, 4))
    try:
        yield ctl
    finally:
        ctl.close()

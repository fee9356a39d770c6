"""Cells in a real IPython ``InteractiveShell`` (its ``ip`` fixture: tests/notebook/conftest.py)."""

from __future__ import annotations


def run(ip, source: str):
    """Run a cell; return its result, raising the cell's error (UsageError included)."""
    result = ip.run_cell(source)
    if result.error_before_exec is not None:
        raise result.error_before_exec
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result

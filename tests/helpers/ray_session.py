"""The session directory of the local Ray cluster this process started (``/tmp/ray/
session_*``), read from its processes' command lines."""

from __future__ import annotations

import re
from pathlib import Path

import psutil


def cluster_processes() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def session_dir(processes: list[psutil.Process]) -> Path:
    """The one session directory ``processes`` (the cluster's) name."""
    found = {m for p in processes for m in re.findall(r"/\S+/session_\d[\d_-]+",
                                                      " ".join(_cmdline(p)))}
    assert len(found) == 1 and Path(*found).is_dir(), found
    return Path(*found)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # (gone, or a zombie: a killed actor not reaped yet)
        return []

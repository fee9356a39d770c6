"""Helpers for the Pathways sidebar's browser test. The server and the browser are the shared
ones of ``tests.helpers.lab`` (a private JupyterLab on 127.0.0.1 with a token; Debian's chromium);
this adds the ``pwkernel`` kernelspec to that server's JUPYTER_PATH and notebooks on it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from pwkernel.notebook import kernelspec
from tests.helpers import ROOT
from tests.helpers.lab import CHROMIUM, LabServer, chromium_page, jupyter_lab

__all__ = ["CHROMIUM", "chromium_page", "lab_with_pwkernel", "write_notebook"]


@contextlib.contextmanager
def lab_with_pwkernel(base: Path, env_extra: dict[str, str] | None = None
                      ) -> Iterator[LabServer]:
    """``lab.jupyter_lab`` whose JUPYTER_PATH also holds the ``pwkernel`` kernel (this
    interpreter with ``--ext pwkernel``) and this checkout's sidebar extension, whatever is
    installed in the environment; ``env_extra``: more of the server's (and kernels')
    environment."""
    kernelspec.write(base / "jupyter")  # the directory jupyter_lab puts on JUPYTER_PATH
    # this checkout's build of the sidebar, whichever checkout the environment links
    (base / "jupyter" / "labextensions").mkdir(parents=True, exist_ok=True)
    (base / "jupyter" / "labextensions" / "pwkernel").symlink_to(ROOT / "pwkernel" / "labextension")
    with jupyter_lab(base, env_extra or {}) as lab:
        yield lab


def write_notebook(path: Path, sources: list[str], kernel: str = kernelspec.NAME) -> Path:
    """An .ipynb with code cells ``sources`` on ``kernel`` ("pwkernel" or "python3")."""
    display = kernelspec.DISPLAY_NAME if kernel == kernelspec.NAME else "Python 3 (ipykernel)"
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}",
                     "metadata": {}, "outputs": [], "source": s} for i, s in enumerate(sources)],
          "metadata": {"kernelspec": {"name": kernel, "display_name": display,
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb, indent=1))
    return path

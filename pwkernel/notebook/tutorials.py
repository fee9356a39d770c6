"""The tutorial notebooks, generated from their sources.

Each tutorial is written as a percent-format Python file, ``notebooks/NN_name.py`` (cells
start at ``# %%``, Markdown cells at ``# %% [markdown]``; magics are commented, ``# %load_ext``),
so that editors, ``ruff`` and code review see real code. The ``.ipynb`` next to it is generated
from it by ``jupytext``, without outputs and with cell ids numbered in order, so the same
source always gives the same bytes::

    python -m pwkernel.notebook.tutorials           # rewrite every notebook (make notebooks)
    python -m pwkernel.notebook.tutorials --check   # exit 1 and name those out of date

Needs ``jupytext`` (in the ``dev`` extras).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def sources(folder: Path = NOTEBOOKS) -> list[Path]:
    """The tutorial sources in ``folder``, in order: ``NN_*.py``."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def render(source: Path) -> str:
    """The ``.ipynb`` text generated from ``source`` (a percent-format tutorial)."""
    import jupytext
    import nbformat

    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata = {"kernelspec": nb.metadata["kernelspec"]}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb) + "\n"


def stale(folder: Path = NOTEBOOKS) -> list[str]:
    """The notebooks in ``folder`` that differ from what their sources give (or are missing)."""
    out = []
    for source in sources(folder):
        target = source.with_suffix(".ipynb")
        if not target.exists() or target.read_text() != render(source):
            out.append(target.name)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pwkernel.notebook.tutorials",
        description="Write every tutorial notebook notebooks/NN_name.ipynb from its source "
                    "notebooks/NN_name.py (make notebooks).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; name the notebooks out of date, exit 1 if any")
    if parser.parse_args(argv).check:
        out = stale()
        for name in out:
            print(f"{name} is out of date: run `make notebooks`", file=sys.stderr)
        return 1 if out else 0
    for source in sources():
        source.with_suffix(".ipynb").write_text(render(source))
        print("wrote", source.with_suffix(".ipynb").name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

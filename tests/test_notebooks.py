"""The tutorials (``notebooks/NN_*.ipynb``) run top to bottom on the real ``pwkernel`` kernel.

Each notebook asserts its own claims on the numbers it measures, so a test here fails when a
cell raises: an assertion about the paper's effect, a runtime error, or a broken view. The
committed notebooks must also be exactly what ``notebooks/_build.py`` writes (sources only,
no outputs), so the reviewed code and the files agree.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pwkernel.notebook import kernelspec

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT = 300       # seconds per cell: generous, a busy 2-core machine is slow
NOTEBOOK_BUDGET = 90     # seconds a notebook may take, kernel start included (each takes 2-15 s
                         # on an idle 2-core machine: the budget leaves room for a busy one)


def _builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _builder()
#: tutorials written as jupytext percent-format sources (``notebooks/NN_name.py``), their
#: ``.ipynb`` generated from them (``jupytext``: no outputs, cell ids numbered in order)
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
NAMES = list(BUILD.NOTEBOOKS) + [p.stem for p in SOURCES]


def render(source: Path) -> str:
    """The ``.ipynb`` text a percent-format source gives."""
    import jupytext

    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata = {"kernelspec": nb.metadata["kernelspec"]}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb) + "\n"


def _errors(nb) -> list[str]:
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                tb = "\n".join(o.get("traceback", [])[-6:])
                out.append(f"cell {i} ({cell.source.splitlines()[0][:60]!r}): "
                           f"{o.ename}: {o.evalue}\n{tb}")
    return out


def _stdout(nb) -> str:
    return "".join(o.text for c in nb.cells for o in c.get("outputs", [])
                   if o.output_type == "stream" and o.name == "stdout")


def test_notebooks_from_sources_match_them():
    assert SOURCES, "expected notebooks/08_pathways_at_scale_simulated.py"
    for source in SOURCES:
        target = source.with_suffix(".ipynb")
        assert target.exists() and target.read_text() == render(source), (
            f"{target.name} differs from {source.name}; regenerate it with jupytext "
            "(tests/test_notebooks.py render)")


def test_committed_notebooks_match_the_generator():
    for name in BUILD.NOTEBOOKS:
        path = NOTEBOOKS / f"{name}.ipynb"
        assert path.exists(), f"{path.name} is missing; run .venv/bin/python notebooks/_build.py"
        assert path.read_text() == BUILD.render(name), (
            f"{path.name} differs from notebooks/_build.py; run .venv/bin/python "
            "notebooks/_build.py (and keep outputs out of the committed files)")


@pytest.mark.parametrize("name", NAMES)
def test_notebook_metadata(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert nb.metadata.kernelspec == {"name": "pwkernel", "display_name": "Pathways (JAX)",
                                      "language": "python"}
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "What the paper found" in first.source
    assert "What we measured here" in nb.cells[-2].source and nb.cells[-1].cell_type == "code"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel_env, tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=CELL_TIMEOUT,
                            startup_timeout=120, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    errors = _errors(nb)
    assert not errors, "\n\n".join(errors)
    # Every notebook ends by printing what it measured.
    assert nb.cells[-1].outputs and any(o.output_type == "stream"
                                        for o in nb.cells[-1].outputs), "no closing summary"
    print(f"{name}: {seconds:.1f} s (budget {NOTEBOOK_BUDGET} s)\n{_stdout(nb)[-1500:]}")
    assert seconds <= NOTEBOOK_BUDGET, (
        f"{name} took {seconds:.0f} s, over its budget of {NOTEBOOK_BUDGET} s: a tutorial is "
        "meant to run in a minute or so; make its workload smaller")

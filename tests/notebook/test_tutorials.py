"""The tutorials (``notebooks/NN_*.ipynb``) run top to bottom on the real ``pwkernel`` kernel.

Each notebook asserts its own claims on the numbers it measures, so a test here fails when a
cell raises: an assertion about the paper's effect, a runtime error, or a broken view. The
committed notebooks must also be exactly what their sources ``notebooks/NN_*.py`` give
(``python -m pwkernel.notebook.tutorials``: sources only, no outputs), so the reviewed code and
the files agree.
"""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from pwkernel.notebook import kernelspec, tutorials
from tests.helpers import ROOT
from tests.helpers.kernel import cell_errors

NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 300  # seconds per cell before nbclient gives up on a hung one (not a budget:
                    # how long a tutorial takes is measured by a benchmark, not a test)


SOURCES = tutorials.sources(NOTEBOOKS)
NAMES = [p.stem for p in SOURCES]


def _stdout(nb) -> str:
    return "".join(o.text for c in nb.cells for o in c.get("outputs", [])
                   if o.output_type == "stream" and o.name == "stdout")


def test_every_notebook_has_a_source():
    assert len(NAMES) >= 9, f"expected the 9 tutorial sources in {NOTEBOOKS}, found {NAMES}"
    orphans = {p.stem for p in NOTEBOOKS.glob("*.ipynb")} - set(NAMES)
    assert not orphans, f"notebooks without a source NN_name.py: {sorted(orphans)}"


def test_committed_notebooks_match_their_sources():
    assert tutorials.stale(NOTEBOOKS) == [], (
        "a notebook differs from its source notebooks/NN_name.py: edit the source, then run "
        "`make notebooks` (python -m pwkernel.notebook.tutorials)")


def test_drift_is_caught(tmp_path):
    source = SOURCES[0]
    (tmp_path / source.name).write_text(source.read_text())
    (tmp_path / source.with_suffix(".ipynb").name).write_text(tutorials.render(source))
    assert tutorials.stale(tmp_path) == []
    edited = source.read_text().replace("# %% [markdown]", "# %% [markdown]\n# edited", 1)
    (tmp_path / source.name).write_text(edited)
    assert tutorials.stale(tmp_path) == [source.with_suffix(".ipynb").name]


def test_the_command_refuses_what_it_does_not_know(capsys):
    """A misspelt --check rewrote every notebook and exited 0, so the check it was meant to
    be passed whatever the notebooks held; --help did the same instead of showing help."""
    for argv in (["--chek"], ["--help"]):
        before = {p: p.stat().st_mtime_ns for p in NOTEBOOKS.glob("*.ipynb")}
        with pytest.raises(SystemExit) as done:
            tutorials.main(argv)
        assert done.value.code == (2 if argv == ["--chek"] else 0), argv
        assert {p: p.stat().st_mtime_ns for p in NOTEBOOKS.glob("*.ipynb")} == before, argv
    assert "--check" in capsys.readouterr().out

@pytest.mark.parametrize("name", NAMES)
def test_notebook_metadata(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert nb.metadata.kernelspec == {"name": "pwkernel", "display_name": "Pathways (JAX)",
                                      "language": "python"}
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "What the paper found" in first.source
    assert "What we measured here" in nb.cells[-2].source and nb.cells[-1].cell_type == "code"


# Cells a user may well run twice (Shift+Enter again): each runs a second time right after its
# first run, then the check given (code run in the kernel, "" for none) must pass too.
_ONE_OPEN = ("import gc\nassert sum(isinstance(o, pw.Controller) and not o.closed\n"
             "           for o in gc.get_objects()) == 1, 'a rerun left a controller open'")
_ONE_RAY = ("import gc\nassert sum(isinstance(o, pw.Controller) and not o.closed\n"
            "           and o.backend == 'ray' for o in gc.get_objects()) == 1, "
            "'a rerun left a Ray controller open (its island actors and the cluster stay up)'")
RERUN = {
    "06_two_islands_dcn": {1: _ONE_OPEN},         # makes its own controller
    "07_scale_out_with_ray": {2: _ONE_RAY},       # starts a Ray cluster
    "08_pathways_at_scale_simulated": {10: "", 13: ""},  # measures on a trace; a cell on a pod
    "09_training": {12: ""},                      # steps that donate their states
    "10_one_pool_many_notebooks": {7: _ONE_RAY},  # attaches this kernel to the pool
}
# Cells a user may well run again once the whole notebook has run (to measure once more): run
# again in this order after the last cell. A later cell must not have changed what they rely
# on (05's shares were measured under the FIFO policy its throughput cell left behind).
AGAIN = {
    "05_multi_tenancy": (4, 6),                   # queue the clients' work, read the shares
}


def _run_cells(client: NotebookClient, nb, reruns: dict[int, str],
               again: tuple[int, ...] = ()) -> list[str]:
    """Run ``nb``'s cells in order, each in ``reruns`` twice and then its check, then the cells
    ``again`` once more; the errors of the first runs, the checks and the runs again (the
    second runs' are left in the notebook)."""
    errors = []
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if index not in reruns:
                continue
            errors += [f"(first run) {e}" for e in cell_errors(nbformat.v4.new_notebook(
                cells=[cell]))]
            client.execute_cell(cell, index)
            if reruns[index]:
                check = nbformat.v4.new_code_cell(reruns[index])
                client.execute_cell(check, index)
                nb.cells[index] = cell  # (nbclient puts the cell it ran at that index)
                errors += [f"(after rerunning cell {index}) {e}" for e in cell_errors(
                    nbformat.v4.new_notebook(cells=[check]))]
        for index in again:
            first, cell = nb.cells[index], nbformat.v4.new_code_cell(nb.cells[index].source)
            client.execute_cell(cell, index)
            nb.cells[index] = first  # (the first run's outputs stay in the notebook)
            errors += [f"(cell {index} run again after the last) {e}" for e in cell_errors(
                nbformat.v4.new_notebook(cells=[cell]))]
    return errors


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, kernel_env, tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=CELL_TIMEOUT,
                            startup_timeout=120, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    errors = _run_cells(client, nb, RERUN.get(name, {}), AGAIN.get(name, ()))
    errors += cell_errors(nb)
    assert not errors, "\n\n".join(errors)
    # Every notebook ends by printing what it measured.
    assert nb.cells[-1].outputs and any(o.output_type == "stream"
                                        for o in nb.cells[-1].outputs), "no closing summary"
    print(f"{name}:\n{_stdout(nb)[-1500:]}")


def test_a_magic_that_fails_is_an_error(kernel_env, tmp_path):
    # (IPython shows a magic's UsageError on stderr, with no error output: a tutorial whose
    # `%pathways slice quick 4` failed on a kernel of islands (2, 2) passed that cell)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%pathways slice big 99"),
                                         nbformat.v4.new_code_cell("ok = 1")])
    client = NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=CELL_TIMEOUT,
                            startup_timeout=120, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    _run_cells(client, nb, {})
    errors = cell_errors(nb)
    assert len(errors) == 1 and errors[0].startswith("cell 0") and "does not fit" in errors[0], (
        errors)

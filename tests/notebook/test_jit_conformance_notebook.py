"""``tests/notebook/jit_conformance.ipynb`` on the real ``pwkernel`` kernel: every plain function
of ``tests/helpers/jit_cases.py`` gives the same values, types and shardings in a ``%%pathways``
cell as ``jax.jit`` under ``jax.set_mesh`` (1-D and 2-D slices, explicit and auto axes), and
where JAX refuses a function on placed data the cell raises JAX's error."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from pwkernel.notebook import kernelspec
from tests.helpers.kernel import cell_errors
from tests.notebook import jit_conformance as source


def test_committed_notebook_matches_its_source():
    assert source.PATH.read_text() == source.render(), (
        "tests/notebook/jit_conformance.ipynb is out of date; run .venv/bin/python "
        "tests/notebook/jit_conformance.py")


def test_pathways_cells_agree_with_jax_jit(kernel_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PWKERNEL_ISLANDS", "8")  # one island: 4x2 and 8-device slices
    nb = nbformat.read(source.PATH, as_version=4)
    NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=300, startup_timeout=120,
                   allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = cell_errors(nb)
    assert not errors, "\n\n".join(errors)
    ok = [o.text for c in nb.cells for o in c.get("outputs", [])
          if o.output_type == "stream" and o.text.startswith("ok:")]
    assert len(ok) == source.expected_checks() == 6 * 36, ok
    known = [o.text for c in nb.cells for o in c.get("outputs", [])
             if o.output_type == "stream" and o.text.startswith("known bug:")]
    assert len(known) == len(source.KNOWN_BUGS), known
    refused = [line for line in ok if "refused" in line]
    assert len(refused) >= 10, refused  # the placed sections reach JAX's refusals
    assert f"{len(ok)} calls agree with jax.jit" in nb.cells[-1].outputs[0].text

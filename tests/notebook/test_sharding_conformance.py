"""``tests/notebook/sharding_conformance.ipynb`` on the real ``pwkernel`` kernel: every JAX sharding
pattern gives the same values, shardings and types in a ``%%pathways`` cell as in the plain
cell under ``jax.set_mesh`` (1-D and 2-D slices, explicit and auto axes)."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from pwkernel.notebook import kernelspec
from tests.helpers.kernel import cell_errors
from tests.notebook import sharding_conformance as source


def test_committed_notebook_matches_its_source():
    assert source.PATH.read_text() == source.render(), (
        "tests/notebook/sharding_conformance.ipynb is out of date; run "
        ".venv/bin/python -m tests.notebook.sharding_conformance")


def test_pathways_cells_agree_with_plain_jax(kernel_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PWKERNEL_ISLANDS", "8")  # one island: 4x2 and 8-device slices
    nb = nbformat.read(source.PATH, as_version=4)
    NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=300, startup_timeout=120,
                   allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = cell_errors(nb)
    assert not errors, "\n\n".join(errors)
    ok = [o.text for c in nb.cells for o in c.get("outputs", [])
          if o.output_type == "stream" and o.text.startswith("ok:")]
    assert len(ok) == source.expected_checks() == 26, ok
    assert f"{len(ok)} patterns agree with plain JAX" in nb.cells[-1].outputs[0].text

"""Writes ``tests/notebook/jit_conformance.ipynb``: the plain functions of
``tests/helpers/jit_cases.py`` (no sharding annotations), each called in a
``%%pathways --slice s`` cell and compared with ``jax.jit`` of the same function under
``jax.set_mesh(s.mesh)``.

The notebook runs ``jit_cases.py``'s own text as a cell, then for every slice (1-D and 2-D,
explicit and auto axes) one ``%%pathways`` cell per function on host (NumPy) inputs, each
followed by its plain twin and ``check`` (equal pytrees, values, JAX types and shardings).
Two more sections call every function on the data already placed on the slice's mesh
(``P(A)`` on the leading axis): where JAX refuses the function, the ``%%pathways`` cell must
raise JAX's error. ``tests/notebook/test_jit_conformance_notebook.py`` executes it on the
``pwkernel`` kernel with one island of 8 devices. Edit the cases or this file, then rewrite the
notebook (from the repository's root):

    .venv/bin/python -m tests.notebook.jit_conformance
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from tests.helpers import jit_cases
from tests.notebook.sharding_conformance import HEAD, KERNELSPEC, _indent

PATH = Path(__file__).resolve().parent / "jit_conformance.ipynb"

SETUP = HEAD + """
DATA = ("x", "v", "y", "i", "i8", "tree", "pair", "state")  # not weights, states or keys


def placed(values, mesh):
    \"\"\"The data on ``mesh``: each array leaf whose leading axis divides, as P(A).\"\"\"
    def put(leaf):
        if np.ndim(leaf) and np.shape(leaf)[0] % mesh.shape[A] == 0:
            return jax.device_put(leaf, NamedSharding(mesh, P(A)))
        return leaf
    return {k: jax.tree.map(put, v) if k in DATA else v for k, v in values.items()}


def check(call, got, want):
    \"\"\"The %%pathways cell's result (futures) agrees with jax.jit's: pytree, values,
    JAX types (dtype, weak type, sharding in types) and shardings.\"\"\"
    where = f"{call} on the {WHERE} slice ({HOW} inputs)"
    assert jax.tree.structure(got) == jax.tree.structure(want), (
        f"{where}: pytree {jax.tree.structure(got)}; jax.jit gives {jax.tree.structure(want)}")
    for (path, fut), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want),
                              strict=True):
        what = f"{where}{jax.tree_util.keystr(path)}"
        assert isinstance(fut, pw.Future), f"{what} should be a Future, is {fut!r}"
        g = fut.result(120)
        assert jax.typeof(g) == jax.typeof(w), (
            f"{what}: type {jax.typeof(g)}; jax.jit gives {jax.typeof(w)}")
        for sharding in (fut.sharding, g.sharding):  # known at once, and as it came
            assert sharding.is_equivalent_to(w.sharding, w.ndim), (
                f"{what}: laid out as {sharding.spec}; jax.jit gives {w.sharding.spec}")
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):  # a typed key: its key data
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=1e-5, atol=1e-5, err_msg=what)
    CHECKED.append(where)
    print("ok:", where)


def compare(call, reference):
    \"\"\"``out = <call>`` as a %%pathways cell on ``s``, and ``reference()`` (jax.jit of the
    same call) under jax.set_mesh: equal results, or the same error from JAX.\"\"\"
    try:
        with jax.set_mesh(s.mesh):
            want = reference()
    except Exception as e:
        refused = e
    else:
        refused = None
    globals().pop("out", None)
    try:
        get_ipython().run_cell_magic("pathways", "--slice s", f"out = {call}\\n")
    except Exception as e:
        assert refused is not None, f"{call} on {WHERE} ({HOW}): jax.jit runs it; the cell " \\
            f"raised {type(e).__name__}: {e}"
        cause = str(refused).strip().splitlines()[0]
        told = " ".join([str(e), *getattr(e, "__notes__", [])])
        assert cause in told, f"{call} on {WHERE}: the cell should raise JAX's {cause!r}; " \\
            f"it raised {type(e).__name__}: {told}"
        CHECKED.append(f"{call} on the {WHERE} slice ({HOW} inputs): refused")
        print(f"ok: {call} on the {WHERE} slice ({HOW} inputs): refused as jax.jit refuses")
        return
    assert refused is None, f"{call} on {WHERE} ({HOW}): jax.jit refuses it ({refused}); " \\
        "the cell ran"
    bug = KNOWN_BUGS.get((call, WHERE, HOW))
    if bug is None:
        return check(call, out, want)
    try:
        check(call, out, want)
    except AssertionError as e:
        print(f"known bug: {call} on the {WHERE} slice ({HOW} inputs): {e}")
        return
    raise AssertionError(f"{call} on {WHERE} ({HOW}) now agrees with jax.jit: take it out of "
                         "KNOWN_BUGS in tests/notebook/jit_conformance.py")"""

# pwkernel bugs the notebook shows: (call, slice, inputs) -> what goes wrong. Each must still
# fail (the notebook says "known bug:"); take it out when it is fixed. None today (a pytree
# mixing arrays and plain values, e.g. a NamedTuple with an np.int32 step, is an input now).
KNOWN_BUGS: dict = {}

INPUTS = """\
WHERE, HOW = {where!r}, {how!r}
s = SLICES[WHERE]
A = s.axis_names[0]
globals().update(inputs() if HOW == "host" else placed(inputs(), s.mesh))
print(WHERE, HOW, s, jax.typeof(x))"""

# (slice, how the inputs come): host inputs on every slice, the data placed on two
SECTIONS = [("2-D explicit", "host"), ("2-D auto", "host"), ("1-D explicit", "host"),
            ("1-D auto", "host"), ("2-D explicit", "placed"), ("1-D auto", "placed")]

# A call with no array inputs is plain Python in a cell (as it is without the magic); a
# Python scalar into a compiled function is tests/runtime/test_jit_conformance.py's business.
CASES = [case for case in jit_cases.CASES if any(isinstance(a, str) for a in case.args)]


def cells() -> list[nbformat.NotebookNode]:
    out = [nbformat.v4.new_markdown_cell(
        "# jax.jit conformance: plain functions in `%%pathways` cells\n\n"
        "Each function of `tests/helpers/jit_cases.py` runs as a `%%pathways --slice s` cell, then "
        "through `jax.jit` under `jax.set_mesh(s.mesh)`; `check` asserts equal values, types "
        "and shardings. Generated by `tests/notebook/jit_conformance.py`."),
        nbformat.v4.new_code_cell(SETUP + f"\n\n\nKNOWN_BUGS = {KNOWN_BUGS!r}"),
        nbformat.v4.new_markdown_cell("## The functions (`tests/helpers/jit_cases.py`)"),
        nbformat.v4.new_code_cell(Path(jit_cases.__file__).read_text().rstrip("\n"))]
    for where, how in SECTIONS:
        out.append(nbformat.v4.new_markdown_cell(f"## The {where} slice, {how} inputs"))
        out.append(nbformat.v4.new_code_cell(INPUTS.format(where=where, how=how)))
        for case in CASES:
            call, jitted = case.source(), case.jit_source()
            if how == "host":
                out.append(nbformat.v4.new_code_cell(f"%%pathways --slice s\nout = {call}"))
                out.append(nbformat.v4.new_code_cell(
                    f"got = out\nwith jax.set_mesh(s.mesh):\n{_indent('out = ' + jitted)}"
                    f"\ncheck({call!r}, got, out)"))
            else:
                out.append(nbformat.v4.new_code_cell(
                    f"compare({call!r}, lambda: {jitted})"))
    out.append(nbformat.v4.new_code_cell(
        "print(f'{len(CHECKED)} calls agree with jax.jit')"))
    return out


def expected_checks() -> int:
    """How many calls the notebook checks (known bugs aside)."""
    return len(SECTIONS) * len(CASES) - len(KNOWN_BUGS)


def render() -> str:
    nb = nbformat.v4.new_notebook(cells=cells(), metadata={"kernelspec": KERNELSPEC})
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return nbformat.writes(nb) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
    sys.exit(0)

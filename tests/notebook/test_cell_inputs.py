"""A %%pathways cell's inputs are the names it may read before it binds them: a name the cell
binds first and reads after is its own, never the notebook's (stale) value."""

from __future__ import annotations

import ast
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from pwkernel.notebook import cell
from tests.helpers.shell import run

CASES = [
    ("y = f(x)\nz = y + 1\n", {"f", "x"}),
    ("x += 1\n", {"x"}),
    ("y = 1\ndel y\nz = y\n", {"y"}),
    # control flow: where the binding may be skipped, the name stays an input
    ("if c:\n    y = 1\nz = y\n", {"c", "y"}),
    ("if c:\n    y = 1\nelse:\n    y = 2\nz = y\n", {"c"}),
    ("for i in r:\n    y = i\nz = y + i\n", {"r", "y", "i"}),
    ("while c:\n    y = 1\nz = y\n", {"c", "y"}),
    ("try:\n    y = a\nexcept E as e:\n    pass\nz = y\n", {"a", "E", "y"}),
    ("try:\n    y = a\nfinally:\n    w = 1\nz = y + w\n", {"a"}),
    ("with m as q:\n    y = q\nz = y\n", {"m"}),
    ("if (n := k) > 0:\n    z = n\n", {"k"}),
    ("match v:\n    case 1:\n        y = 2\nz = y\n", {"v", "y"}),
    # functions, classes and comprehensions read at their definition (conservatively)
    ("def g():\n    return y\ny = 1\nz = g()\n", {"y"}),
    ("y = 1\ndef g():\n    return y\nz = g()\n", set()),
    ("z = [v * y for v in xs]\n", {"y", "xs"}),
    ("y = 2\nz = [v * y for v in xs]\n", {"xs"}),
    ("class C:\n    k = y\n", {"y"}),
    ("import numpy as np2\nz = np2.ones(2)\n", set()),
]


@pytest.mark.parametrize(("source", "inputs"), CASES)
def test_inputs_are_names_read_before_the_cell_binds_them(source, inputs):
    assert cell.reads_before_binding(ast.parse(source)) == inputs


@pytest.fixture
def nb(ip):
    run(ip, "%pathways slice s 2")
    return ip


def test_a_name_bound_then_read_is_no_input(nb):
    # the notebook's y is a future of a closed controller: reading it would fail the cell
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = pw.Controller(islands=(2,))
    stale = pw.function(lambda: jnp.full(2, 100.0), slice=other.slice(1))()
    stale.result(60)
    other.close()
    nb.user_ns["y"] = stale
    run(nb, "%%pathways --slice s\nx = jnp.ones(2)\n")
    plan = cell.analyse("y = x * 2\nz = y + 1\n", nb.user_ns, "<cell>", 0, print)
    assert plan.params == ["x"]
    run(nb, "%%pathways --slice s\ny = x * 2\nz = y + 1\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["z"]), np.full(2, 3.0))
    np.testing.assert_allclose(np.asarray(nb.user_ns["y"]), np.full(2, 2.0))
    # a statement that runs as plain Python (it needs a value) fetches only the futures it
    # reads before binding them: not the notebook's y
    nb.user_ns["y"] = stale
    run(nb, "%%pathways --slice s\ny = float(x.sum())\nprint(y)\n")
    assert nb.user_ns["y"] == 2.0
    # a name the notebook holds a compiled function under, rebound by the cell to an array
    # first: the cell is no program over compiled functions
    run(nb, "k = pw.function(lambda v: v * 2, slice=s)")
    run(nb, "%%pathways --slice s\nk = jnp.ones(2)\nq = k * 5\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["q"]), np.full(2, 5.0))
    # bound in one branch only: still an input (the notebook's value where the branch is
    # skipped), as in plain Python
    run(nb, "w = jnp.full(2, 7.0)\nflag = False")
    run(nb, "%%pathways --slice s\nif flag:\n    w = x\nv = w + 1\n")
    np.testing.assert_allclose(np.asarray(nb.user_ns["v"]), np.full(2, 8.0))

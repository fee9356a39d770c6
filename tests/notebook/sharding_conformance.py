"""Writes ``tests/notebook/sharding_conformance.ipynb``: today's JAX sharding patterns, each run
twice.

For every slice (1-D and 2-D, explicit and auto axes) and every pattern that applies to it, the
notebook runs the pattern's code once as a ``%%pathways --slice s`` cell and once as a plain
cell under ``jax.set_mesh(s.mesh)``, then checks that every name the code binds has equal
values, equal shardings (the same devices hold the same blocks) and equal JAX types in both.
``tests/notebook/test_sharding_conformance.py`` executes it on the ``pwkernel`` kernel with one
island of 8 devices. Edit the patterns here, then rewrite the notebook (from the repository's
root):

    .venv/bin/python -m tests.notebook.sharding_conformance
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

PATH = Path(__file__).resolve().parent / "sharding_conformance.ipynb"
KERNELSPEC = {"name": "pwkernel", "display_name": "Pathways (JAX)", "language": "python"}

# The head both conformance notebooks start with (tests/notebook/jit_conformance.py takes it too).
HEAD = """\
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

ctl = pw.controller()
assert len(ctl.islands[0].devices) >= 8, "run with PWKERNEL_ISLANDS=8"
SLICES = {
    "2-D explicit": ctl.slice((4, 2), island=0, axis_names=("x", "y")),
    "2-D auto": ctl.slice((4, 2), island=0, axis_names=("x", "y"), axis_types="auto"),
    "1-D explicit": ctl.slice(8, island=0),
    "1-D auto": ctl.slice(8, island=0, axis_types="auto"),
}
CHECKED = []"""

SETUP = HEAD + """


def grab(*names):
    \"\"\"What the %%pathways cell bound to ``names``.\"\"\"
    return {n: globals()[n] for n in names}


def check(pattern, placed, **plain):
    \"\"\"Equal values, shardings and types for every name, placed (futures) and plain.\"\"\"
    where = f"{pattern} on the {WHERE} slice"
    for name, want in plain.items():
        fut = placed[name]
        if not isinstance(want, jax.Array):
            assert fut == want, f"{where}: {name} is {fut!r}; plain JAX gives {want!r}"
            continue
        assert isinstance(fut, pw.Future), f"{where}: {name} should be a Future, is {fut!r}"
        got = fut.result(120)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{where}: values of {name}")
        for sharding in (fut.sharding, got.sharding):  # known at once, and as it came
            assert sharding.is_equivalent_to(want.sharding, want.ndim), (
                f"{where}: {name} is laid out as {sharding.spec}; plain JAX gives "
                f"{want.sharding.spec}")
        assert jax.typeof(got) == jax.typeof(want), (
            f"{where}: {name} has type {jax.typeof(got)}; plain JAX gives {jax.typeof(want)}")
    CHECKED.append(where)
    print("ok:", where, "-", ", ".join(plain))"""

# Each slice's inputs: a host array, an array on the slice, a typed PRNG key.
INPUTS = """\
WHERE = {where!r}
s = SLICES[WHERE]
ax = s.axis_names          # ("x", "y") or ("x",)
A, N = ax[0], s.mesh.shape[ax[0]]
h = np.arange(64, dtype=np.float32).reshape(8, 8) / 10
x = jax.device_put(h, NamedSharding(s.mesh, P(*ax)))
key = jax.random.key(7)
print(WHERE, s, jax.typeof(x))"""

# (title, the names it binds, the slices' axis types it applies to, its code)
PATTERNS: list[tuple[str, tuple[str, ...], tuple[str, ...], str]] = [
    ("jax.device_put with P, jax.typeof", ("a", "b", "ta", "tb"), ("explicit", "auto"), """\
a = jax.device_put(h, P(A))
b = jax.device_put(x, P(None, A))
ta, tb = jax.typeof(a), jax.typeof(b)"""),
    ("operations keep JAX's output shardings", ("y", "z", "ty"), ("explicit", "auto"), """\
y = jnp.sin(x).T
z = jnp.arange(8.0) * 2
ty = jax.typeof(y)"""),
    ("out_sharding= on jnp.dot, jnp.einsum, jax.random", ("d", "e", "r", "td"), ("explicit",),
     """\
d = jnp.dot(x, x.T, out_sharding=P(A, None))
e = jnp.einsum("ij,kj->ik", x, x, out_sharding=P(None, A))
r = jax.random.normal(key, (8, 8), out_sharding=P(A, None))
td = jax.typeof(d)"""),
    ("jax.reshard", ("u", "v", "tv"), ("explicit",), """\
u = jax.reshard(x, P(None, A))
v = (u * 2).sum(axis=0)
tv = jax.typeof(v)"""),
    ("jax.sharding.auto_axes", ("w",), ("explicit",), """\
w = jax.sharding.auto_axes(lambda a: jnp.sin(a) @ a.T, out_sharding=P(A, None))(x)"""),
    ("jax.sharding.explicit_axes", ("w", "tw"), ("auto",), """\
w = jax.sharding.explicit_axes(lambda a: a * 2, in_sharding=P(A, None))(x)
tw = jax.typeof(w)"""),
    # On explicit axes a jax.jit nested in another jit (as a cell's code is) keeps the type
    # its operations give, whatever its out_shardings; only a top-level call reshards. That
    # is JAX's own behaviour, and docs/magics.md says so; jax.reshard works everywhere.
    ("jax.jit with in_shardings and out_shardings", ("j", "k"), ("auto",), """\
step = jax.jit(lambda a: (a * 3).T, in_shardings=P(*ax), out_shardings=P(None, A))
j = step(x)
k = jax.jit(lambda a: a + 1, out_shardings=P())(j)"""),
    ("jax.jit with in_shardings, out_sharding= inside", ("j", "tj"), ("explicit",), """\
step = jax.jit(lambda a: jax.reshard((a * 3).T, P(None, A)), in_shardings=P(*ax))
j = step(x)
tj = jax.typeof(j)"""),
    ("with_sharding_constraint on auto axes", ("c", "m"), ("auto",), """\
c = jax.lax.with_sharding_constraint(jnp.cos(x) + 1, P(None, A))
m = c * 2"""),
    ("jax.shard_map with psum, all_gather, ppermute, axis_index",
     ("total", "gathered", "rotated", "index"), ("explicit", "auto"), """\
def per_device(a):
    i = jax.lax.axis_index(A)
    turn = [(n, (n + 1) % N) for n in range(N)]
    return (jax.lax.psum(a, A), jax.lax.all_gather(a, A, tiled=True),
            jax.lax.ppermute(a, A, turn), jnp.zeros_like(a) + i)
summed = P(None, *ax[1:])   # invariant over A after the psum
total, gathered, rotated, index = jax.shard_map(
    per_device, in_specs=P(*ax), out_specs=(summed, P(*ax), P(*ax), P(*ax)))(x)"""),
]

WHERE = ("2-D explicit", "2-D auto", "1-D explicit", "1-D auto")


def _indent(code: str) -> str:
    return "\n".join("    " + line if line else line for line in code.splitlines())


def cells() -> list[nbformat.NotebookNode]:
    out = [nbformat.v4.new_markdown_cell(
        "# Sharding conformance: `%%pathways` cells are JAX programs\n\n"
        "Each pattern runs as a `%%pathways --slice s` cell, then as the plain cell under "
        "`jax.set_mesh(s.mesh)`; `check` asserts equal values, shardings and types. "
        "Generated by `tests/notebook/sharding_conformance.py`."),
        nbformat.v4.new_code_cell(SETUP)]
    for where in WHERE:
        kind = where.split()[-1]
        out.append(nbformat.v4.new_markdown_cell(f"## The {where} slice"))
        out.append(nbformat.v4.new_code_cell(INPUTS.format(where=where)))
        for title, names, kinds, code in PATTERNS:
            if kind not in kinds:
                continue
            out.append(nbformat.v4.new_code_cell("%%pathways --slice s\n" + code))
            listed = ", ".join(f'"{n}"' for n in names)
            out.append(nbformat.v4.new_code_cell(
                f"placed = grab({listed})\nwith jax.set_mesh(s.mesh):\n{_indent(code)}\n"
                f"check({title!r}, placed,\n      "
                + ", ".join(f"{n}={n}" for n in names) + ")"))
    out.append(nbformat.v4.new_code_cell(
        "print(f'{len(CHECKED)} patterns agree with plain JAX')"))
    return out


def expected_checks() -> int:
    return sum(where.split()[-1] in kinds for where in WHERE for *_, kinds, _ in PATTERNS)


def render() -> str:
    nb = nbformat.v4.new_notebook(cells=cells(), metadata={"kernelspec": KERNELSPEC})
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return nbformat.writes(nb) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
    sys.exit(0)

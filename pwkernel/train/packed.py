"""A training state held as a few flat arrays: one per dtype, instead of one per leaf.

A data-parallel step reads and writes every leaf of its state (a small Transformer with Adam
has 83), and every leaf the runtime carries is a future made, launched, resolved, donated
and freed once per step: host work that grows with the number of leaves, not with the
model's size (docs/benchmarks.md, "Where the per-leaf cost stands"). ``Layout`` packs a state
into one flat array per dtype inside the compiled step (its first and last operations: a
slice and reshape per leaf going in, one concatenate per dtype coming out), so the runtime
carries two or three values a step. The numbers are the same ones: packing copies bits, it
computes nothing, and the donated packs are updated in place like the leaves were.

Leaves that cannot be concatenated with others keep their own value (``loose``): typed PRNG
keys (an extended dtype) and weakly typed leaves (a concatenate would make them strong).

>>> import jax.numpy as jnp
>>> layout = Layout({"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "n": jnp.int32(7)})
>>> packs, loose = layout.pack({"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "n": jnp.int32(7)})
>>> [(p.dtype.name, p.shape) for p in packs], loose
([('float32', (9,)), ('int32', (1,))], ())
>>> layout.unpack((packs, loose))["w"].shape
(2, 3)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime.dtypes import as_dtype, weak_type


class Layout:
    """Where each leaf of a pytree lives in its packs: built from the tree's shapes and
    dtypes (arrays, futures or ``jax.ShapeDtypeStruct``s); ``pack`` and ``unpack`` are
    traced inside a compiled function."""

    def __init__(self, tree):
        leaves, self.tree = jax.tree_util.tree_flatten(tree)
        self.structs = tuple((tuple(np.shape(x)), _dtype(x), _weak(x)) for x in leaves)
        groups: dict[Any, list[int]] = {}
        self.loose: tuple[int, ...] = ()
        for i, (_, dtype, weak) in enumerate(self.structs):
            if weak or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
                self.loose += (i,)
            else:
                groups.setdefault(dtype, []).append(i)
        self.groups = tuple(tuple(ix) for ix in groups.values())

    def __eq__(self, other) -> bool:
        return (isinstance(other, Layout) and self.tree == other.tree
                and self.structs == other.structs)

    @property
    def leaves(self) -> int:
        return len(self.structs)

    def misfit(self, tree) -> str | None:
        """Why ``tree`` cannot be packed by this layout (another structure, a leaf of another
        shape or dtype), or None when it can."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self.tree:
            return f"its structure is {treedef}, not {self.tree}"
        for i, (leaf, (shape, dtype, _)) in enumerate(zip(leaves, self.structs, strict=True)):
            if (tuple(np.shape(leaf)), _dtype(leaf)) != (shape, dtype):
                return (f"its leaf {i} is {_dtype(leaf)}{list(np.shape(leaf))}, not "
                        f"{dtype}{list(shape)}")
        return None

    def pack(self, tree) -> tuple[tuple, tuple]:
        """``(packs, loose)``: one flat array per dtype (leaves in tree order), and the leaves
        kept as they are."""
        leaves = self.tree.flatten_up_to(tree)
        packs = tuple(jnp.concatenate([jnp.ravel(leaves[i]) for i in ix]) for ix in self.groups)
        return packs, tuple(leaves[i] for i in self.loose)

    def unpack(self, packed) -> Any:
        """The tree back from ``(packs, loose)``."""
        packs, loose = packed
        out: list[Any] = [None] * len(self.structs)
        for pack, ix in zip(packs, self.groups, strict=True):
            at = 0
            for i in ix:
                shape = self.structs[i][0]
                size = math.prod(shape)
                out[i] = pack[at:at + size].reshape(shape)
                at += size
        for i, leaf in zip(self.loose, loose, strict=True):
            out[i] = leaf
        return jax.tree_util.tree_unflatten(self.tree, out)

    def wrap(self, train):
        """``train`` (``(state, *batch) -> (state, value)``) over packs: the state unpacked
        going in and packed coming out, inside the same compiled step."""
        def step(packed, *batch):
            state, value = train(self.unpack(packed), *batch)
            return self.pack(state), value
        return step

    def describe(self) -> str:
        """For error messages: the leaves, and how they are held."""
        return (f"{len(self.structs)} leaves in {len(self.groups)} packs "
                f"({', '.join(self.structs[ix[0]][1].name for ix in self.groups)}) and "
                f"{len(self.loose)} loose")


def _dtype(x):
    dtype = getattr(x, "dtype", None)
    return jnp.result_type(x) if dtype is None else as_dtype(dtype)


def _weak(x) -> bool:
    """A leaf's weak type, as the runtime reads it; a Python number is weakly typed too."""
    return weak_type(x) or type(x) in (int, float, complex)

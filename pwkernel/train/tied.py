"""Weights tied across a ``Pipeline``'s stages, as Megatron ties them.

A language model whose input embedding and output head share one table (GPT-2's) puts the
table in the first stage and in the last. ``Pipeline(..., tied=[[(0, "embed"), (2,
"embed")]])`` says so: each stage named keeps a copy of the table, ``init`` makes every copy
the first named stage's value, and each step, after the backward passes, every copy's
gradient is sent to the other stages of its group (``s0.tied``: the tied leaves' gradients,
one transfer each way between the slices) and each stage's update adds them, in the group's
order (so every stage sums the same numbers in the same order), before its optimizer step.
Every copy then applies the same update to the same summed gradient: the copies stay equal,
and the step is tied ``jax.jit``'s (one table, the two uses' gradients summed).
``pw.train.clip_by_global_norm`` counts a tied table once (its owner's summed gradient).

A group is a list of ``(stage, path)`` pairs, two or more, each stage at most once; a path
names a leaf, or a subtree whose leaves are tied one to one, in a stage's parameters: a key
(``"embed"``), keys joined by ``/`` (``"blocks/0/qkv"``), a tuple of keys and indices
(``("blocks", 0, "qkv")``) or ``jax.tree_util.keystr``'s form (``"['blocks'][0]['qkv']"``).
Shapes and dtypes must match.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..runtime.program import function


def _key(k) -> str:
    for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey / FlattenedIndexKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _parts(path) -> tuple[str, ...] | None:
    """A path as a tuple of key strings; ``None`` for ``keystr``'s form (compared whole)."""
    if isinstance(path, str):
        if path.startswith(("[", ".")):
            return None
        return tuple(p for p in path.split("/") if p)
    if isinstance(path, tuple | list):
        return tuple(str(p) for p in path)
    raise TypeError(f"a tied path is a key ('embed'), keys joined by '/' ('blocks/0/qkv') or a "
                    f"tuple of keys (('blocks', 0, 'qkv')), got {type(path).__name__} {path!r}.")


def _find(params, path) -> list[tuple[tuple[str, ...], int, Any]]:
    """The leaves of ``params`` under ``path``: (path below it, flat index, shape/dtype)."""
    parts, out = _parts(path), []
    for i, (kp, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(params)[0]):
        keys = tuple(_key(k) for k in kp)
        if parts is None:  # (keystr's form: the prefix of kp that keystr writes as path)
            n = next((n for n in range(len(kp) + 1)
                      if jax.tree_util.keystr(tuple(kp[:n])) == path), None)
        else:
            n = len(parts) if keys[:len(parts)] == parts else None
        if n is not None:
            out.append((keys[n:], i, leaf))
    return out


def _paths(params) -> str:
    shown = ["/".join(_key(k) for k in kp)
             for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return ", ".join(shown[:8]) + (" ..." if len(shown) > 8 else "") if shown else "nothing"


def _groups(tied) -> list:
    """``tied`` as a list of groups (one group given bare is taken as the list of it)."""
    if not isinstance(tied, Sequence) or isinstance(tied, str) or not tied:
        raise TypeError(f"tied must be a list of groups, each a list of (stage, path) pairs, "
                        f"e.g. tied=[[(0, 'embed'), (2, 'embed')]]; got {tied!r}.")
    first = tied[0]
    if (isinstance(first, tuple | list) and len(first) == 2
            and isinstance(first[0], int) and not isinstance(first[0], bool)):
        return [tied]  # (one group: [(0, "embed"), (2, "embed")])
    return list(tied)


class Ties:
    """The tied leaves of a pipeline's stages, resolved against the shapes ``init`` makes
    (``expected``: per stage, a pytree of ``ShapeDtypeStruct``), or the error that says
    what is wrong with ``tied``."""

    def __init__(self, tied, expected: Sequence[Any]):
        S = len(expected)
        self.leaf_groups: list[list[tuple[int, int]]] = []  # per tied leaf: (stage, index)
        seen: dict[tuple[int, int], str] = {}
        for group in _groups(tied):
            if not isinstance(group, Sequence) or isinstance(group, str) or len(group) < 2:
                raise ValueError(f"a tied group names two or more (stage, path) pairs, got "
                                 f"{group!r}. Maybe you want tied=[[(0, 'embed'), ({S - 1}, "
                                 "'embed')]].")
            found, stages = [], []
            for pair in group:
                if not (isinstance(pair, tuple | list) and len(pair) == 2):
                    raise TypeError(f"a tied group's entries are (stage, path) pairs, got "
                                    f"{pair!r} in {group!r}.")
                s, path = pair
                if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < S:
                    raise ValueError(f"tied names stage {s!r}, but the pipeline has stages 0 "
                                     f"to {S - 1}.")
                if s in stages:
                    raise ValueError(
                        f"tied group {group!r} names stage {s} twice: a tie within one stage "
                        "is one array used twice; return it once from the stage's init and "
                        "use it in both places in its apply (jax.grad sums its uses).")
                leaves = _find(expected[s], path)
                if not leaves:
                    raise ValueError(f"tied names {path!r} in stage {s}, whose parameters have "
                                     f"no such leaf; they hold: {_paths(expected[s])}.")
                found.append((s, path, leaves))
                stages.append(s)
            found.sort(key=lambda f: f[0])  # (the first stage owns the group: its init wins)
            s0, p0, ref = found[0]
            for s, path, leaves in found[1:]:
                want = [(k, a.shape, a.dtype) for k, _, a in ref]
                got = [(k, a.shape, a.dtype) for k, _, a in leaves]
                if want != got:
                    pairs = enumerate(zip(want, got, strict=False))
                    at = next((n for n, (w, g) in pairs if w != g), min(len(want), len(got)))
                    raise ValueError(
                        f"tied stage {s0}'s {p0!r} and stage {s}'s {path!r} differ: "
                        f"{_describe(ref, at)} against {_describe(leaves, at)}. Tied weights "
                        "are one array: the same shapes and dtypes (a head that is the "
                        "embedding transposed holds the embedding and computes h @ embed.T).")
            for n in range(len(ref)):
                leaf_group = [(s, leaves[n][1]) for s, _, leaves in found]
                for (s, i), (_, path, leaves) in zip(leaf_group, found, strict=True):
                    if (s, i) in seen:
                        where = "/".join((str(path), *leaves[n][0]))
                        raise ValueError(f"stage {s}'s {where} is tied "
                                         f"twice (in {seen[s, i]} and {group!r}): put every "
                                         "copy of one weight in one group.")
                    seen[s, i] = repr(group)
                self.leaf_groups.append(leaf_group)
        # per stage, its tied leaves in order: (flat index, leaf group)
        self.own = [[(i, g) for g, lg in enumerate(self.leaf_groups) for t, i in lg if t == s]
                    for s in range(S)]

    def stages(self) -> list[int]:
        return [s for s, own in enumerate(self.own) if own]

    # --- plain JAX pieces, traced inside the stages' compiled functions --------------------
    def _others(self, s: int, g: int) -> list[tuple[int, int]]:
        """(stage, position among that stage's tied leaves) of leaf group ``g``'s copies."""
        return [(t, [h for _, h in self.own[t]].index(g)) for t, _ in self.leaf_groups[g]]

    def summed(self, s: int, grads, others: list):
        """Stage ``s``'s gradients with every tied leaf replaced by the sum of its group's
        copies' gradients, in the group's order (``others``: per tied leaf of ``s``, the
        other copies' gradients in that order)."""
        leaves, tree = jax.tree_util.tree_flatten(grads)
        for (i, g), theirs in zip(self.own[s], others, strict=True):
            at = [t for t, _ in self.leaf_groups[g]].index(s)
            parts = list(theirs[:at]) + [leaves[i]] + list(theirs[at:])
            leaves[i] = functools.reduce(lambda a, b: a + b.astype(a.dtype), parts)
        return jax.tree_util.tree_unflatten(tree, leaves)

    def counted(self, s: int, grads):
        """``grads`` with the tied leaves ``s`` does not own (a group's later copies) zeroed:
        the whole model's gradient norm counts a tied weight once."""
        leaves, tree = jax.tree_util.tree_flatten(grads)
        for i, g in self.own[s]:
            if self.leaf_groups[g][0][0] != s:
                leaves[i] = jnp.zeros_like(leaves[i])
        return jax.tree_util.tree_unflatten(tree, leaves)

    def given(self, s: int, params, values: list):
        """``params`` with the tied leaves ``s`` does not own set to ``values`` (the owners'),
        in ``s``'s order."""
        leaves, tree = jax.tree_util.tree_flatten(params)
        later = [i for i, g in self.own[s] if self.leaf_groups[g][0][0] != s]
        for i, v in zip(later, values, strict=True):
            leaves[i] = jnp.asarray(v, leaves[i].dtype)
        return jax.tree_util.tree_unflatten(tree, leaves)

    def take(self, s: int, tree) -> list:
        leaves = jax.tree_util.tree_leaves(tree)
        return [leaves[i] for i, _ in self.own[s]]

    # --- in a step program -----------------------------------------------------------------
    def takers(self, slices) -> list:
        """Per stage holding tied leaves, ``tree -> [its tied leaves]`` on its slice."""
        return [function(functools.partial(self.take, s), slice=slices[s], out_specs=P(),
                         name=f"s{s}.tied") if self.own[s] else None
                for s in range(len(slices))]

    def exchange(self, takers, trees) -> list:
        """Per stage, the other copies' values of its tied leaves (``others`` above), taken
        from ``trees`` (one per stage) on their slices; the runtime moves them."""
        pieces = [take(trees[s]) if take is not None else None for s, take in enumerate(takers)]
        return [[[pieces[t][k] for t, k in self._others(s, g) if t != s]
                 for _, g in self.own[s]] for s in range(len(takers))]

    def from_owners(self, s: int, takers, made: list) -> list:
        """The owners' values of the tied leaves ``s`` does not own (init), from ``made``'s
        parameters (the stages before ``s``, already made)."""
        out, taken = [], {}
        for _, g in self.own[s]:
            (o, _), *_ = self.leaf_groups[g]
            if o != s:
                if o not in taken:
                    taken[o] = takers[o](made[o])
                out.append(taken[o][[h for _, h in self.own[o]].index(g)])
        return out


def _describe(leaves, at: int) -> str:
    """The leaf ``at`` of ``leaves`` (one found under a tied path), or how many there are."""
    if at >= len(leaves):
        return f"no leaf there (it holds {len(leaves)})"
    keys, _, a = leaves[at]
    return f"{'/'.join(keys) + ' ' if keys else ''}{a.dtype}{list(a.shape)}"


def tied_functions(ties: Ties | None, s: int, update, norm, init):
    """A stage's update, squared norm and init with its ties: the update and the norm take
    the other copies' gradients (``others``) as one more argument, the init the owners'
    values of the leaves ``s`` does not own. Unchanged for a stage that holds none."""
    if ties is None or not ties.own[s]:
        return update, norm, init

    def tied_update(params, opt_state, grads, barrier, others):
        return update(params, opt_state, ties.summed(s, grads, others), barrier)

    def tied_norm(grads, params, others):
        return norm(ties.counted(s, ties.summed(s, grads, others)), params)

    def tied_init(key, values=()):
        return ties.given(s, init(key), values)
    return tied_update, tied_norm, tied_init

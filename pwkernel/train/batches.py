"""A batch put where a step reads it, ahead of the step (what a data loader does), without
waiting for it in the calling thread.

- ``Placer``: a pytree laid out as ``in_specs=pw.BATCH`` lays it out on a slice
  (``SPMD.place``, ``Pipeline.place``'s microbatches).
- ``Cutter``: one side of a batch (inputs or targets) cut into a pipeline's microbatches for
  the stage that reads them. Host arrays are cut into NumPy views (each uploaded by the step
  onto its stage). Arrays on devices (``jax.Array``s a loader placed with ``jax.device_put``,
  sharded over the slice or not, and futures, a preprocessing ``pw.function``'s) are cut by one
  compiled function on the stage's slice (trace name ``{pipeline}.cut``), which returns each
  microbatch laid out as the step reads it. Before, a device batch was cut with eager JAX
  indexing in the calling thread: one placed with ``P('x')`` on the stage's explicit mesh
  failed with JAX's ``ShardingTypeError`` (a gather it cannot lay out), and a future was
  waited for there, so the step of batch n + 1 waited for whatever ran before its batch.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding

from ..runtime.objects import Future
from ..runtime.program import BATCH, function
from ..runtime.resources import VirtualSlice
from ..runtime.specs import batch_spec
from .state import simulated


class Microbatches(tuple):
    """A batch already cut into microbatches and placed (``Pipeline.place``): ``(xs, ys)``."""


def check_whole(batch, call: str) -> None:
    """Refuse a ``Pipeline.place`` batch where ``call`` takes the batch whole: its lists of
    microbatches went into the trace as inputs (an ``SPMD`` step failed inside the model's
    first matmul, "unsupported operand type(s) for @: 'list'")."""
    if isinstance(batch, Microbatches):
        trainer = call.split(".")[0]
        raise TypeError(f"{call} takes the batch whole, (inputs, targets), not "
                        "pipe.place(...)'s microbatches (it does not cut it into "
                        f"microbatches). Maybe you want {call}(state, (x, y))"
                        + ("." if trainer == "pipe" else
                           f", or {trainer}.place((x, y)) to place it ahead."))


class Placer:
    """Puts a pytree on ``vs`` as ``in_specs=pw.BATCH`` lays it out, ahead of a step. On real
    devices: ``jax.device_put`` (``jax.Array``s); a future already laid out so stays as it
    is, and others go through an identity ``pw.function`` on the slice (trace name
    ``place``), so nothing waits for a value. A simulated slice's devices take no arrays, so
    there everything goes through that function: the upload happens on the virtual clock,
    and the values are futures the step reads where they are."""

    def __init__(self, vs: VirtualSlice, what: str):
        self.vs, self.what = vs, what
        self._identity = function(lambda tree: tree, slice=vs, in_specs=BATCH,
                                  out_specs=BATCH, name="place")

    def __call__(self, tree):
        if simulated(self.vs):
            return self._identity(tree)
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        out, moved = list(leaves), []
        for i, a in enumerate(leaves):
            where = NamedSharding(self.vs.mesh, batch_spec(np.shape(a), self.vs, self.what))
            if not isinstance(a, Future):
                out[i] = jax.device_put(a, where)
            elif not _laid_out(a, where):
                moved.append(i)
        if moved:  # (a future: placed by a computation behind its producer, never waited for)
            for i, a in zip(moved, self._identity([leaves[i] for i in moved]), strict=True):
                out[i] = a
        return jax.tree_util.tree_unflatten(treedef, out)


def _laid_out(fut: Future, where: NamedSharding) -> bool:
    have = fut.sharding
    try:
        return have.device_set == where.device_set and have.is_equivalent_to(
            where, len(fut.shape))
    except Exception:  # noqa: BLE001 - shardings of different kinds: not laid out so
        return False


class Cutter:
    """``part`` (a pytree of arrays with a leading batch axis, checked by ``check_batch``)
    cut into ``microbatches`` equal pytrees for the stage on ``vs``: host leaves as NumPy
    views, device leaves (``jax.Array``, ``Future``) by one call of a compiled cut on ``vs``
    (futures at once, each microbatch laid out as ``pw.BATCH``)."""

    def __init__(self, vs: VirtualSlice, microbatches: int, name: str):
        self.vs, self.microbatches = vs, microbatches
        self._cut = function(lambda leaves: [_sliced(v, microbatches) for v in leaves],
                             slice=vs, out_specs=BATCH, name=name)

    def __call__(self, part) -> list[Any]:
        leaves, treedef = jax.tree_util.tree_flatten(part)
        M = self.microbatches
        on_device = [i for i, a in enumerate(leaves) if self._on_device(a)]
        cut = dict(zip(on_device, self._cut([leaves[i] for i in on_device]), strict=True)
                   ) if on_device else {}
        return [jax.tree_util.tree_unflatten(treedef, [
            cut[i][m] if i in cut else _views(a, M)[m] for i, a in enumerate(leaves)])
            for m in range(M)]

    def _on_device(self, a) -> bool:
        # (a jax.Array cannot be on a simulated slice: one there is a host value to it)
        return isinstance(a, Future) or (isinstance(a, jax.Array) and not simulated(self.vs))


def _views(v, microbatches: int) -> list:
    """A host array cut along its leading axis into ``microbatches`` equal NumPy views."""
    per = np.shape(v)[0] // microbatches
    return [v[m * per:(m + 1) * per] for m in range(microbatches)]


def _sliced(v, microbatches: int) -> list:
    """The same cut of a traced array (static bounds; laid out by the cut's ``out_specs``)."""
    per = v.shape[0] // microbatches
    return [lax.slice_in_dim(v, m * per, (m + 1) * per) for m in range(microbatches)]

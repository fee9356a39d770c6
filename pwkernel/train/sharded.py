"""A training step's functions as a simulated slice of several chips runs them: the same
computations with the all-reduces written out that XLA's SPMD partitioner inserts on real
devices, since the simulator sees only the collectives written with ``shard_map``
(docs/simulator.md, "What the model ignores").

Each function runs per chip inside ``shard_map`` over the slice's axes, on its shard of the
batch (the leading axis, as ``pw.BATCH`` lays it out; a scalar is replicated), the parameters
replicated, and sums or averages over the chips what XLA would: a ``Pipeline`` stage's
gradients of each microbatch (``backward``), the last stage's loss (``forward``), an eval
step's loss (``mean_loss``); ``spmd.simulated_step`` does the same for a whole SPMD step.
The values are those of the plain functions (``stage.forward``/``backward``, ``model_loss``)
for a loss that is the mean over the examples (tests/train/test_sim_allreduce.py runs both on
real devices); on real devices ``pw.train`` runs the plain ones. The simulator then times
the all-reduces as XLA combines them (``backends/sim/cost.py``, ``COMBINE_BYTES``).

A forward's residuals stay where the plain function's would: one whose leading axis is the
batch's is sharded as the batch is, one whose shape does not change with the batch (of the
parameters alone, say) is replicated (chip 0's: a residual that sums over the batch would
differ per chip, which a simulation, computing nothing, does not see), and any other gets a
leading axis of one per chip, the backward taking each chip's own back (``_layouts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import stage


def batch_spec(axes: Sequence[str]) -> P:
    """The leading axis sharded over all of ``axes`` (``pw.BATCH`` on a slice with them)."""
    axes = tuple(axes)
    return P(axes if len(axes) > 1 else axes[0])


def specs(tree, spec: P):
    """``spec`` for each leaf of ``tree`` with a leading axis, ``P()`` for a scalar."""
    if tree is None:
        return P()
    return jax.tree.map(lambda a: spec if jnp.ndim(a) else P(), tree)


def forward(apply: Callable, loss: Callable | None, wrt_input: bool,
            axes: Sequence[str], chips: int) -> Callable:
    """``stage.forward``, per chip: the last stage's loss averaged over the chips (the
    microbatch's mean, as XLA's all-reduce gives it), the residuals kept per chip."""
    local_fwd, axes, sharded = stage.forward(apply, loss, wrt_input), tuple(axes), batch_spec(axes)

    def fwd(params, x, y, token):
        layouts = _layouts(local_fwd, params, x, y, chips)

        def local(params, x, y, token):
            out, residuals, token = local_fwd(params, x, y, token)
            if loss is not None:
                out = jax.lax.pmean(out, axes)
            return out, [r[None] if lay == "stacked" else r
                         for r, lay in zip(residuals, layouts, strict=True)], token
        out_spec = P() if loss is not None else specs(_output(apply, params, x), sharded)
        return jax.shard_map(local, in_specs=(P(), specs(x, sharded), specs(y, sharded), P()),
                             out_specs=(out_spec, _specs(layouts, sharded), P()),
                             check_vma=False)(params, x, y, token)
    return fwd


def backward(apply: Callable, loss: Callable | None, wrt_input: bool, scale: float,
             axes: Sequence[str], chips: int) -> Callable:
    """``stage.backward``, per chip: each chip's gradients of its shard summed over the chips
    (one ``psum`` of the tree, before they are added to the running sum), its input's
    cotangent left on the chip. The last stage seeds its local loss with ``scale / chips``:
    the microbatch's mean is the mean of the chips' means."""
    axes, sharded = tuple(axes), batch_spec(axes)
    seed = scale / chips if loss is not None else scale
    local = stage.backward(apply, loss, wrt_input, seed,
                           reduce=lambda g: jax.lax.psum(g, axes))
    local_fwd = stage.forward(apply, loss, wrt_input)

    def bwd(params, x, y, residuals, dout, acc, token, first=None):
        layouts = _layouts(local_fwd, params, x, y, chips)

        def chip(params, x, y, residuals, dout, acc, token, first):
            mine = [r[0] if lay == "stacked" else r
                    for r, lay in zip(residuals, layouts, strict=True)]
            return local(params, x, y, mine, dout, acc, token, first)
        dx = specs(x, sharded) if wrt_input else P()
        return jax.shard_map(
            chip, in_specs=(P(), specs(x, sharded), specs(y, sharded),
                            _specs(layouts, sharded),
                            specs(dout, sharded), P(), P(), P()),
            out_specs=(P(), dx, P()), check_vma=False)(
            params, x, y, residuals, dout, acc, token, first)
    return bwd


def mean_loss(fn: Callable, axes: Sequence[str]) -> Callable:
    """``fn(params, x, y) -> scalar``, a mean over the examples, per chip on its shard of
    ``x`` and ``y`` and averaged over the chips (an eval step's loss all-reduce)."""
    axes, sharded = tuple(axes), batch_spec(axes)

    def mean(params, x, y):
        return jax.shard_map(lambda p, a, b: jax.lax.pmean(fn(p, a, b), axes),
                             in_specs=(P(), specs(x, sharded), specs(y, sharded)),
                             out_specs=P(), check_vma=False)(params, x, y)
    return mean


def _layouts(local_fwd: Callable, params, x, y, chips: int) -> list[str]:
    """Per residual of the forward, how the slice holds it: ``"batch"`` (its leading axis
    is the batch's: sharded), ``"replicated"`` (its shape does not change with the batch) or
    ``"stacked"`` (a leading axis of one per chip), from its shapes on the whole batch and on
    one chip's shard of it."""
    def shard(a):
        shape = jnp.shape(a)
        return jax.ShapeDtypeStruct((shape[0] // chips, *shape[1:]) if shape else (),
                                    jnp.result_type(a))
    token = jax.ShapeDtypeStruct((), jnp.int32)
    whole = jax.eval_shape(local_fwd, params, x, y, token)[1]
    one = jax.eval_shape(local_fwd, params, jax.tree.map(shard, x), jax.tree.map(shard, y),
                         token)[1]
    out = []
    for w, o in zip(whole, one, strict=True):
        if w.shape == o.shape:
            out.append("replicated")
        elif w.shape[1:] == o.shape[1:] and w.shape[:1] == (o.shape[0] * chips,):
            out.append("batch")
        else:
            out.append("stacked")
    return out


def _specs(layouts: list[str], sharded: P) -> list[P]:
    return [P() if lay == "replicated" else sharded for lay in layouts]


def _output(apply: Callable, params, x):
    """The shapes of ``apply(params, x)`` (for their specs; only ranks are read)."""
    return jax.eval_shape(apply, params, x)

"""What XLA's cost analysis of the unoptimized program counts far beyond what the compiled
kernel does, for a few primitives, and a fused estimate in its place (``cost.loop_work`` adds
the difference for each such equation of a function's jaxpr).

- Cumulative reductions (``cumsum``, ``cumprod``, ``cummax``, ``cummin``, ``cumlogsumexp``)
  are lowered for TPU as a ``reduce_window`` as wide as the axis, which the analysis counts as
  L - 1 combining steps per element (L: the axis's length; 1.1e12 flops for a 2^20-element
  ``cumsum``), where the compiler runs a log-depth tree: ``ceil(log2 L)`` steps per element
  (XLA's flops per step kept), reading the operand and writing the result once.
- Random bits (``random_bits``, ``threefry2x32``): the threefry hash is some hundred
  element-wise operations, each counted as a read and a write of the whole array (1.7 GB for
  2^20 32-bit draws), which XLA fuses into one kernel that reads the key and writes the bits.
  Its flops are XLA's. So are a few element-wise functions lowered as such a chain
  (``ELEMENTWISE``: ``erf_inv``, in ``jax.random.normal``, counted 545 bytes an element where
  a fused kernel moves 8).

Each is XLA's count for the primitive lowered alone on the equation's types, taken away, and
the estimate added; inside ``shard_map`` the types are one shard's, as XLA counts there.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from jax.extend import core as jcore

CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
RANDOM = frozenset({"random_bits", "threefry2x32"})
#: element-wise functions lowered as a chain of element-wise steps (``jax.random.normal``'s
#: ``erf_inv``, ``jax.nn.sigmoid``'s ``logistic``), fused as random bits are
ELEMENTWISE = frozenset({"erf_inv", "erfc", "lgamma", "digamma", "logistic", "bessel_i0e",
                         "bessel_i1e", "igamma", "igammac"})
_WHOLE = RANDOM | ELEMENTWISE  # (XLA's flops, and the bytes in and out)
_NONE = np.zeros(3)


def excess(eqn) -> np.ndarray:
    """The fused estimate less XLA's count, (flops, transcendentals, bytes), for one equation
    (zeros for a primitive XLA counts as it runs, or one that cannot be lowered alone)."""
    name = eqn.primitive.name
    if name not in CUMULATIVE and name not in _WHOLE:
        return _NONE
    ins = tuple(_typed(v.aval) for v in eqn.invars)
    params = tuple(sorted(eqn.params.items()))
    try:
        return np.array(_excess(eqn.primitive, ins, params))
    except TypeError:  # unhashable parameters: not cached
        return np.array(_excess.__wrapped__(eqn.primitive, ins, params))


def counted_excess(jaxpr) -> np.ndarray:
    """``excess`` over every equation of ``jaxpr`` as many times as XLA's cost analysis
    counts it: a scan's body as many times as its copies in the lowered loop (``copies``);
    ``cond`` branches left out (XLA takes the largest of them)."""
    total = np.zeros(3)
    for eqn in jaxpr.eqns:
        total += excess(eqn)
        if eqn.primitive.name == "scan":
            total += copies(eqn.params.get("unroll", 1), int(eqn.params["length"])) * (
                counted_excess(eqn.params["jaxpr"].jaxpr))
        elif eqn.primitive.name != "cond":
            for sub in jcore.jaxprs_in_params(eqn.params):
                total += counted_excess(sub)
    return total


def copies(unroll, length: int) -> int:
    """How many copies of a scan's body XLA counts: it lowers ``unroll`` = k copies in the
    loop and the ``length % k`` left over after it (all of them when k >= length)."""
    k = length if unroll is True else max(1, int(unroll))
    return length if k >= length else k + length % k


def _typed(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                weak_type=bool(getattr(aval, "weak_type", False)))


@functools.lru_cache(maxsize=256)
def _excess(primitive, ins: tuple, params: tuple) -> np.ndarray:
    kwargs = dict(params)
    try:
        lowered = jax.jit(lambda *a: primitive.bind(*a, **kwargs)).trace(*ins).lower(
            lowering_platforms=("tpu",))
        outs = jax.tree_util.tree_leaves(jax.eval_shape(
            lambda *a: primitive.bind(*a, **kwargs), *ins))
    except Exception:  # noqa: BLE001 - then XLA's own count stands
        return _NONE
    costs = lowered.cost_analysis() or {}
    if isinstance(costs, list | tuple):  # older JAX: one dict per computation
        costs = costs[0] if costs else {}
    xla = np.array([max(float(costs.get(k, 0.0)), 0.0)
                    for k in ("flops", "transcendentals", "bytes accessed")])
    moved = sum(_nbytes(a) for a in ins) + sum(_nbytes(a) for a in outs)
    if primitive.name in _WHOLE:
        return np.array([xla[0], xla[1], moved]) - xla
    length = ins[0].shape[kwargs["axis"]] if ins[0].shape else 1
    steps = math.ceil(math.log2(length)) / (length - 1) if length > 1 else 0.0
    return np.array([xla[0] * steps, xla[1] * steps, moved]) - xla


def _nbytes(struct) -> int:
    """The bytes an array holds; a PRNG key array counts its key data."""
    if jax.dtypes.issubdtype(struct.dtype, jax.dtypes.prng_key):
        struct = jax.eval_shape(jax.random.key_data, struct)
    return math.prod(struct.shape) * np.dtype(struct.dtype).itemsize

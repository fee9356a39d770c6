"""A model split into stages, and what each stage's forward and backward compute.

A ``Stage`` is a group of layers: ``init(key) -> params`` and ``apply(params, x) -> y``. The
last stage's output goes into the loss, ``loss(outputs, targets) -> scalar`` (the mean over
the microbatch's examples).

A stage's **forward** is ``jax.vjp`` of its ``apply`` (the last stage's: of apply + loss): it
returns its output and the vjp's *residuals*, the arrays the backward needs, as outputs of the
computation (so, in a program, values that live on the stage's devices until the backward
reads them). Residuals that are the forward's own inputs (the parameters, the input
activation) are not returned again: the backward reads those inputs itself, so they are not
copied once per microbatch. The **backward** traces the same vjp again (to know the structure
of its backward pass), puts the forward's residuals in place of the ones it computed, and
calls it; the compiler drops the recomputed forward, which nothing reads (checked in
tests/train/test_train.py with XLA's cost analysis). It adds the parameter gradients into the
accumulator it is given and returns the input's cotangent for the stage before.

Every forward and backward also takes and returns a scalar *token*: the step program threads it
through each stage's calls to fix the order they run in (``pipeline.py``).

>>> import jax.numpy as jnp
>>> st = Stage(init=lambda key: {"w": jnp.ones((2, 2))}, apply=lambda p, x: x @ p["w"])
>>> y, res, token = forward(st.apply)(st.init(None), jnp.ones((1, 2)), None, jnp.int32(0))
>>> y.tolist(), [r.shape for r in res], int(token)
([[2.0, 2.0]], [], 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_flatten, _unflatten, _leaves = (jax.tree_util.tree_flatten, jax.tree_util.tree_unflatten,
                                 jax.tree_util.tree_leaves)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: ``init(key) -> params`` (``key``: a ``jax.random.PRNGKey``) and
    ``apply(params, x) -> y``, both plain JAX. ``name`` is for people (reprs, docs)."""

    init: Callable[[Any], Any]
    apply: Callable[[Any, Any], Any]
    name: str = ""


def model_loss(stages: Sequence[Stage], loss: Callable) -> Callable:
    """The whole model's loss, ``f(params_list, x, y)``: every stage in turn, then ``loss``."""
    applies = [s.apply for s in stages]

    def full(params, x, y):
        for apply, p in zip(applies, params, strict=True):
            x = apply(p, x)
        return check_scalar_loss(loss(x, y))
    return full


def check_trainable(params: Sequence[Any]) -> None:
    """Every leaf of every stage's parameters (``params[s]``) is a floating (or complex)
    array, what ``jax.grad`` differentiates; else the error that names the stage, the leaf and
    what to do. Plain ``jax.jit`` refuses such a leaf too ("grad requires real- or
    complex-valued inputs"); a ``Pipeline``'s backward failed on it less clearly ("Called add
    with a float0 array", "Cannot convert_element_type from key<fry> to void")."""
    for s, stage_params in enumerate(params):
        if isinstance(stage_params, Mapping) and "batch_stats" in stage_params:
            raise TypeError(
                f"stage {s}'s parameters hold flax's 'batch_stats' collection (its init "
                "returned module.init(...)'s whole variables): pw.train trains parameters "
                "with jax.grad and carries no mutable collection from step to step, so "
                "BatchNorm's running statistics would be trained as weights (or a "
                "mutable=['batch_stats'] apply would hand a tuple to the next stage). Return "
                "variables['params'] from init and apply with {'params': params}, using a "
                "norm without state (nn.LayerNorm, nn.GroupNorm), or write the step yourself "
                "with pw.function (docs/training.md, 'Flax models'), which carries "
                "batch_stats as jax.jit does.")
        for path, leaf in jax.tree_util.tree_flatten_with_path(stage_params)[0]:
            dtype = getattr(leaf, "dtype", None)
            if dtype is None or jnp.issubdtype(dtype, jnp.inexact):
                continue
            where = jax.tree_util.keystr(path) or "(the whole tree)"
            raise TypeError(
                f"stage {s}'s parameters hold {where}, a {dtype} array, which jax.grad cannot "
                "differentiate (as under plain jax.jit): a stage's parameters are what it "
                "trains, floating-point arrays only. An int step counter, a PRNG key or "
                "flax.nnx's RngState is not one: return only the trainable arrays from the "
                "stage's init (flax.nnx: nnx.state(model, nnx.Param); linen: "
                "variables['params']), and keep the rest in apply or in a step of your own "
                "(pw.function, docs/training.md 'Flax models').")


def check_scalar_loss(value):
    """``value``, a loss's result, if it is one scalar array; else the error that says what
    to return (jax.grad's own rule: a vector seeded with ones is another loss; a tuple, a
    loss with metrics as ``jax.value_and_grad(has_aux=True)`` takes, failed before in JAX's
    "Gradient only defined for scalar-output functions" or in ``jnp.shape``)."""
    if isinstance(value, tuple | list | dict):
        raise TypeError(
            f"the loss must return one scalar (the mean over the examples), got a "
            f"{type(value).__name__} of {len(value)}. pw.train takes no auxiliary outputs "
            f"(has_aux): return the loss alone, and compute metrics with evaluate() or a "
            f"pw.function of your own on the state's params.")
    if jnp.shape(value) != ():
        raise TypeError(
            f"the loss must be a scalar (the mean over the microbatch's examples), got shape "
            f"{jnp.shape(value)}. Maybe you want jnp.mean(...) over every axis, not axis=1.")
    return value


def _target(apply: Callable, loss: Callable | None, wrt_input: bool, x, y) -> tuple:
    """The function the vjp is taken of, and its primal arguments."""
    if loss is None:
        f = apply
    else:
        def f(p, h):
            return loss(apply(p, h), y)
    if wrt_input:
        return f, (x,)
    return (lambda p: f(p, x)), ()


def _vjp(apply, loss, wrt_input: bool, params, x, y):
    """``jax.vjp`` of the stage, and where each leaf of its residual pytree comes from: the
    index of the stage's input leaf it is (the same traced array), or -1 for a residual."""
    f, extra = _target(apply, loss, wrt_input, x, y)
    out, vjp = jax.vjp(f, params, *extra)
    if loss is not None:
        check_scalar_loss(out)
    leaves, tree = _flatten(vjp)
    inputs = {id(leaf): i for i, leaf in enumerate(_leaves((params, x, y)))}
    where = [inputs.get(id(leaf), -1) for leaf in leaves]
    return out, leaves, tree, where


def forward(apply: Callable, loss: Callable | None = None,
            wrt_input: bool = False) -> Callable:
    """A stage's forward: ``fwd(params, x, y, token) -> (out, residuals, token + 1)``.

    ``loss`` is given for the last stage (``out`` is then the microbatch's loss and ``y`` its
    targets; elsewhere ``y`` is None). ``wrt_input``: the backward will also need the
    cotangent of ``x`` (every stage but the first)."""
    def fwd(params, x, y, token):
        out, leaves, _, where = _vjp(apply, loss, wrt_input, params, x, y)
        return out, [leaf for leaf, w in zip(leaves, where, strict=True) if w < 0], token + 1
    return fwd


def backward(apply: Callable, loss: Callable | None = None, wrt_input: bool = False,
             scale: float = 1.0, reduce: Callable | None = None) -> Callable:
    """A stage's backward: ``bwd(params, x, y, residuals, dout, acc, token, first=None) ->
    (grads, dx, token + 1)``. ``grads`` are this microbatch's parameter gradients plus ``acc``
    (the running sum; None: nothing to add), summed in ``accumulation_dtype`` (float32 at
    least: a sum of M bfloat16 microbatch gradients kept in bfloat16 loses their small terms,
    where ``jax.grad`` of the whole batch rounds once), so ``grads`` come in that dtype when
    ``acc`` is given (cast back to the parameters' once, before the optimizer). ``first``: a
    bool scalar; when True, ``acc`` is ignored (it only has the gradients' shapes: the
    pipeline passes the parameters), so one function serves the first microbatch and the
    others (the pipeline compiles it twice: the later backwards donate ``acc``, the running
    sum, and for parameters narrower than float32 take it in float32). ``dx`` is ``()`` unless
    ``wrt_input``. The last stage (``loss`` given) takes ``dout=None`` and seeds its loss's
    cotangent with ``scale`` (1/M: the step's loss is the mean of its M microbatches').
    Integer and boolean leaves of an activation (masks, positions, token ids a stage passes
    on) have no cotangent: ``dx`` holds ``None`` there, and ``dout`` may (JAX's ``float0``
    zeros are put back in), so no ``float0`` array goes from one stage to another.
    ``reduce``: applied to the microbatch's gradients before they are added (``sharded.py``:
    their sum over the chips, on a simulated slice)."""
    def bwd(params, x, y, residuals, dout, acc, token, first=None):
        out, leaves, tree, where = _vjp(apply, loss, wrt_input, params, x, y)
        opaque = sum(w < 0 for w in where)
        if opaque != len(residuals):
            raise ValueError(f"the stage's backward traced {opaque} residuals but its forward "
                             f"returned {len(residuals)}; the stage's apply must trace the same "
                             "way every time (no Python randomness or global state).")
        inputs, given = _leaves((params, x, y)), iter(residuals)
        vjp = _unflatten(tree, [inputs[w] if w >= 0 else next(given) for w in where])
        if dout is None and loss is not None:
            dout = jnp.full(jnp.shape(out), scale, jnp.result_type(out))
        elif loss is None:
            dout = _with_float0(out, dout)
        cts = vjp(dout)
        grads = cts[0] if reduce is None else reduce(cts[0])
        if acc is not None:
            def add(a, g):
                g = g.astype(accumulation_dtype(g.dtype))
                a = a.astype(g.dtype) + g
                return a if first is None else jnp.where(first, g, a)
            grads = jax.tree.map(add, acc, grads)
        return grads, (_without_float0(cts[1]) if wrt_input else ()), token + 1
    return bwd


def accumulation_dtype(dtype):
    """The dtype microbatch gradients of ``dtype`` are summed in: the wider of ``dtype`` and
    float32 for floating (and complex) gradients, as mixed-precision training keeps its
    accumulators; other dtypes as they are."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.promote_types(dtype, jnp.float32)
    return dtype


def _without_float0(cotangent):
    """The input's cotangent as it travels to the stage before: ``None`` where the input is
    an integer or boolean array (a mask, positions, token ids passed along), whose cotangent
    is JAX's ``float0`` (no data; it cannot be an output of a computation)."""
    return jax.tree.map(lambda c: None if c.dtype == jax.dtypes.float0 else c, cotangent)


def _with_float0(out, dout):
    """``dout`` with ``float0`` zeros back where ``_without_float0`` put ``None``: what
    ``jax.vjp`` takes for the stage's integer or boolean outputs."""
    leaves, tree = _flatten(out)
    given = tree.flatten_up_to(dout)
    return _unflatten(tree, [np.zeros(jnp.shape(o), jax.dtypes.float0) if d is None else d
                             for o, d in zip(leaves, given, strict=True)])


def residual_bytes(apply: Callable, loss: Callable | None, wrt_input: bool, params, x,
                   y=None) -> int:
    """Bytes of one microbatch's residuals on a stage (the forward's returned residuals plus,
    after the first stage, the input activation kept for the backward; all shards together),
    from shapes alone (``jax.eval_shape``: nothing runs)."""
    def probe(params, x, y):
        _, leaves, _, where = _vjp(apply, loss, wrt_input, params, x, y)
        return [leaf for leaf, w in zip(leaves, where, strict=True) if w < 0]
    shapes = jax.eval_shape(probe, params, x, y)
    return sum(s.size * s.dtype.itemsize for s in _leaves((shapes, x if wrt_input else ())))

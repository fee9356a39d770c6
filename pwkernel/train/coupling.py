"""Optimizers that look at every stage's parameters at once, under a per-stage update.

``pw.train`` runs the optax transformation on each stage's parameters separately (a
``Pipeline``'s stages live on different slices). For element-wise transformations (SGD,
Adam, ``adamw`` with a mask, ``lamb``/``lars``' per-leaf trust ratios, ``MultiSteps``,
schedules) that is the same as one update over the whole model. One that computes a
statistic over all leaves (``optax.clip_by_global_norm``'s norm, ``apply_if_finite``'s
"all finite") computed it per stage, and its losses silently differed from plain
``jax.jit``'s with the same chain.

``check(optimizer, params)`` finds such a transformation before the first step, from its
``jaxpr``: which stages' gradients and parameters each output of one update over the whole
model depends on. An output that reads two stages' is refused, with what to use instead;
``clip_by_global_norm`` here is optax's, but given the global norm that the trainer sums
across stages (``GlobalNorm``), so it gives ``jax.jit``'s numbers.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.extend import core

#: the keyword the trainers pass the gradients' global norm under (optax's extra args)
KEYWORD = "pw_train_global_norm"
_NORM = -1  # the tag of that norm in the dependency analysis


class GlobalNorm(NamedTuple):
    """The L2 norm of the whole model's gradients (summed across stages) and the stage's
    gradients it was given with: ``clip_by_global_norm`` uses the norm only when its own
    input is those gradients (first in the chain)."""

    value: Any
    grads: Any


def clip_by_global_norm(max_norm) -> optax.GradientTransformationExtraArgs:
    """``optax.clip_by_global_norm(max_norm)`` over the whole model's gradients in a
    ``pw.train`` trainer (a ``Pipeline``'s stages, an ``SPMD``'s): the trainer sums the
    squared norms across stages and passes the global one. Put it first in the chain (it
    clips the gradients themselves); under plain ``jax.jit`` it is optax's own."""
    def update(updates, state, params=None, **extra):
        del params
        given = extra.get(KEYWORD)
        if given is None:
            norm = optax.tree.norm(updates)
        elif _same_leaves(updates, given.grads):
            norm = given.value
        else:
            raise ValueError(
                "pw.train.clip_by_global_norm clips the gradients by the whole model's norm, "
                "so it must come first in the chain, on the gradients themselves (not after "
                "another transformation, nor inside optax.MultiSteps): "
                "optax.chain(pw.train.clip_by_global_norm(1.0), optax.adam(1e-3)).")
        trigger = jnp.squeeze(norm < max_norm)

        def clip(t):
            return jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm)
        return jax.tree.map(clip, updates), state
    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def init_optimizer(optimizer, params, stage: int | None = None):
    """``optimizer.init(params)`` for one stage's parameters, or, where it fails on their
    structure (a ``ValueError``: a pytree that optax maps over the parameters), the error
    that says why: the trainers run the optimizer on each stage's parameters alone, so a
    mask or label pytree written for the whole model (a list of every stage's, as plain
    ``jax.jit`` over ``[params0, params1]`` takes it) or for another stage does not fit.
    Before, it failed in ``s0.init``'s trace with optax's bare "pytree structure error"."""
    try:
        return optimizer.init(params)
    except ValueError as err:
        which = "a stage's" if stage is None else f"stage {stage}'s"
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(  # (one line: a trace's error shows its cause's first line only)
            f"the optimizer's init failed on {which} parameters: pw.train runs the optax "
            "transformation on each stage's parameters on its own ('Optimizer per stage'), so "
            "a pytree it maps over the parameters (optax.masked's mask, adamw's mask=, "
            "multi_transform's param_labels) must have each stage's own structure, not the "
            "whole model's list of stages. Maybe you want a callable, called on each stage's "
            "parameters: mask=lambda p: jax.tree.map(lambda a: a.ndim > 1, p). (optax said: "
            f"{said})") from err


def _same_leaves(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(x is y for x, y in zip(la, lb, strict=True))


def check(optimizer, params: list) -> bool:
    """Whether ``optimizer`` needs the global norm (``clip_by_global_norm`` above) in a
    trainer of the stages whose parameters are ``params`` (one pytree per stage; shapes are
    enough). Raises ``ValueError`` when an update of one stage would read another stage's
    gradients or parameters, which a per-stage update cannot give."""
    if len(params) < 2:
        return False
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), a.dtype), params)
    try:  # the whole model in one update: an output reading two stages' leaves is coupled
        tags = [s for s, p in enumerate(params) for _ in jax.tree_util.tree_leaves(p)]
        coupled, needs = _analyse(optimizer, params, tags)
    except Exception:  # (say, a mask given as a pytree of one stage's structure)
        coupled, needs = False, False
        for p in params:  # each stage alone: an output reading two of its leaves is
            c, n = _analyse(optimizer, p, list(range(len(jax.tree_util.tree_leaves(p)))))
            coupled, needs = coupled or c, needs or n
    if coupled:
        raise ValueError(
            "this optimizer computes a statistic over all parameters at once (a global norm, "
            "as optax.clip_by_global_norm, or optax.apply_if_finite's check): pw.train "
            "updates each stage's parameters on its own, so it would see one stage's and "
            "train differently from the same chain under plain jax.jit. For clipping, use "
            "pw.train.clip_by_global_norm(max_norm) first in the chain instead of "
            "optax.clip_by_global_norm (the trainer sums the norm across stages); other such "
            "transformations are not supported (docs/training.md, 'Optimizer per stage').")
    return needs


def _analyse(optimizer, params, tags: list[int]) -> tuple[bool, bool]:
    state = jax.eval_shape(optimizer.init, params)

    takes = takes_keyword(optimizer.update, KEYWORD)
    takes_value = takes_keyword(optimizer.update, "value")

    def update(grads, state, params, norm, value):  # (as apply_optimizer calls it)
        extra = {KEYWORD: GlobalNorm(norm, grads)} if takes else {}
        if takes_value:
            extra["value"] = value
        return optimizer.update(grads, state, params, **extra)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    closed = jax.make_jaxpr(update)(params, state, params, scalar, scalar)
    n_state = len(jax.tree_util.tree_leaves(state))
    ins = ([frozenset({t}) for t in tags] + [frozenset()] * n_state
           + [frozenset({t}) for t in tags] + [frozenset({_NORM}), frozenset()])
    outs = _deps(closed.jaxpr, ins)
    coupled = any(len(d - {_NORM}) > 1 for d in outs)
    return coupled, any(_NORM in d for d in outs)


def takes_keyword(update, name: str) -> bool:
    """Whether ``update`` takes the keyword argument ``name`` (or any: ``**extra_args``)."""
    try:
        accepted = inspect.signature(update).parameters.values()
    except (TypeError, ValueError):  # (a callable without a signature: give it nothing more)
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name == name for p in accepted)


def _deps(jaxpr, ins: list[frozenset]) -> list[frozenset]:
    """For each output of ``jaxpr``, the union of the tags of the inputs it depends on."""
    env: dict[Any, frozenset] = dict(zip(jaxpr.invars, ins, strict=True))

    def read(v) -> frozenset:
        return frozenset() if isinstance(v, core.Literal) else env.get(v, frozenset())
    for eqn in jaxpr.eqns:
        outs = _eqn(eqn, [read(v) for v in eqn.invars])
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _eqn(eqn, ins: list[frozenset]) -> list[frozenset]:
    name = eqn.primitive.name
    if name == "cond":  # any branch, and the index that picks it
        outs = [ins[0]] * len(eqn.outvars)
        for branch in eqn.params["branches"]:
            outs = [o | d for o, d in zip(outs, _deps(branch.jaxpr, ins[1:]), strict=True)]
        return outs
    subs = [p for p in eqn.params.values() if isinstance(p, core.Jaxpr | core.ClosedJaxpr)]
    if name not in ("scan", "while") and len(subs) == 1:  # (jit, custom_jvp/vjp, remat)
        sub = getattr(subs[0], "jaxpr", subs[0])
        if len(sub.invars) == len(ins) and len(sub.outvars) == len(eqn.outvars):
            return _deps(sub, ins)
    every = frozenset().union(*ins)  # (loops and the rest: every output reads every input)
    return [every] * len(eqn.outvars)

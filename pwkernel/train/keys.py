"""How ``pw.train`` derives PRNG keys: each stage's init key, and each stage's optimizer keys.

The rule (docs/training.md, "Randomness: the key rule"):

- ``t.init(key)`` splits ``key`` into one key per stage, ``jax.random.split(key, S)[s]`` for
  stage ``s``, the same for a ``Pipeline`` and an ``SPMD`` of the same stages. An int seed
  is ``jax.random.PRNGKey(seed)``. A stage's ``init`` gets a raw key (``uint32``, of the
  default implementation's shape: ``(2,)`` for threefry, ``(4,)`` under
  ``jax_default_prng_impl="rbg"``); a typed key (``jax.random.key``) of the default
  implementation gives the same raw keys, and one of another implementation
  (``jax.random.key(0, impl="rbg")`` under threefry) gives typed keys of its own
  implementation, whose raw data the default one cannot read.
- The optimizer runs per stage, so an optimizer state holding a key (``optax.add_noise``,
  ``optax.noisy_sgd``) would hold the same key in every stage, and every stage would draw
  the same noise. Stage ``s >= 1`` gets ``jax.random.fold_in(k, s)`` in place of each typed
  key ``k`` that ``optimizer.init`` returned; stage 0 keeps optax's own (so a one-stage
  model trains as plain optax does). The draws are independent per stage, not those of one
  chain over the whole model (which splits one key over every leaf of every stage).
- ``pw.train`` draws nothing else: dropout keys come with the batch (one per example).
"""

from __future__ import annotations

import jax
import numpy as np


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def stage_keys(key, stages: int):
    """One PRNG key per stage from ``key`` (an int seed, a raw key or a typed
    ``jax.random.key``): raw keys of the default implementation (a NumPy array, one row per
    stage), or typed keys for a typed key of another implementation (module doc)."""
    if isinstance(key, int | np.integer):
        key = jax.random.PRNGKey(int(key))
    elif _is_key(key):
        if jax.random.key_impl(key) != jax.random.key_impl(jax.random.key(0)):
            return jax.random.split(key, stages)  # (its raw data means nothing to the default)
        key = jax.random.key_data(key)
    elif getattr(key, "shape", ()) == ():
        raise TypeError(f"key must be an int seed or a JAX PRNG key (jax.random.key(0) or "
                        f"jax.random.PRNGKey(0)), got {type(key).__name__} {key!r}. Maybe you "
                        "want init(0).")
    return np.asarray(jax.random.split(np.asarray(key, np.uint32), stages))


def stage_key_struct() -> jax.ShapeDtypeStruct:
    """The shape of the raw key ``stage_keys`` gives a stage (the default implementation's),
    for ``jax.eval_shape`` of a stage's init."""
    return jax.eval_shape(lambda: jax.random.PRNGKey(0))


def distinct_stage_keys(opt_state, stage: int | None):
    """``opt_state`` (stage ``stage``'s, from ``optimizer.init``) with each typed PRNG key
    ``k`` replaced by ``jax.random.fold_in(k, stage)`` for a stage after the first, so no two
    stages draw the same noise (module doc)."""
    if not stage:
        return opt_state
    return jax.tree.map(lambda x: jax.random.fold_in(x, stage) if _is_key(x) else x, opt_state)

"""Values as they travel between processes (controller and island actors, island and island):
NumPy arrays, and typed PRNG key arrays (``jax.random.key``), which NumPy cannot hold, as
their key data and the name of their implementation."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class KeyData(NamedTuple):
    """A typed key array on the wire: ``jax.random.key_data`` and ``jax.random.key_impl``."""

    data: np.ndarray
    impl: str


def to_host(value) -> np.ndarray | KeyData:
    """``value`` (a ``jax.Array``, a NumPy array or a scalar) ready to travel."""
    import jax

    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        return KeyData(np.asarray(jax.random.key_data(value)), str(jax.random.key_impl(value)))
    return np.asarray(value)


def from_host(value, sharding=None) -> Any:
    """What ``to_host`` made, placed on ``sharding`` (None: left where JAX puts it; a
    NumPy array is then returned as it is)."""
    import jax

    if isinstance(value, KeyData):
        value = jax.random.wrap_key_data(value.data, impl=value.impl)
    return value if sharding is None else jax.device_put(value, sharding)

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
    NumPy array is then returned as it is), in this process's own memory (``own``)."""
    import jax

    if isinstance(value, KeyData):
        value = jax.random.wrap_key_data(own(value.data), impl=value.impl)
    else:
        value = own(value)
    return value if sharding is None else jax.device_put(value, sharding)


def own(value):
    """``value`` copied into this process's memory when it is a view of memory it does not
    own. Ray hands a value of more than 100 KB over as a read-only view of its node's object
    store (shared memory); JAX places a read-only array on a CPU device without copying it,
    so the ``jax.Array`` would keep the store's memory mapped for as long as it lives, and
    letting it go once that store has gone (a pool killed with ``kill -9``) makes Ray end
    this process. The copy is read-only too, so JAX takes it without a second copy."""
    if isinstance(value, np.ndarray) and value.base is not None:
        value = np.array(value)
        value.flags.writeable = False
    return value

"""Element types as the runtime keeps them: NumPy's ``np.dtype``, or one of JAX's extended
dtypes as it is (a typed PRNG key's ``key<fry>``, made by ``jax.random.key``), which NumPy
cannot represent but which hashes, compares and has an ``itemsize`` like one.

>>> as_dtype("float32"), itemsize(np.float32)
(dtype('float32'), 4)
>>> as_dtype(jax.random.key(0).dtype), itemsize(jax.random.key(0).dtype)
(key<fry>, 8)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

_SEEN: dict[Any, Any] = {}  # each dtype spec given, as_dtype'd (a lookup is 10x cheaper)


def as_dtype(dtype) -> Any:
    """``np.dtype(dtype)``, or ``dtype`` itself when it is one of JAX's extended dtypes."""
    try:
        return _SEEN[dtype]
    except (KeyError, TypeError):  # (TypeError: an unhashable dtype spec)
        pass
    if isinstance(dtype, np.dtype) or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        out = dtype
    else:
        out = np.dtype(dtype)
    if getattr(out, "metadata", None) is None and getattr(out, "fields", None) is None:
        try:  # (equal dtypes that differ in those are not kept: they would match each other)
            _SEEN[dtype] = out
        except TypeError:
            pass
    return out


def itemsize(dtype) -> int:
    """Bytes per element (a typed key's: its raw key data's)."""
    return as_dtype(dtype).itemsize


def weak_type(value) -> bool:
    """Whether ``value`` (an array, a future) is weakly typed, as JAX types a Python scalar
    (a typed key array has no such flag: it never is)."""
    return bool(getattr(value, "weak_type", False))


@functools.cache
def jax_takes(dtype: np.dtype) -> bool:
    """Whether JAX has a type for a NumPy array of ``dtype`` (``jax.jit`` refuses one it has
    none for: non-native byte order, ``np.longdouble``, objects, strings, dates)."""
    try:
        jax.typeof(np.zeros((), dtype))
    except TypeError:
        return False
    return True


def untyped_fix(dtype: np.dtype) -> str | None:
    """How to give JAX a NumPy array of ``dtype``, which it has no type for (None: it has no
    numeric dtype to convert it to)."""
    if not dtype.isnative:
        return ("x.astype(x.dtype.newbyteorder('=')) (JAX takes arrays in the machine's byte "
                "order)")
    if dtype.kind in "fc" and not jax_takes(dtype):
        return ("x.astype(np.float64)" if dtype.kind == "f" else "x.astype(np.complex128)") + \
            " (JAX has no extended-precision types)"
    return None

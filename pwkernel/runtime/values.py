"""What a ``Future`` offers where Python needs its value: ``await``, NumPy and JAX
conversions, Python's numbers and comparisons, ``len``, as a ``jax.Array`` offers them. Each
waits for the value (``result()``) and then does what the value does."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable

import numpy as np


def _on_value(op: Callable) -> Callable:
    """A method of ``Future`` that applies ``op`` to the value (waiting for it), as a
    ``jax.Array`` would do it."""
    def method(self, *args):
        return op(self.result(), *args)
    method.__name__ = getattr(op, "__name__", "method")
    return method


class OnValue:
    """A base of ``Future`` (``runtime/objects.py``): the value's own methods, on the value
    once it is there. Subclasses give ``result(timeout)``, ``add_done_callback(fn)`` and
    ``shape``."""

    __slots__ = ()

    def __await__(self):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(fut: OnValue) -> None:
            def settle() -> None:
                if waiter.cancelled():
                    return
                try:
                    waiter.set_result(fut.result(0))
                except BaseException as e:  # noqa: BLE001 - hand the error to the awaiter
                    waiter.set_exception(e)
            loop.call_soon_threadsafe(settle)

        self.add_done_callback(wake)
        return waiter.__await__()

    # --- values on demand: where Python needs the value, wait for it (as jax.Array does) ---
    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self.result())
        return out.astype(dtype) if dtype is not None else out

    def __jax_array__(self):
        return self.result()

    # (each of these: the value's own, once it is there)
    item = _on_value(lambda v, *args: v.item(*args))
    tolist = _on_value(lambda v: v.tolist())
    __float__, __int__, __complex__, __bool__ = map(_on_value, (float, int, complex, bool))
    __index__ = _on_value(operator.index)
    __lt__, __le__, __gt__, __ge__ = map(_on_value, (operator.lt, operator.le, operator.gt,
                                                     operator.ge))

    def __format__(self, spec: str) -> str:
        return format(self.result(), spec) if spec else repr(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d (scalar) Future")
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

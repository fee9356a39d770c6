"""XLA compiles a computation once: an executable is shared by every trace that lowers to the
same computation on the same devices.

A ``%%pathways`` cell is traced again each time it runs (its Python may read anything of the
notebook's), and a ``pw.function`` made again (a cell that defines it, a trainer's copy per
microbatch) has caches of its own, so the same computation reached ``jax.jit(...).compile()``
again and again: a cell of one training step spent most of its second run compiling what its
first run had compiled. JAX keeps compiled executables per ``jax.jit`` object, which each of
these makes afresh. Here they are kept by what XLA compiles: the lowered StableHLO as text
without source locations (so a cell's number or line does not count, and every constant does:
none are elided), the devices it runs on, and the traced input and output types, weak types
included (the executable gives its outputs those types, and HLO does not show them).

A computation that captured large constants is compiled without the cache: printing it would
cost about what compiling it does. The cache keeps the ``KEEP`` executables used last.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Any

__all__ = ["KEEP", "clear", "compile_once", "kept"]

KEEP = 64  # executables kept
_LARGE = 1 << 20  # bytes of captured constants past which a computation is not fingerprinted

_kept: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def compile_once(traced, devices) -> Any:
    """``traced.lower().compile()``, or the executable an identical computation on the same
    ``devices`` (a sequence of JAX devices, in mesh order) was compiled to."""
    lowered = traced.lower()
    key = _key(traced, lowered, devices)
    if key is not None:
        with _lock:
            compiled = _kept.get(key)
            if compiled is not None:
                _kept.move_to_end(key)
                return compiled
    compiled = lowered.compile()
    if key is not None:
        with _lock:
            _kept[key] = compiled
            while len(_kept) > KEEP:
                _kept.popitem(last=False)
    return compiled


def _key(traced, lowered, devices) -> tuple | None:
    closed = traced.jaxpr
    if sum(getattr(c, "nbytes", 0) for c in closed.consts) > _LARGE:
        return None
    text = lowered.compiler_ir("stablehlo").operation.get_asm(
        enable_debug_info=False, large_elements_limit=None)
    types = tuple((a.shape, str(a.dtype), a.weak_type) for a in (*closed.in_avals,
                                                                    *closed.out_avals))
    return (hashlib.sha256(text.encode()).digest(),
            tuple((d.platform, d.id) for d in devices), types)


def kept() -> int:
    """How many executables are kept now."""
    return len(_kept)


def clear() -> None:
    """Forget every kept executable."""
    with _lock:
        _kept.clear()

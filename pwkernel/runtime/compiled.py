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
included (the executable gives its outputs those types, and HLO does not show them), and the
output shardings it was asked for (``P()`` and ``P(None, None)`` lower alike, and each
executable gives its outputs its own spelling, as ``jax.jit``'s ``out_shardings`` say).

A computation that captured large constants is compiled without the cache: printing it would
cost about what compiling it does. The cache keeps the ``KEEP`` executables used last, and
``jax.clear_caches()`` clears it, as it clears JAX's own (``jax_caches``).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import threading
from typing import Any

import jax

from .jax_caches import ClearedByJax

__all__ = ["KEEP", "TRACES", "Latest", "clear", "compile_once", "kept", "keep_latest"]

KEEP = 64  # executables kept
# a function's or program's traces kept (``keep_latest``): as many as each of jax.jit's own
# trace caches keeps (JAX's ``weakref_lru_cache``), so that a program called on ever new
# shapes keeps a bounded number of graphs and executables, as ``jax.jit`` does
TRACES = 2048
_LARGE = 1 << 20  # bytes of captured constants past which a computation is not fingerprinted


class Latest:
    """The ``keep`` values used last, by key, for any thread (an LRU: a ``get`` that finds one
    makes it the latest; a ``put`` past ``keep`` drops the one used longest ago)."""

    def __init__(self, keep: int):
        self.keep = keep
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> Any:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


_kept = Latest(KEEP)
_cleared_by_jax = ClearedByJax(_kept.clear, "executables of identical computations")


def keep_latest(cache: dict, key, value) -> None:
    """``cache[key] = value``, forgetting the oldest entry past ``TRACES``. Reads stay plain
    dict reads (a call's hot path), so what goes first is the one added first."""
    cache[key] = value
    if len(cache) > TRACES:
        with contextlib.suppress(RuntimeError, StopIteration):  # (another thread changed it
            cache.pop(next(iter(cache)), None)  # between the two: the next insert trims it)


def compile_once(traced, devices) -> Any:
    """``traced.lower().compile()``, or the executable an identical computation on the same
    ``devices`` (a sequence of JAX devices, in mesh order) was compiled to."""
    lowered = traced.lower()
    key = _key(traced, lowered, devices)
    compiled = None if key is None else _kept.get(key)
    if compiled is None:
        compiled = lowered.compile()
        if key is not None:
            _kept.put(key, compiled)
    return compiled


def _key(traced, lowered, devices) -> tuple | None:
    closed = traced.jaxpr
    if sum(getattr(c, "nbytes", 0) for c in closed.consts) > _LARGE:
        return None
    text = lowered.compiler_ir("stablehlo").operation.get_asm(
        enable_debug_info=False, large_elements_limit=None)
    types = tuple((a.shape, str(a.dtype), a.weak_type) for a in (*closed.in_avals,
                                                                    *closed.out_avals))
    # the output shardings as asked for: P() and P(None, None) lower alike, and the
    # executable gives its outputs the spelling it was compiled with
    layouts = tuple(getattr(o, "sharding", None) for o in jax.tree.leaves(lowered.out_info))
    return (hashlib.sha256(text.encode()).digest(),
            tuple((d.platform, d.id) for d in devices), types, layouts)


def kept() -> int:
    """How many executables are kept now."""
    return len(_kept)


def clear() -> None:
    """Forget every kept executable."""
    _kept.clear()

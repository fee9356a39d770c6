"""``jax.clear_caches()`` clears pwkernel's caches too, as it clears every ``jax.jit``'s: a
``pw.function``'s traces and compiled specializations, a ``@pw.program``'s graphs, and the
executables identical computations share (``compiled``). So what ``jax.clear_caches()`` is
called for works on them as on ``jax.jit``: the next call runs the Python again (to see a
global that changed), and the executables kept only by those caches are let go.

JAX has no public hook for this: its own caches register with ``jax._src.util.register_cache``
(held weakly, each cleared by its ``cache_clear()``), and ``ClearedByJax`` does the same. Under
a JAX without it, ``jax.clear_caches()`` leaves them; each ``clear_cache()`` still clears.
"""

from __future__ import annotations

from collections.abc import Callable

from jax._src import util as jax_util

__all__ = ["ClearedByJax"]


class ClearedByJax:
    """Calls ``clear`` on ``jax.clear_caches()`` for as long as its owner holds it (JAX holds
    it weakly). ``clear`` must not wait for a lock a runtime thread may hold: JAX clears its
    caches at exit too, while those threads may still be tracing or compiling."""

    __slots__ = ("clear", "__weakref__")

    def __init__(self, clear: Callable[[], None], what: str):
        self.clear = clear
        register = getattr(jax_util, "register_cache", None)
        if register is not None:
            register(self, f"pwkernel: {what}")

    def cache_clear(self) -> None:  # (what JAX calls)
        self.clear()

    def cache_info(self) -> None:  # (the rest of what JAX's registry expects of a cache)
        return None

    def cache_keys(self) -> tuple:
        return ()

"""One compiled specialization of a ``pw.function``: what a backend launches, and what it needs
and makes (the dispatcher prepares plans from it, before anything runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class Executable:
    """One compiled specialization of a compiled function, and what it needs and makes."""

    compiled: Any
    in_shardings: tuple[Any, ...]
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]
    out_shardings: tuple[Any, ...]
    out_tree: Any
    memory: int  # output bytes on each of the slice's devices
    out_nbytes: tuple[dict[int, int], ...]  # per output: bytes on each device
    asynchronous: bool = True  # launching returns at once (no host callbacks inside)
    # How launches call it: the compiled executable itself (C++ dispatch after its first call;
    # unlike the jit object it never traces again, whatever mesh is ambient in that thread)
    call: Any = None
    # On a simulated island: the function lowered for its chips (never compiled), which the
    # simulator's cost model reads
    lowered: Any = None
    # The body over flat input leaves (static arguments bound), and those inputs' types with
    # their shardings: what a backend that compiles elsewhere exports or lowers
    flat: Any = None
    structs: tuple[jax.ShapeDtypeStruct, ...] = ()
    donated: tuple[int, ...] = ()  # input leaves the computation consumes (donate_argnums)
    # The body as traced once for this signature (a ClosedJaxpr over the flat leaves): what is
    # compiled, lowered for simulated chips and exported runs it again (``specialization.replay``)
    # instead of the user's Python; ``flat`` is for lowering on another mesh
    jaxpr: Any = None
    # Bytes per device of donated inputs XLA reuses for outputs (its memory analysis): what a
    # launch consumes (None: not known here, e.g. compiled elsewhere; then every donated
    # input is taken as consumed). A donated input no output can reuse stays valid.
    aliased: int | None = None
    keep_unused: bool = False  # (``jax.jit``'s): inputs the body does not read are kept

    @property
    def input_names(self) -> tuple[str, ...]:
        """Each input leaf's place in the call's arguments as JAX's trace names it
        (``p.fast['w']``), for errors; () where the trace does not say."""
        info = getattr(getattr(self.jaxpr, "jaxpr", None), "debug_info", None)
        names = tuple(getattr(info, "arg_names", None) or ())
        return names if len(names) == len(self.structs) and all(names) else ()

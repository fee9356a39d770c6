"""The paper's Figure 2 program, built on any controller: one definition for the tutorials,
the benchmarks and the tests.

``a`` runs on a 2-device slice of island 0, ``b`` and ``c`` on one of island 1::

    def f(v):
        x = a(v)
        return b(x), a(c(x))

For the input ``[1., 2.]`` it gives ``([3., 5.], [2., 4.])``; its data crosses between the
islands twice (``x`` to ``b`` and ``c``, ``c``'s output back to ``a``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jax.sharding import PartitionSpec as P

from pwkernel.runtime.controller import Controller
from pwkernel.runtime.program import CompiledFunction, Program, function, program
from pwkernel.runtime.resources import VirtualSlice

INPUT = np.array([1.0, 2.0], dtype=np.float32)
OUTPUT = (np.array([3.0, 5.0], dtype=np.float32), np.array([2.0, 4.0], dtype=np.float32))


@dataclass(frozen=True)
class Figure2:
    """The program ``f`` with its functions and slices."""

    f: Program
    a: CompiledFunction
    b: CompiledFunction
    c: CompiledFunction
    s0: VirtualSlice
    s1: VirtualSlice


def figure2(ctl: Controller) -> Figure2:
    """Figure 2 on ``ctl`` (which needs two islands of at least 2 devices each)."""
    s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
    a = function(lambda x: x * 2, slice=s0, in_specs=P("x"), out_specs=P("x"), name="a")
    b = function(lambda x: x + 1, slice=s1, name="b")
    c = function(lambda x: x / 2, slice=s1, name="c")

    @program
    def f(v):
        x = a(v)
        return b(x), a(c(x))

    return Figure2(f, a, b, c, s0, s1)

"""Data-parallel (SPMD) training: the whole model on one slice, the batch sharded over it.

One compiled function is the whole training step (forward, backward, optax update): the
parameters and optimizer state replicated on the slice and donated from step to step, the
batch's leading axis sharded over the slice's devices (``in_specs=pw.BATCH``); the gradients'
all-reduce is the compiler's. It is the same step as ``train_step`` under plain ``jax.jit``
(which ``pwkernel.bench.train`` runs beside it), and the same model and state layout as a
``Pipeline`` of the same stages. On a simulated slice (``backend="sim"``) the step is timed
by the simulator's cost model and computes nothing (``pipeline.py``'s doc says what that gives).

>>> spmd = SPMD(stages, ctl.slice(4), loss=cross_entropy,                # doctest: +SKIP
...             optimizer=optax.adam(1e-3))
>>> state = spmd.init(0)                                                  # doctest: +SKIP
>>> state, loss = spmd.step(state, (tokens, targets))                     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax
from jax.sharding import PartitionSpec as P

from ..runtime.program import BATCH, function
from ..runtime.resources import VirtualSlice
from .stage import Stage, model_loss
from .state import (
    Placer,
    TrainState,
    apply_optimizer,
    check_stages,
    init_stage,
    raise_if_not_finite,
    ready_to_donate,
    simulated,
    stage_keys,
)


def train_step(stages: Sequence[Stage], loss: Callable, optimizer: optax.GradientTransformation,
               check_finite: bool = False) -> Callable:
    """The whole training step as a plain JAX function, ``step(state, x, y) -> (state,
    loss)``: ``jax.value_and_grad`` of every stage then ``loss``, and an optax update per
    stage. What ``SPMD`` places on a slice, and what plain ``jax.jit`` runs to compare."""
    full = model_loss(stages, loss)

    def step(state: TrainState, x, y):
        value, grads = jax.value_and_grad(full)(state.params, x, y)
        if check_finite:
            jax.debug.callback(raise_if_not_finite, value)
        new = [apply_optimizer(optimizer, p, o, g)
               for p, o, g in zip(state.params, state.opt_state, grads, strict=True)]
        return TrainState([p for p, _ in new], [o for _, o in new]), value
    return step


def init_state(stages: Sequence[Stage], optimizer: optax.GradientTransformation) -> Callable:
    """``keys -> TrainState``: each stage's ``init`` on its key, and its optimizer state."""
    inits = [init_stage(st.init, optimizer) for st in stages]

    def init(keys):
        made = [f(keys[s]) for s, f in enumerate(inits)]
        return TrainState([p for p, _ in made], [o for _, o in made])
    return init


class SPMD:
    """Train ``stages`` data-parallel on one ``slice``: the same ``init`` / ``step`` as a
    ``Pipeline``, one compiled function per step (trace name ``{name}.step``)."""

    def __init__(self, stages: Sequence[Stage], slice: VirtualSlice, *, loss: Callable,
                 optimizer: optax.GradientTransformation, check_finite: bool = False,
                 name: str = "spmd"):
        check_stages(stages)
        self.stages, self.slice, self.loss, self.optimizer = list(stages), slice, loss, optimizer
        self.name = name
        check = check_finite and not simulated(slice)  # no values to check on a simulation
        self._step = function(train_step(self.stages, loss, optimizer, check),
                              slice=slice, in_specs=(None, BATCH, BATCH), out_specs=P(),
                              donate_argnums=(0,), name=f"{name}.step")
        self._init = function(init_state(self.stages, optimizer), slice=slice, out_specs=P(),
                              name=f"{name}.init")
        self._placer: Placer | None = None

    def init(self, key) -> TrainState:
        """Parameters and optimizer state on the slice, replicated (futures); the same values
        as ``Pipeline.init(key)`` gives for the same stages."""
        return self._init(stage_keys(key, len(self.stages)))

    def place(self, batch):
        """``batch`` put on the slice, sharded as ``step`` reads it (ahead of time)."""
        if self._placer is None:
            self._placer = Placer(self.slice, "the batch")
        return tuple(self._placer(tuple(batch)))

    def step(self, state: TrainState, batch) -> tuple[TrainState, Any]:
        """One step: ``(new_state, loss)`` as futures at once; ``state`` is consumed
        (donated). ``batch``: ``(inputs, targets)`` with a leading batch axis."""
        if not isinstance(state, TrainState):
            raise TypeError(f"step takes the TrainState that init() or step() returned, got "
                            f"{type(state).__name__}.")
        x, y = batch
        ready_to_donate(state)
        return self._step(state, x, y)

    def __repr__(self) -> str:
        return f"pw.train.SPMD({len(self.stages)} stages on {self.slice!r})"

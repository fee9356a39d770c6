"""Data-parallel (SPMD) training: the whole model on one slice, the batch sharded over it.

One compiled function is the whole training step (forward, backward, optax update): the
parameters and optimizer state replicated on the slice and donated from step to step, the
batch's leading axis sharded over the slice's devices (``in_specs=pw.BATCH``); the gradients'
all-reduce is the compiler's. It is the same step as ``train_step`` under plain ``jax.jit``
(which ``pwkernel.bench.train`` runs beside it), and the same model and state layout as a
``Pipeline`` of the same stages. On a simulated slice (``backend="sim"``) the step is timed
by the simulator's cost model and computes nothing (``pipeline.py``'s doc says what that gives);
there the gradients' all-reduce is written out (``simulated_step``), since the simulator
sees only the collectives written with ``shard_map``.

With ``packed=True`` the state goes from step to step packed (``PackedState``: one flat array
per dtype, packed and unpacked inside the compiled step, ``packed.py``), so the runtime
carries a few values a step however many leaves the model has; ``state.params`` unpacks it
on demand.

>>> spmd = SPMD(stages, ctl.slice(4), loss=cross_entropy,                # doctest: +SKIP
...             optimizer=optax.adam(1e-3))
>>> state = spmd.init(0)                                                  # doctest: +SKIP
>>> state, loss = spmd.step(state, (tokens, targets))                     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from ..runtime.keywords import suggests_keywords
from ..runtime.program import BATCH, function
from ..runtime.resources import VirtualSlice
from . import coupling, sharded
from .batches import Placer, check_whole
from .packed import Layout
from .restored import from_mapping
from .stage import Stage, check_trainable, model_loss
from .state import (
    PackedState,
    StateShapes,
    TrainState,
    apply_optimizer,
    check_batch,
    check_loss,
    check_optimizer,
    check_slice,
    check_stages,
    init_stage,
    inputs_and_targets,
    not_a_state,
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
    grads, update = step_parts(stages, loss, optimizer, check_finite)

    def step(state: TrainState, x, y):
        g, value = grads(state, x, y)
        return update(state, g, value), value
    return step


def step_parts(stages: Sequence[Stage], loss: Callable, optimizer: optax.GradientTransformation,
               check_finite: bool = False) -> tuple[Callable, Callable]:
    """The step in two: ``grads(state, x, y) -> (grads, loss)`` (with the NaN check) and
    ``update(state, grads, loss) -> state``. ``SPMD(check_finite=True)`` runs them as two
    computations, so a failed check fails the update before it consumes the state."""
    full = model_loss(stages, loss)
    shapes = StateShapes(stages, optimizer)  # (what init makes)

    def grads(state: TrainState, x, y):
        shapes.check(f"this model ({len(stages)} stages)", state.params, state.opt_state)
        check_trainable(state.params)
        value, g = jax.value_and_grad(full)(state.params, x, y)
        if check_finite:
            jax.debug.callback(raise_if_not_finite, value)
        return g, value

    def update(state: TrainState, g, value):  # (``value``: the check's result, waited for)
        # an optimizer that needs the whole model's gradient norm gets it (coupling.py)
        norm = optax.tree.norm(g) if coupling.check(optimizer, state.params) else None
        new = [apply_optimizer(optimizer, p, o, gs, value, norm)
               for p, o, gs in zip(state.params, state.opt_state, g, strict=True)]
        return TrainState([p for p, _ in new], [o for _, o in new])
    return grads, update


def simulated_step(stages: Sequence[Stage], loss: Callable,
                   optimizer: optax.GradientTransformation, axes: Sequence[str]) -> Callable:
    """``train_step`` with its all-reduce written out, for a simulated slice whose mesh axes
    are ``axes``: each chip's gradients and loss of its shard of the batch (``shard_map``), their
    mean over the slice (``pmean``, one all-reduce per gradient leaf and one for the loss), then
    the update, replicated. The same mean as ``train_step``'s for a loss that is the mean over
    the examples; what it adds is what the simulator times: the all-reduces XLA's partitioner
    inserts on real devices, where ``SPMD`` runs ``train_step`` itself."""
    grads, update = step_parts(stages, loss, optimizer)
    axes = tuple(axes)
    sharded = P(axes if len(axes) > 1 else axes[0])

    def local(state: TrainState, x, y):
        return jax.lax.pmean(grads(state, x, y), axes)

    def step(state: TrainState, x, y):
        def specs(tree):  # (as ``pw.BATCH`` lays it out: a scalar replicated)
            return jax.tree.map(lambda a: sharded if jnp.ndim(a) else P(), tree)
        g, value = jax.shard_map(local, in_specs=(P(), specs(x), specs(y)), out_specs=P(),
                                 check_vma=False)(state, x, y)
        return update(state, g, value), value
    return step


def init_state(stages: Sequence[Stage], optimizer: optax.GradientTransformation) -> Callable:
    """``keys -> TrainState``: each stage's ``init`` on its key, and its optimizer state."""
    inits = [init_stage(st.init, optimizer, s) for s, st in enumerate(stages)]

    def init(keys):
        made = [f(keys[s]) for s, f in enumerate(inits)]
        return TrainState([p for p, _ in made], [o for _, o in made])
    return init


@suggests_keywords("pw.train.SPMD")
class SPMD:
    """Train ``stages`` data-parallel on one ``slice``: the same ``init`` / ``step`` as a
    ``Pipeline``, one compiled function per step (trace name ``{name}.step``).

    ``packed=False`` (the default): the state is a ``TrainState`` with a future per leaf, as a
    ``Pipeline`` carries it. ``packed=True``: it travels from step to step as a
    ``PackedState``, one flat array per dtype packed and unpacked inside the step
    (``packed.py``): the same values, a few futures a step instead of one per leaf, for one
    more pass over the state on the devices (docs/training.md says when that pays).
    ``optimizer`` runs per stage, as a ``Pipeline`` runs it (docs/training.md, "Optimizer per
    stage")."""

    def __init__(self, stages: Sequence[Stage], slice: VirtualSlice, *, loss: Callable,
                 optimizer: optax.GradientTransformation, check_finite: bool = False,
                 packed: bool = False, name: str = "spmd"):
        check_stages(stages)
        check_slice(slice)
        check_optimizer(optimizer)
        check_loss(loss)
        check_finite_runs(check_finite, [slice], "SPMD")
        self.stages, self.slice, self.loss, self.optimizer = list(stages), slice, loss, optimizer
        self.name, self.packed = name, packed
        self._train = (simulated_step(self.stages, loss, optimizer, slice.axis_names)
                       if simulated(slice) and slice.size > 1
                       else train_step(self.stages, loss, optimizer))
        self._make = init_state(self.stages, optimizer)
        # a checked step is two computations (no values to check on a simulation)
        self._parts = (step_parts(self.stages, loss, optimizer, True)
                       if check_finite and not simulated(slice) else None)
        self._fns: dict[str, Callable] | None = None
        self._placer: Placer | None = None

    @property
    def layout(self) -> Layout | None:
        """How a ``PackedState`` of this model holds its leaves (None unless ``packed``)."""
        return self._functions()["layout"] if self.packed else None

    def _functions(self) -> dict:
        """The compiled functions, made on first use (a packed layout traces ``init`` once)."""
        if self._fns is not None:
            return self._fns
        train, make, name = self._train, self._make, self.name

        def placed(fn, what, **kw):
            return function(fn, slice=self.slice, out_specs=P(), name=f"{name}.{what}", **kw)
        if not self.packed:
            self._fns = {"step": placed(train, "step", in_specs=(None, BATCH, BATCH),
                                        donate_argnums=(0,)), "init": placed(make, "init")}
        else:
            layout = Layout(jax.eval_shape(make, stage_keys(0, len(self.stages))))
            self._fns = {"layout": layout,
                         "step": placed(layout.wrap(train), "step",
                                        in_specs=(None, BATCH, BATCH), donate_argnums=(0,)),
                         "init": placed(lambda keys: layout.pack(make(keys)), "init"),
                         "pack": placed(layout.pack, "pack"),
                         "unpack": placed(layout.unpack, "unpack")}
        full = model_loss(self.stages, self.loss)
        if simulated(self.slice) and self.slice.size > 1:  # (the loss's all-reduce written out)
            full = sharded.mean_loss(full, self.slice.axis_names)
        full = StateShapes(self.stages, self.optimizer).checking(full, repr(self))
        self._fns["evaluate"] = placed(full, "eval", in_specs=(None, BATCH, BATCH))
        if self.packed:
            self._fns["evaluate_packed"] = placed(
                lambda s, x, y: full(layout.unpack(s).params, x, y), "eval",
                in_specs=(None, BATCH, BATCH))
        if self._parts is not None:
            grads, update = self._parts
            if self.packed:
                unpack, pack = layout.unpack, layout.pack
                grads = lambda s, x, y, g=grads: g(unpack(s), x, y)  # noqa: E731
                update = lambda s, gs, v, u=update: pack(u(unpack(s), gs, v))  # noqa: E731
            self._fns["grads"] = placed(grads, "grads", in_specs=(None, BATCH, BATCH))
            self._fns["update"] = placed(update, "update", donate_argnums=(0,))
        return self._fns

    def init(self, key) -> TrainState | PackedState:
        """Parameters and optimizer state on the slice, replicated (futures); the same values
        as ``Pipeline.init(key)`` gives for the same stages."""
        fns = self._functions()
        made = fns["init"](stage_keys(key, len(self.stages)))
        return PackedState(made, fns["layout"], fns["unpack"]) if self.packed else made

    def place(self, batch):
        """``batch`` put on the slice, sharded as ``step`` reads it (ahead of time)."""
        if self._placer is None:
            self._placer = Placer(self.slice, "the batch")
        return tuple(self._placer(tuple(batch)))

    def step(self, state: TrainState | PackedState, batch) -> tuple[Any, Any]:
        """One step: ``(new_state, loss)`` as futures at once. ``state``: what ``init()`` or
        ``step()`` returned, consumed (donated); or a ``TrainState`` of this model's (e.g. a
        ``Pipeline``'s, or values from ``fetch``), which a packed trainer packs into a copy
        and does not consume. ``batch``: ``(inputs, targets)`` with a leading batch axis."""
        check_whole(batch, "spmd.step")
        fns = self._functions()
        state = self._check(_current(state))
        ready_to_donate(state)
        if self.packed and isinstance(state, TrainState):
            state = PackedState(fns["pack"](state), fns["layout"], fns["unpack"])
        x, y = inputs_and_targets(batch, self.name)
        check_batch((x, y), 1, "batch (inputs and targets)", self.slice.size)
        given = state.packed if self.packed else state
        if self._parts is not None:  # the check, then the update: it fails before donating
            grads, value = fns["grads"](given, x, y)
            new = fns["update"](given, grads, value)
        else:
            new, value = fns["step"](given, x, y)
        return (PackedState(new, fns["layout"], fns["unpack"]) if self.packed else new), value

    def evaluate(self, state: TrainState | PackedState, batch) -> Any:
        """The mean loss of ``batch`` under ``state``'s parameters, with no update (an eval
        step): a future at once, the value of ``model_loss(stages, loss)`` under ``jax.jit``.
        ``state`` is read, not consumed: a ``step`` may take it next. ``batch``: ``(inputs,
        targets)`` with a leading batch axis divisible by the slice's devices (trace name
        ``{name}.eval``)."""
        check_whole(batch, "spmd.evaluate")
        fns = self._functions()
        state = self._check(_current(state))
        x, y = inputs_and_targets(batch, self.name)
        check_batch((x, y), 1, "batch (inputs and targets)", self.slice.size)
        if isinstance(state, PackedState):
            return fns["evaluate_packed"](state.packed, x, y)
        return fns["evaluate"](state.params, x, y)

    def _check(self, state):
        if isinstance(state, PackedState):
            if state.layout != self.layout:
                raise ValueError(
                    f"this packed state does not fit this trainer: it holds "
                    f"{state.layout.describe()}, {self!r} takes "
                    + (self.layout.describe() if self.packed else "a TrainState")
                    + ". Maybe you want pw.train.fetch(state), the TrainState of its values, "
                    "or the state this trainer's init() returned.")
        elif self.packed and isinstance(state, TrainState):
            why = self.layout.misfit(state)
            if why is not None:
                raise ValueError(f"this TrainState is not one of {self!r}'s: {why}. Maybe "
                                 "you want the state this trainer's init() returned.")
        elif not isinstance(state, TrainState):
            restored = from_mapping(  # (orbax's restore without a target: restored.py)
                state, StateShapes(self.stages, self.optimizer).expected)
            if restored is not None:
                return self._check(restored)
            raise not_a_state(state, "step", "the state that init() or step() returned (or a "
                              "pw.train.TrainState)")
        return state

    def __repr__(self) -> str:
        return f"pw.train.SPMD({len(self.stages)} stages on {self.slice!r})"


def _current(state):
    """A ``PackedState`` whose unpacked ``TrainState`` was changed (a learning rate set in
    optax's ``hyperparams``, a parameter replaced) stands for that ``TrainState``: a step
    packs it into a copy, as it packs any ``TrainState`` it is given."""
    if isinstance(state, PackedState) and state.edited():
        return state.unpacked()
    return state


def check_finite_runs(check_finite: bool, slices: Sequence[VirtualSlice], trainer: str) -> None:
    """``check_finite=True`` checks the loss with a host callback (``jax.debug.callback``):
    refused at once on an island whose functions cannot call back into Python (Ray's), with
    what to do instead; before, the first step failed saying its ``loss`` (or ``spmd.grads``)
    calls host callbacks, which the user's code does not."""
    if not check_finite:
        return
    for vs in slices:
        if not getattr(vs.island, "host_callbacks", True):
            raise ValueError(
                f"{trainer}(check_finite=True) checks each step's loss with a host callback "
                f"(jax.debug.callback), which island {vs.island.id} (a Ray island) cannot run: "
                "jax.export cannot serialize it. Leave check_finite off there and check the "
                "loss on the controller (np.isfinite(float(loss))), resuming from a host copy "
                "of the state (jax.device_get(pw.train.fetch(state))) taken before the step; "
                "or run the trainer on backend='local'.")

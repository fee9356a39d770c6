"""Pipelined training: a model's stages on their own slices, one training step as ONE program.

Each stage gets compiled functions on its slice (``pw.function``): a forward and a backward
(``stage.py``: ``jax.vjp``, its residuals returned as values that stay on the stage's devices),
an optimizer update, and an init. ``Pipeline.step`` is a ``@pw.program``: it cuts the batch
into M microbatches and calls every stage's forward and backward on every microbatch, in the
order of its ``schedule`` (``schedule.py``), then each stage's update. The runtime inserts the
transfers between stage slices (activations forward, cotangents back, on one island or across
two); each island's gang scheduler runs the calls.

**Why a token.** A gang scheduler launches, among the computations that are *ready*, the
earliest submitted. The order of calls alone would not make a stage run its work in the
schedule's order: in 1F1B, stage 0's second backward waits for stage 1, while its next forward
only needs the batch, so it would run first, and stage 0 would do every forward before any
backward (GPipe's memory). So each stage's calls pass a scalar token from one to the next:
a call is ready only once the call before it on that stage was launched, and each stage runs
exactly its order (``tests/train/test_train.py`` reads the order back from the trace). Each stage's
first token and the backward's flags (below) are made once per pipeline on the stage's slice
and passed to every step program as arguments (``Pipeline.constants``): no upload per step.

**On a simulated cluster** (``backend="sim"``) the same object runs the same programs: every
stage call is lowered for the simulated chips and timed by the simulator's cost model (XLA's
cost analysis on the chip's roofline), the schedule, tokens and transfers are the runtime's
own, and the trace's times are virtual. A stage of several chips runs its calls per chip
(``sharded.py``), so its backwards' gradient all-reduces, which XLA's partitioner inserts on
real chips, are timed too. Nothing is computed: the loss and the state are
futures with shapes and times only (``.result()`` raises ``pw.NoValueError``), and
``check_finite`` has nothing to check there (it is ignored).

**Memory.** A microbatch's residuals live from its forward to its backward on that stage.
Gradients are summed into one accumulator per stage, which every backward after the stage's
first donates, so the new sum takes the old one's buffer (a flag tells the first backward
there is nothing to add yet: it is given the parameters, which it does not donate), in
float32 at least (``stage.accumulation_dtype``: a bfloat16 sum of M
microbatches' gradients drifts from ``jax.grad``'s of the whole batch), cast back to the
parameters' dtype once, by the update. The updates take the parameters and optimizer state with
``donate_argnums``: the new state reuses the old one's buffers, so memory stays flat from step
to step and the state given to ``step`` is consumed (as ``jax.jit`` with ``donate_argnums``
consumes it); ``step`` does not wait for it (the runtime launches the next step's updates
behind this step's). Every update waits for the step's loss and for stage 0's last token
(a barrier of two scalars: that token depends on every call of every stage), so a failure
anywhere in the forwards or backwards fails the whole step before any update consumes
anything: the state given to the failed step is still valid.

>>> pipe = Pipeline(stages, [ctl.slice(2, island=0), ctl.slice(2, island=1)],   # doctest: +SKIP
...                 loss=cross_entropy, optimizer=optax.adam(1e-3), microbatches=4)
>>> state = pipe.init(0)                                                     # doctest: +SKIP
>>> state, loss = pipe.step(state, (tokens, targets))                        # doctest: +SKIP
>>> float(loss)                                                              # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..runtime.keywords import suggests_keywords
from ..runtime.program import BATCH, CompiledFunction, Program, function, program
from ..runtime.resources import VirtualSlice
from . import coupling, sharded
from .batches import Cutter, Microbatches, Placer, check_whole
from .restored import from_mapping
from .schedule import Kind, Schedule, call_name, order
from .spmd import check_finite_runs
from .stage import (
    Stage,
    accumulation_dtype,
    backward,
    check_trainable,
    forward,
    residual_bytes,
)
from .state import (
    PackedState,
    StateShapes,
    TrainState,
    apply_optimizer,
    check_batch,
    check_loss,
    check_optimizer,
    check_stages,
    init_stage,
    inputs_and_targets,
    not_a_state,
    raise_if_not_finite,
    ready_to_donate,
    simulated,
    stage_keys,
)
from .tied import Ties, tied_functions


@suggests_keywords("pw.train.Pipeline")
class Pipeline:
    """Train ``stages`` pipelined over ``slices`` (one slice per stage, on any islands).

    ``loss(outputs, targets) -> scalar``: the mean loss of a microbatch (the last stage's
    outputs against its targets). ``optimizer``: an optax transformation, applied per stage
    (one that looks at all parameters at once is refused, ``coupling.py``: for
    ``optax.clip_by_global_norm`` use ``pw.train.clip_by_global_norm``). ``schedule``:
    ``"gpipe"`` or ``"1f1b"`` (``pw.train.Schedule``); ``microbatches``: M, the number each
    batch is cut into.
    ``check_finite``: a loss that is NaN or infinite fails the step (``FloatingPointError``)
    before any update is applied. Each stage's slice holds its parameters replicated and its
    microbatches sharded over its devices (data parallelism inside the stage). The slices
    may be simulated (``backend="sim"``): the same steps, timed by the cost model, without
    values (see the module's doc). ``tied``: weights shared by stages, as groups of
    ``(stage, path)``, ``[[(0, "embed"), (2, "embed")]]`` (``tied.py``).

    Trace names: ``s1.fwd[m2]``, ``s1.bwd[m2]``, ``s1.update``, ``s1.init``, ``loss``; the step
    program is ``{name}.{schedule}``.
    """

    def __init__(self, stages: Sequence[Stage], slices: Sequence[VirtualSlice], *,
                 loss: Callable, optimizer: optax.GradientTransformation,
                 schedule: Schedule | str = Schedule.ONE_F_ONE_B, microbatches: int = 4,
                 check_finite: bool = False, name: str = "pipeline", tied=None):
        check_stages(stages, slices)
        check_optimizer(optimizer)
        check_loss(loss)
        check_finite_runs(check_finite, slices, "Pipeline")
        if (not isinstance(microbatches, int | np.integer) or isinstance(microbatches, bool)
                or microbatches < 1):  # (a NumPy int, say batch // per, is one too)
            raise ValueError(f"microbatches must be a positive int, got {microbatches!r}.")
        microbatches = int(microbatches)
        self.stages, self.slices = list(stages), list(slices)
        self.loss, self.optimizer = loss, optimizer
        self.schedule = Schedule.parse(schedule)
        self.microbatches, self.check_finite, self.name = microbatches, check_finite, name
        #: bytes of one microbatch's residuals per stage, for the last step's microbatch
        #: shapes (known after the first step)
        self.residual_bytes: list[int] | None = None
        self._residual_shapes = None  # the microbatch shapes residual_bytes is for
        S, M = len(self.stages), microbatches
        self._shapes = StateShapes(self.stages, optimizer)  # (what init makes)
        #: the weights tied across stages (``tied.py``), or None
        self.ties = Ties(tied, self._shapes.expected().params) if tied else None
        self._takers = self.ties.takers(self.slices) if self.ties else [None] * S
        self._fwd, self._bwd, self._update, self._init = [], [], [], []
        self._norm_fns = []
        for s, (st, vs) in enumerate(zip(self.stages, self.slices, strict=True)):
            last = s == S - 1
            head = loss if last else None
            out_spec = P() if last else BATCH
            # a simulated stage of several chips writes out its all-reduces (``sharded.py``)
            many = simulated(vs) and vs.size > 1
            fwd = (sharded.forward(st.apply, head, s > 0, vs.axis_names, vs.size) if many
                   else forward(st.apply, head, s > 0))
            self._fwd.append(function(
                fwd, slice=vs, in_specs=(None, BATCH, BATCH, None),
                out_specs=(out_spec, None, P()), name=call_name(s, Kind.FWD)))
            bwd = (sharded.backward(st.apply, head, s > 0, 1.0 / M, vs.axis_names, vs.size)
                   if many else backward(st.apply, head, s > 0, 1.0 / M))
            specs = dict(slice=vs, in_specs=(None, BATCH, BATCH, None, BATCH, None, None, None),
                         out_specs=(P(), BATCH, P()), name=call_name(s, Kind.BWD))
            # the first backward's accumulator is the parameters (the state's, never donated);
            # the later ones donate the running sum, the step's own, so it is updated in place
            self._bwd.append((function(bwd, **specs),
                              function(bwd, donate_argnums=_ACC, **specs)))
            update, norm, init = tied_functions(self.ties, s, _update(optimizer), _squared_norm,
                                            st.init)
            self._update.append(function(
                update, slice=vs, out_specs=P(), donate_argnums=(0, 1),
                name=call_name(s, Kind.UPDATE)))
            self._init.append(function(init_stage(init, optimizer, s), slice=vs,
                                       out_specs=P(), name=f"s{s}.init"))
            self._norm_fns.append(norm)
        self._mean = function(
            _mean_loss(M, check_finite and not simulated(self.slices[-1])),
            slice=self.slices[-1], out_specs=P(), name="loss")
        self._named: dict[tuple[int, Kind, int, bool], CompiledFunction] = {}
        self._norms: dict[int, CompiledFunction] = {}
        self._programs: dict[Schedule, Program] = {}
        self._init_program = program(self._init_all, name=f"{name}.init")
        self._consts: list[tuple[Any, Any, Any]] | None = None
        self._placers: tuple[Placer, Placer] | None = None
        self._cutters: tuple[Cutter, ...] | None = None
        self._eval: Program | None = None

    # --- the public surface ----------------------------------------------------------------
    def init(self, key) -> TrainState:
        """Each stage's parameters and optimizer state, made on its slice (futures):
        ``stage.init`` with one key per stage split from ``key`` (an int seed or a key)."""
        keys = stage_keys(key, len(self.stages))
        return self._init_program([keys[s] for s in range(len(self.stages))])

    def place(self, batch) -> Microbatches:
        """``batch = (inputs, targets)`` cut into microbatches and put on the stages that read
        them (inputs on the first stage's slice, targets on the last's, sharded over each
        slice's devices), ahead of ``step``: what a data loader would do. On simulated
        slices the microbatches are futures, uploaded on the virtual clock (``Placer``)."""
        xs, ys = self._split(batch)
        if self._placers is None:
            self._placers = (Placer(self.slices[0], "a microbatch"),
                             Placer(self.slices[-1], "a microbatch"))
        put_x, put_y = self._placers
        return Microbatches((list(put_x(list(xs))), list(put_y(list(ys)))))

    def step(self, state: TrainState, batch, schedule: Schedule | str | None = None,
             dispatch: str | None = None) -> tuple[TrainState, Any]:
        """One training step as one program: returns ``(new_state, loss)`` as futures at once
        (the mean loss over the batch's examples). ``state`` is consumed (donated); keep the
        returned one. ``batch``: ``(inputs, targets)`` with a leading batch axis, or
        ``place(batch)``. ``schedule``: this step's schedule instead of the pipeline's;
        ``dispatch``: ``"parallel"`` or ``"sequential"`` for this step (default: the
        controller's). Under parallel dispatch the runtime launches a step's calls ahead of
        their data, and a launched call's outputs count in ``ctl.memory()`` at once, so
        1F1B's smaller set of live residuals shows in the trace, not in ``ctl.memory()``;
        under sequential dispatch it shows in both (docs/training.md)."""
        state = _train_state(state, "step", expected=self._shapes.expected)
        if isinstance(batch, Microbatches):
            xs, ys = batch
            _check_even(xs, ys, self.microbatches)
        else:
            xs, ys = self._split(batch)
        ready_to_donate(state)
        run = self.program(self.schedule if schedule is None else schedule)
        out = run(list(state.params), list(state.opt_state), list(xs), list(ys),
                  self.constants(), dispatch=dispatch)  # (its trace checks the state first)
        shapes = _struct((xs[0], ys[0]))
        if shapes != self._residual_shapes:  # (first step, or a batch of another shape)
            self.residual_bytes = self._residual_bytes(state.params, xs[0], ys[0])
            self._residual_shapes = shapes
        return out

    def evaluate(self, state: TrainState, batch) -> Any:
        """The mean loss of ``batch`` under ``state``'s parameters, with no update (an eval
        step): one program (``{name}.eval``) of each stage's forward on its slice, the batch
        whole (not cut into microbatches), then the loss on the last; a future at once, the
        value of ``model_loss(stages, loss)`` under ``jax.jit``. ``state`` is read, not
        consumed: a ``step`` may take it next. The batch's leading axis divides over every
        stage's devices."""
        state = _train_state(state, "evaluate", consumed=False,
                             expected=self._shapes.expected)
        check_whole(batch, "pipe.evaluate")
        x, y = inputs_and_targets(batch, "pipe")
        check_batch((x, y), 1, "batch (inputs and targets)", [vs.size for vs in self.slices])
        if self._eval is None:
            self._eval = program(self._shapes.checking(
                _evaluation(self.stages, self.slices, self.loss), repr(self)),
                name=f"{self.name}.eval")
        return self._eval(list(state.params), x, y)

    def program(self, schedule: Schedule | str | None = None) -> Program:
        """The step's ``@pw.program`` for ``schedule``: ``(params, opt_state, xs, ys,
        constants) -> (TrainState, loss)`` over lists (one entry per stage, per microbatch;
        ``constants``: ``self.constants()``)."""
        schedule = Schedule.parse(self.schedule if schedule is None else schedule)
        prog = self._programs.get(schedule)
        if prog is None:
            def step(params, opt_state, xs, ys, constants, _schedule=schedule):
                return self._trace_step(_schedule, params, opt_state, xs, ys, constants)
            prog = self._programs[schedule] = program(
                step, name=f"{self.name}.{schedule.value}")
        return prog

    def constants(self) -> list[tuple[Any, Any, Any]]:
        """Per stage, on its slice: its first token (``int32`` 0) and the backward's flags
        (``True``: the step's first backward, nothing to add yet; ``False``), made once per
        pipeline on first use: ``jax.device_put`` there (no compile), or, on simulated slices,
        whose devices take no arrays, futures of a tiny function on each (``s1.consts``, in
        the program ``{name}.consts``)."""
        if self._consts is None:
            if any(simulated(vs) for vs in self.slices):
                made = [function(_stage_constants, slice=vs, out_specs=P(),
                                 name=f"s{s}.consts") for s, vs in enumerate(self.slices)]
                consts = program(lambda: [f() for f in made], name=f"{self.name}.consts")()
            else:
                consts = [jax.device_put(_stage_constants(), NamedSharding(vs.mesh, P()))
                          for vs in self.slices]
            self._consts = [tuple(c) for c in consts]
        return self._consts

    # --- what the step program calls -------------------------------------------------------
    def _trace_step(self, schedule: Schedule, params, opt_state, xs, ys, constants):
        S, M = len(self.stages), self.microbatches
        if len(xs) != M or len(ys) != M:
            raise ValueError(f"expected {M} microbatches, got {len(xs)} inputs and {len(ys)} "
                             "targets.")
        if len(constants) != S:
            raise ValueError(f"expected {S} stages' constants, got {len(constants)}. Maybe "
                             "you want pipe.constants().")
        self._shapes.check(repr(self), params, opt_state)
        check_trainable(params)  # (both once per traced signature)
        tokens = [c[0] for c in constants]
        first, later = [c[1] for c in constants], [c[2] for c in constants]
        acts: dict[tuple[int, int], Any] = {}   # stage s's output of microbatch m
        douts: dict[tuple[int, int], Any] = {}  # the cotangent of that output
        res: dict[tuple[int, int], Any] = {}
        grads: list[Any] = [None] * S
        losses: list[Any] = [None] * M
        for s, kind, m in order(schedule, S, M):
            x = xs[m] if s == 0 else acts[s - 1, m]
            y = ys[m] if s == S - 1 else None
            if kind is Kind.FWD:
                out, res[s, m], tokens[s] = self._call(s, kind, m)(params[s], x, y, tokens[s])
                if s == S - 1:
                    losses[m] = out
                else:
                    acts[s, m] = out
            else:
                dout = None if s == S - 1 else douts.pop((s, m))
                adds = grads[s] is not None  # (the first takes the parameters, not donated)
                acc, flag = (grads[s], later[s]) if adds else (params[s], first[s])
                grads[s], dx, tokens[s] = self._call(s, kind, m, adds)(
                    params[s], x, y, res.pop((s, m)), dout, acc, tokens[s], flag)
                if s > 0:
                    douts[s - 1, m] = dx
        loss = self._mean(losses)
        # Stage 0's last token depends on every call of every stage: each stage's calls chain
        # through its tokens and end with its last microbatch's backward, which reads the next
        # stage's. So (loss, that token) is the whole step's barrier, in two scalars.
        barrier = (loss, tokens[0])
        # a tied weight's copies' gradients, each sent to the other stages of its tie
        tied = ([(o,) if self.ties.own[s] else () for s, o in
                 enumerate(self.ties.exchange(self._takers, grads))] if self.ties else [()] * S)
        if coupling.check(self.optimizer, [_struct(p) for p in params]):
            # the whole model's gradient norm: each stage's squared norm, summed by every
            # update (pw.train.clip_by_global_norm reads it)
            barrier += ([self._squared_norm(s)(grads[s], params[s], *tied[s])
                         for s in range(S)],)
        new = [self._update[s](params[s], opt_state[s], grads[s], barrier, *tied[s])
               for s in range(S)]
        return TrainState([p for p, _ in new], [o for _, o in new]), loss

    def _call(self, stage: int, kind: Kind, microbatch: int,
              adds: bool = False) -> CompiledFunction:
        """The stage's forward or backward under its own trace name (``s1.fwd[m2]``): a copy
        of the compiled function that shares its executables, so naming costs no compile.
        ``adds``: a backward that adds to the step's running sum, which it donates."""
        key = (stage, kind, microbatch, adds)
        fn = self._named.get(key)
        if fn is None:
            base = self._fwd[stage] if kind is Kind.FWD else self._bwd[stage][adds]
            fn = self._named[key] = copy.copy(base)
            fn.name = call_name(stage, kind, microbatch)
        return fn

    def _squared_norm(self, stage: int) -> CompiledFunction:
        fn = self._norms.get(stage)
        if fn is None:
            fn = self._norms[stage] = function(self._norm_fns[stage], slice=self.slices[stage],
                                               out_specs=P(), name=f"s{stage}.norm")
        return fn

    def _init_all(self, keys):
        made = []  # (a tied stage's init takes its owners' values: the stages before it)
        for s, (init, k) in enumerate(zip(self._init, keys, strict=True)):
            given = self.ties.from_owners(s, self._takers, [p for p, _ in made]) if (
                self.ties and self.ties.own[s]) else []
            made.append(init(k, *([given] if given else [])))
        return TrainState([p for p, _ in made], [o for _, o in made])

    def _split(self, batch) -> tuple[list, list]:
        """The batch in microbatches for the stages reading them (``Cutter``, never waits)."""
        x, y = inputs_and_targets(batch, "pipe")
        check_batch((x, y), self.microbatches, "batch (inputs and targets)",  # (one check)
                    [vs.size for vs in self.slices])
        if self._cutters is None:
            self._cutters = tuple(Cutter(vs, self.microbatches, f"{self.name}.cut")
                                  for vs in (self.slices[0], self.slices[-1]))
        return self._cutters[0](x), self._cutters[1](y)

    def _residual_bytes(self, params, x, y) -> list[int]:
        out, h = [], _struct(x)
        for s, st in enumerate(self.stages):
            last = s == len(self.stages) - 1
            p = _struct(params[s])
            out.append(residual_bytes(st.apply, self.loss if last else None, s > 0, p, h,
                                      _struct(y) if last else None))
            if not last:
                h = jax.eval_shape(st.apply, p, h)
        return out

    def __repr__(self) -> str:
        return (f"pw.train.Pipeline({len(self.stages)} stages, schedule={self.schedule.value!r}"
                f", microbatches={self.microbatches})")


#: the backward's argument that is the running gradient sum (``stage.backward``'s ``acc``)
_ACC = 5


def _train_state(state, what: str, consumed: bool = True,
                 expected: Callable[[], TrainState] | None = None) -> TrainState:
    """``state`` as a ``TrainState``: a packed ``SPMD``'s ``PackedState`` is unpacked afresh
    for a step (or, edited, read as its edited ``TrainState``), so the step consumes none of
    it, as an ``SPMD`` takes a ``Pipeline``'s state without consuming it; a mapping of
    ``params`` and ``opt_state`` (orbax's restore without a target) in ``expected()``'s
    containers (``restored.py``)."""
    if isinstance(state, PackedState):
        fresh = consumed and not state.edited()
        return state.unpacked(fresh=fresh)
    if not isinstance(state, TrainState) and expected is not None:
        state = from_mapping(state, expected) or state
    if not isinstance(state, TrainState):
        raise not_a_state(state, what, "the pw.train.TrainState that init() or step() "
                          "returned (or an SPMD's state)")
    return state


def _check_even(xs, ys, microbatches: int) -> None:
    """Microbatches given whole (``Microbatches``, made by hand) are ``microbatches`` of one
    size: the step weighs each microbatch's mean loss (and its gradients) by 1/M, which is
    the batch's mean only when every microbatch has as many examples."""
    if len(xs) != microbatches or len(ys) != microbatches:
        raise ValueError(f"expected {microbatches} microbatches, got {len(xs)} inputs and "
                         f"{len(ys)} targets. Maybe you want pipe.place((x, y)).")
    sizes = [sorted({_rows(leaf) for leaf in jax.tree_util.tree_leaves((x, y))}, key=str)
             for x, y in zip(xs, ys, strict=True)]
    if any(len(s) != 1 for s in sizes) or len({s[0] for s in sizes}) != 1:
        raise ValueError(
            f"the microbatches must all have one leading (batch) size, in inputs and targets "
            f"alike: the step's loss is the mean of their {microbatches} mean losses, the "
            f"batch's mean only when each holds as many examples. Got sizes {sizes} (per "
            "microbatch). Maybe you want pipe.place((x, y)), which cuts a batch evenly (and "
            "says what size fits).")


def _rows(leaf) -> int | None:
    shape = np.shape(leaf)  # (a future's own: nothing is fetched)
    return shape[0] if shape else None


def _evaluation(stages: Sequence[Stage], slices: Sequence[VirtualSlice], loss: Callable):
    """``(params, x, y) -> loss``: each stage's forward on its slice (``s1.eval``), the loss
    on the last (``Pipeline.evaluate``'s program)."""
    last = len(stages) - 1
    calls = [function(stages[s].apply, slice=slices[s], in_specs=(None, BATCH),
                      out_specs=BATCH, name=f"s{s}.eval") for s in range(last)]
    def head(p, h, y):
        return loss(stages[last].apply(p, h), y)
    if simulated(slices[last]) and slices[last].size > 1:  # (its loss's all-reduce written out)
        head = sharded.mean_loss(head, slices[last].axis_names)
    calls.append(function(head, slice=slices[last], in_specs=(None, BATCH, BATCH), out_specs=P(),
                          name=f"s{last}.eval"))

    def evaluate(params, x, y):
        for s, call in enumerate(calls[:-1]):
            x = call(params[s], x)
        return calls[-1](params[last], x, y)
    return evaluate


def _update(optimizer):
    def update(params, opt_state, grads, barrier):
        # the barrier orders the update after the whole step (see the module's doc); its
        # first half is the step's loss, optax's ``value=`` (``reduce_on_plateau`` reads it).
        # The gradients were summed in float32 at least (``accumulation_dtype``): cast back
        # once, so the optimizer sees the parameters' dtype, as under ``jax.grad``.
        grads = jax.tree.map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)
        # its third part, when there: each stage's squared gradient norm (``coupling.py``)
        norm = jnp.sqrt(sum(barrier[2])) if len(barrier) > 2 else None
        return apply_optimizer(optimizer, params, opt_state, grads, barrier[0], norm)
    return update


def _squared_norm(grads, params):
    """The stage's squared gradient norm (float32), its gradients in the parameters' dtype,
    as the update and ``jax.grad`` have them."""
    return sum((jnp.sum(jnp.square(g.astype(jnp.result_type(p)).astype(jnp.float32)))
                for g, p in zip(jax.tree_util.tree_leaves(grads),
                                jax.tree_util.tree_leaves(params), strict=True)),
               jnp.float32(0))


def _mean_loss(microbatches: int, check_finite: bool):
    def mean(losses):  # (summed in float32 at least, as the gradients are: see ``_update``)
        dtype = jnp.result_type(losses[0])
        wide = [jnp.asarray(v).astype(accumulation_dtype(dtype)) for v in losses]
        value = (sum(wide[1:], wide[0]) / microbatches).astype(dtype)
        if check_finite:
            jax.debug.callback(raise_if_not_finite, value)
        return value
    return mean


def _stage_constants():
    """A stage's first token and its backward's two flags (``Pipeline.constants``)."""
    return np.int32(0), np.bool_(True), np.bool_(False)


def _struct(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        np.shape(a), a.dtype if hasattr(a, "dtype") else np.result_type(a)), tree)

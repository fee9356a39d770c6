"""What a training step carries from one step to the next, and the pieces every trainer shares.

``TrainState`` holds, per stage, the parameters and the optimizer state (a list with one
entry per stage, also for SPMD training, so that a pipeline and SPMD training of the same
model have states of the same shape). Its leaves are ``pw.Future``s while a step runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from ..runtime.errors import ControllerClosedError
from ..runtime.objects import Future
from ..runtime.resources import VirtualSlice
from .coupling import KEYWORD, GlobalNorm, init_optimizer, takes_keyword
from .keys import distinct_stage_keys, stage_key_struct, stage_keys  # noqa: F401 (re-exported)
from .restored import hint


class TrainState(NamedTuple):
    """Per stage: ``params[s]`` and ``opt_state[s]`` (pytrees; futures while a step runs)."""

    params: list[Any]
    opt_state: list[Any]


class PackedState:
    """A ``TrainState`` as ``SPMD(..., packed=True)`` carries it from step to step: a few flat
    arrays (one per dtype; ``packed.py``) instead of a future per leaf. ``params``,
    ``opt_state``, indexing and unpacking (``params, opt_state = state``) give the
    ``TrainState``'s futures, made by one unpacking call on the slice the first time they are
    asked for; ``fetch(state)`` gives its values and ``wait(state)`` waits without unpacking.
    ``futures`` are the packs. What is changed in the unpacked ``TrainState`` (say, optax's
    ``opt_state.hyperparams["learning_rate"]``) is what the next ``step`` and ``evaluate``
    read (``edited``)."""

    __slots__ = ("packed", "layout", "_unpack", "_state", "_given")

    def __init__(self, packed, layout, unpack):
        self.packed, self.layout, self._unpack = packed, layout, unpack
        self._state: TrainState | None = None
        self._given: list[Any] = []  # the unpacked state's leaves, as unpacking made them

    @property
    def futures(self) -> list[Any]:
        return jax.tree_util.tree_leaves(self.packed)

    def unpacked(self, fresh: bool = False) -> TrainState:
        """The ``TrainState`` (futures; the same ones on every call). ``fresh``: a new one,
        unpacked again from the packs (another call on the slice), that a step may consume
        (donate) without touching this state's."""
        if fresh:
            return self._unpack(self.packed)
        if self._state is None:
            self._state = self._unpack(self.packed)
            self._given = jax.tree_util.tree_leaves(self._state)
        return self._state

    def edited(self) -> bool:
        """Whether a leaf of the unpacked ``TrainState`` was replaced since unpacking (its
        lists and dicts are the user's to change): the packs no longer hold the state."""
        if self._state is None:
            return False
        now = jax.tree_util.tree_leaves(self._state)
        return len(now) != len(self._given) or any(
            a is not b for a, b in zip(now, self._given, strict=True))

    @property
    def params(self) -> list[Any]:
        return self.unpacked().params

    @property
    def opt_state(self) -> list[Any]:
        return self.unpacked().opt_state

    def __iter__(self):
        return iter(self.unpacked())

    def __getitem__(self, i):
        return self.unpacked()[i]

    def __len__(self) -> int:
        return 2

    def __reduce__(self):
        """Pickled (and ``copy.deepcopy``'d) as its ``TrainState`` of values, as a future
        pickles as its array: a checkpoint that a packed trainer's ``step`` packs into a copy."""
        return TrainState, tuple(fetch(self))

    def __copy__(self) -> PackedState:
        return PackedState(self.packed, self.layout, self._unpack)

    def __array__(self, dtype=None, copy=None):
        """No array: before, ``np.asarray`` failed on "an inhomogeneous shape" and
        ``jax.device_get`` (which asks for this) returned the live state itself."""
        raise TypeError("a PackedState is a whole training state (per stage, parameters and "
                        "optimizer state, packed), not an array. Its values: "
                        "pw.train.fetch(state); host copies (a checkpoint): "
                        "jax.device_get(pw.train.fetch(state)).")

    def block_until_ready(self) -> PackedState:
        """Waits for the packs (``jax.block_until_ready(state)``, as for a future)."""
        wait(self.packed)
        return self

    def __repr__(self) -> str:
        return f"PackedState({self.layout.describe()})"


def _expand(tree) -> list[Any]:
    """``tree``'s leaves, a ``PackedState`` standing for its packs."""
    leaves = jax.tree_util.tree_leaves(tree)  # (a PackedState is no pytree node: a leaf)
    if not any(type(leaf) is PackedState for leaf in leaves):
        return leaves
    out: list[Any] = []
    for leaf in leaves:
        if type(leaf) is PackedState:
            out.extend(leaf.futures)
        else:
            out.append(leaf)
    return out


def init_stage(init, optimizer: optax.GradientTransformation, stage: int | None = None):
    """``key -> (params, opt_state)`` for one stage (``stage``: its index, for errors; more
    arguments go to ``init``: a tied stage's owners' values, ``tied.py``)."""
    def init_both(key, *given):
        params = init(key, *given)
        return params, distinct_stage_keys(init_optimizer(optimizer, params, stage), stage)
    return init_both


class StateShapes:
    """The shapes of the ``TrainState`` that a trainer's ``init`` makes for ``stages``
    (``jax.eval_shape`` of each stage's init and its optimizer state, at the first check: in
    a trace, once per signature), and the check that a state, or an eval step's parameters,
    has them: this trainer's stages, and per stage the same leaves (paths and shapes), or the
    error that says where it differs. Another model's state (more stages, another width,
    another optimizer's state) failed deep inside a stage's trace ("sub got incompatible
    shapes", "zip() argument 2 is longer") or, where the shapes happened to fit, trained on
    (or evaluated) silently with the wrong stages or optimizer state. Only paths and shapes
    are compared: a checkpoint restored as plain dicts, or a learning rate set as a Python
    float in optax's ``hyperparams``, fits as under ``jax.jit``."""

    def __init__(self, stages: Sequence, optimizer: optax.GradientTransformation):
        self._stages, self._optimizer = list(stages), optimizer
        self._made: TrainState | None = None

    def expected(self) -> TrainState:
        if self._made is None:
            key = stage_key_struct()  # (a raw key, as stage_keys makes)
            made = [jax.eval_shape(init_stage(st.init, self._optimizer, s), key)
                    for s, st in enumerate(self._stages)]
            self._made = TrainState([p for p, _ in made], [o for _, o in made])
        return self._made

    def check(self, trainer: str, params, opt_state=None) -> None:
        """``params`` (and ``opt_state``, unless None: an eval step reads no optimizer
        state) are those ``init`` makes, or a ``ValueError`` naming ``trainer``."""
        expected = self.expected()
        n = len(expected.params)
        if len(params) != n or (opt_state is not None and len(opt_state) != n):
            held = f"{len(params)} stages' parameters" + (
                "" if opt_state is None else f" and {len(opt_state)} stages' optimizer states")
            raise ValueError(
                f"this state does not fit {trainer}: it holds {held}, the trainer has {n} "
                "stages. Maybe you want the state this trainer's init() returned (or a "
                "checkpoint of a trainer of the same stages).")
        for s in range(n):
            _check_part(s, "parameters hold", params[s], expected.params[s], trainer)
            if opt_state is not None:
                _check_part(s, "optimizer state holds", opt_state[s], expected.opt_state[s],
                            trainer)

    def checking(self, fn: Callable, trainer: str) -> Callable:
        """``fn(params, *rest)`` (an eval step) that checks ``params`` first."""
        def checked(params, *rest):
            self.check(trainer, params)
            return fn(params, *rest)
        return checked


def _check_part(stage: int, part: str, got, want, trainer: str) -> None:
    why = _misfit(got, want)
    if why is not None:
        raise ValueError(
            f"this state does not fit {trainer}: stage {stage}'s {part} {why}. Maybe you want "
            "the state this trainer's init() returned (or a checkpoint of a trainer of the "
            f"same stages and optimizer).{hint(got, want)}")


def _misfit(got, want) -> str | None:
    def leaves(tree):
        return [(jax.tree_util.keystr(path) or "(the whole tree)",
                 tuple(getattr(leaf, "shape", None) or np.shape(leaf)))
                for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
    got_leaves, want_leaves = leaves(got), leaves(want)
    if [p for p, _ in got_leaves] != [p for p, _ in want_leaves]:
        def names(ls):
            shown = [p for p, _ in ls[:6]]
            return "nothing" if not ls else ", ".join(shown) + (" ..." if len(ls) > 6 else "")
        return (f"{len(got_leaves)} leaves ({names(got_leaves)}), where its init makes "
                f"{len(want_leaves)} ({names(want_leaves)})")
    for (path, shape), (_, wanted) in zip(got_leaves, want_leaves, strict=True):
        if shape != wanted:
            return f"{path} of shape {shape}, where its init makes {wanted}"
    return None


def apply_optimizer(optimizer: optax.GradientTransformation, params, opt_state, grads,
                    value=None, norm=None):
    """One optax step: ``(params, opt_state)`` after ``grads``. ``value``: the step's loss,
    given as ``value=`` to an optimizer whose ``update`` takes extra arguments (optax's
    ``GradientTransformationExtraArgs``, ``MultiSteps``), as a plain optax loop gives it:
    ``optax.contrib.reduce_on_plateau`` reads it; the others ignore it. ``norm``: the whole
    model's gradient norm, for ``pw.train.clip_by_global_norm`` (``coupling.py``)."""
    extra = {}
    if value is not None and takes_keyword(optimizer.update, "value"):
        extra["value"] = value
    if norm is not None and takes_keyword(optimizer.update, KEYWORD):
        extra[KEYWORD] = GlobalNorm(norm, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params, **extra)
    return optax.apply_updates(params, updates), opt_state


def raise_if_not_finite(loss) -> None:
    """A host check (run with ``jax.debug.callback``): a loss that is NaN or infinite fails
    the computation that checks it, and with it every update of the step, before any of them
    consumes (donates) the state it was given."""
    value = np.asarray(loss)
    if not np.all(np.isfinite(value)):
        raise FloatingPointError(
            f"the step's loss is {value.tolist()}: not finite, so this step's updates were not "
            "applied and the state it was given is still valid. Maybe you want a smaller "
            "learning rate, or to look at this batch.")


def wait(tree, timeout: float | None = None) -> Any:
    """Wait for every future in ``tree``; returns ``tree``. Raises the first failure (as
    ``Future.result`` does) or ``TimeoutError``. A ``PackedState`` is waited for as it is
    (its packs), without unpacking it."""
    for leaf in _expand(tree):
        if isinstance(leaf, Future):
            if not leaf.wait(timeout):
                raise TimeoutError(f"a training future ({leaf.name}) was not ready after "
                                   f"{timeout} s; see ctl.status().")
            if leaf.exception() is not None:
                raise leaf.exception()
            if leaf.store is not None and leaf.store.closed:  # (its value freed by the close)
                raise _closed(f"a training future ({leaf.name})")
    return tree


def ready_to_donate(state: TrainState | PackedState) -> None:
    """Refuse a state that comes from a failed step, without waiting for a running one.

    A step is submitted while the one before it still runs (as ``jax.jit`` with
    ``donate_argnums`` enqueues behind its producer): the runtime launches the donating call
    once the state it donates is computed, so the host's work for the next step (tracing
    nothing new, planning, scheduling) overlaps the device's work for this one. A state whose
    step has already failed is refused here with an error that says what to pass instead; one
    whose step fails later fails this step's futures with the same error.
    """
    futures = _expand(state)
    error = Future.first_error(futures)
    if error is None:
        return
    if any(isinstance(f, Future) and f.store is not None and f.store.closed for f in futures):
        raise _closed("this state") from error
    raise ValueError(
        f"this state comes from a step that failed ({type(error).__name__}: {error}). Pass "
        "the state that step was given instead: a Pipeline's failed step consumes none of "
        "it, and neither does SPMD(..., check_finite=True)'s when its check fails "
        "(docs/training.md, 'A failed step').") from error


def _closed(what: str) -> ControllerClosedError:
    return ControllerClosedError(
        f"{what} belongs to a closed controller: its buffers are gone. Train on from a host "
        "copy taken before (jax.device_get(pw.train.fetch(state))), on a new controller.")


def fetch(tree) -> Any:
    """``tree`` with every future replaced by its value (``jax.Array``), e.g. to compare a
    state with plain JAX's; a ``PackedState`` becomes its ``TrainState``'s. The arrays are the
    state's own buffers: the next step donates them, as it donates the state. To keep a copy
    (a checkpoint), take it to the host: ``jax.device_get(fetch(state))``."""
    def value(x):
        if isinstance(x, PackedState):
            return fetch(x.unpacked())
        return x.result() if isinstance(x, Future) else x
    return jax.tree.map(value, tree, is_leaf=lambda x: isinstance(x, PackedState))


def inputs_and_targets(batch, trainer: str) -> tuple[Any, Any]:
    """``batch`` read as ``(inputs, targets)``, or an error that says what a batch is."""
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        got = (f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, tuple | list)
               else f"a {type(batch).__name__}")
        raise TypeError(f"a batch is (inputs, targets), got {got}. Maybe you want "
                        f"{trainer}.step(state, (x, y)).")
    return batch[0], batch[1]


def check_batch(batch, microbatches: int, what: str = "batch",
                devices: int | Sequence[int] = 1) -> tuple:
    """``batch``'s leaves, tree and leading size, checked: every leaf has the same leading
    (batch) axis, divisible by ``microbatches`` x ``devices`` (a pipeline's stage slice sizes:
    x their least common multiple, each microbatch being sharded over every stage's)."""
    widths = list(dict.fromkeys(devices)) if isinstance(devices, Sequence) else [devices]
    devices = math.lcm(*widths)
    over = (f"{devices} (the least common multiple of the stages' "
            f"{', '.join(map(str, widths))} devices)" if len(widths) > 1
            else None)
    leaves, tree = jax.tree_util.tree_flatten(batch)
    if not leaves:
        raise ValueError(f"the {what} has no arrays; expected (inputs, targets).")
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
    if len(sizes) > 1:  # (inputs and targets of different batch sizes, say)
        raise ValueError(f"the arrays of the {what} must share one leading (batch) axis: one "
                         "example per row, as many rows in each; got leading sizes "
                         f"{[np.shape(x)[:1] for x in leaves]}. Maybe inputs and targets "
                         "come from different batches.")
    size = sizes.pop()
    if size == 0:  # (divisible by anything, but its mean loss is 0 / 0)
        raise ValueError(f"the {what} has no examples (leading size 0): its mean loss would "
                         "be NaN, and a step would write NaN into every parameter. Maybe "
                         "the last batch of an epoch came out empty: skip it.")
    step = microbatches * devices
    if size is None or size % step:
        if microbatches == 1:
            per = over or f"the slice's {devices} devices (it is sharded over them)"
        elif devices > 1:
            per = (f"microbatches={microbatches} x {over or f'{devices} devices per stage slice'}"
                   f" = {step} (each microbatch is sharded over a stage's devices)")
        else:
            per = f"microbatches={microbatches}"
        raise ValueError(f"the arrays of the {what} must share one leading (batch) axis "
                         f"divisible by {per}; got leading sizes "
                         f"{[np.shape(x)[:1] for x in leaves]}. Maybe you want a "
                         f"batch of {step * max(1, (size or 0) // step)} examples.")
    return leaves, tree, size


def check_stages(stages: Sequence, slices: Sequence | None = None) -> None:
    from .stage import Stage

    if isinstance(stages, Stage):  # (was Python's "'Stage' object is not iterable")
        raise TypeError("stages must be a non-empty list of pw.train.Stage(init, apply), got one "
                        "Stage. Maybe you want stages=[stage].")
    if not stages or not all(isinstance(s, Stage) for s in stages):
        modules = [s for s in stages or () if callable(getattr(s, "init", None))
                   and callable(getattr(s, "apply", None))]
        hint = (" A flax module is one as pw.train.Stage(init=lambda key: module.init(key, "
                "example_input)['params'], apply=lambda params, x: module.apply({'params': "
                "params}, x))." if modules else "")
        raise TypeError(f"stages must be a non-empty list of pw.train.Stage(init, apply), got "
                        f"{[type(s).__name__ for s in stages] if stages else stages!r}.{hint}")
    for i, stage in enumerate(stages):  # (these failed only in init's or step's trace)
        for field, call in (("init", "init(key) -> params"), ("apply", "apply(params, x) -> y")):
            fn = getattr(stage, field)
            if not callable(fn):
                raise TypeError(f"stage {i}'s {field} must be a function {call}, got "
                                f"{type(fn).__name__} {fn!r}.")
    if slices is None:
        return
    if isinstance(slices, VirtualSlice):
        raise TypeError(f"slices must be a list of VirtualSlices, one per stage ({len(stages)} "
                        f"here), got one VirtualSlice. Maybe you want slices=[ctl.slice(1) for "
                        f"_ in range({len(stages)})], or pw.train.SPMD(stages, slice, ...) to "
                        "train data-parallel on that one slice.")
    if not isinstance(slices, Sequence):  # (was "'int' object is not iterable")
        raise TypeError(f"slices must be a list of VirtualSlices, one per stage ({len(stages)} "
                        f"here), got {type(slices).__name__} {slices!r}. Maybe you want "
                        f"slices=[ctl.slice(1) for _ in range({len(stages)})].")
    if not all(isinstance(vs, VirtualSlice) for vs in slices):
        raise TypeError(f"slices must be VirtualSlices (from ctl.slice(...)), one per stage, "
                        f"got {[type(vs).__name__ for vs in slices]}.")
    for s, vs in enumerate(slices):
        if vs.controller is not slices[0].controller:
            raise ValueError(f"a pipeline's slices must be slices of one controller (a step is "
                             f"one program), but stage {s}'s is on another than stage 0's. "
                             f"Make stage {s}'s slice with stage 0's controller, "
                             "ctl.slice(1), as the others.")
    if len(slices) != len(stages):
        raise ValueError(f"a pipeline needs one slice per stage: {len(stages)} stages, "
                         f"{len(slices)} slices. Maybe you want "
                         f"slices=[ctl.slice(1) for _ in range({len(stages)})].")


def check_slice(vs) -> None:
    """SPMD's ``slice`` is one ``VirtualSlice`` (a list is a pipeline's)."""
    if not isinstance(vs, VirtualSlice):
        hint = (" Maybe you want pw.train.Pipeline(stages, slices, ...) for a slice per stage, "
                "or one of them." if isinstance(vs, list | tuple) else
                " Maybe you want pw.train.SPMD(stages, ctl.slice(4), ...).")
        raise TypeError(f"SPMD trains on one slice (a VirtualSlice from ctl.slice(...)), got "
                        f"{type(vs).__name__}.{hint}")


def check_optimizer(optimizer) -> None:
    """``optimizer`` is an optax transformation (``init`` and ``update``), not the function
    that makes one: before, ``optimizer=optax.adam`` failed only in ``init``'s trace."""
    if callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
        return
    name = getattr(optimizer, "__name__", None)
    module = getattr(optimizer, "__module__", "") or ""
    hint = ""
    if callable(optimizer) and name:
        where = "optax." if module.split(".")[0] == "optax" else ""
        hint = f" Maybe you want {where}{name}(...) (called: {where}{name}(1e-3), say)."
    got = f"the function {name}" if callable(optimizer) and name else repr(optimizer)
    raise TypeError(f"optimizer must be an optax GradientTransformation (with init and "
                    f"update), got {got}.{hint}")


def check_loss(loss) -> None:
    """``loss`` is a function: before, ``loss=None`` failed only in the step's trace (in a
    pipeline, as JAX's float0 error from the backward pass)."""
    if not callable(loss):
        raise TypeError(f"loss must be a function loss(outputs, targets) -> a scalar, got "
                        f"{type(loss).__name__} {loss!r}; e.g. loss=lambda y, t: "
                        "jnp.mean((y - t) ** 2).")


def not_a_state(state, what: str, takes: str) -> TypeError:
    """The error for a ``state`` that is not a ``pw.train`` state, naming its full type (a
    flax ``TrainState`` and ``pw.train.TrainState`` share a name) and what to pass."""
    kind = type(state)
    full = f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
    if isinstance(state, tuple) and len(state) == 2 and not hasattr(state, "_fields"):
        hint = " Maybe you want pw.train.TrainState(*state): (params, opt_state), per stage."
    elif hasattr(state, "params") and hasattr(state, "opt_state"):
        hint = (" pw.train's state is pw.train.TrainState(params=[...], opt_state=[...]), "
                "one entry per stage, as init() makes it; a flax TrainState is for a step you "
                "write yourself, which pw.function(step, slice=...) takes as jax.jit does.")
    else:
        hint = ""
    return TypeError(f"{what} takes {takes}, got {full}.{hint}")


def simulated(vs: VirtualSlice) -> bool:
    """The slice is on a simulated cluster (``backend="sim"``): its devices hold no arrays,
    functions placed there are lowered for the cost model and never run."""
    return bool(getattr(vs.island, "simulated", False))

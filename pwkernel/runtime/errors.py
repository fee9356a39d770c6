"""The error types users catch. Each subclasses a built-in so plain ``except`` clauses work."""

from __future__ import annotations

import concurrent.futures
import math
import numbers
import re
import threading
from types import TracebackType


class PathwaysError(Exception):
    """Base class of every error pwkernel raises on purpose."""


class SliceError(PathwaysError, ValueError):
    """A virtual slice was asked for that cannot exist, or a released slice was used."""


class SpecError(PathwaysError, ValueError):
    """A PartitionSpec or array shape does not fit the slice's mesh."""


class ProgramError(PathwaysError, TypeError):
    """A program or compiled function was called or traced in a way it cannot handle."""


class ControllerClosedError(PathwaysError, RuntimeError):
    """The controller was closed; its slices, functions and futures can no longer be used."""


class MemoryBudgetError(PathwaysError, MemoryError):
    """A single computation needs more device memory than the controller's budget allows."""


class MemoryWaitWarning(UserWarning):
    """A computation waits for device memory that only your own futures hold, with nothing
    running that could free it: it goes on once you drop them (``del fut``). A
    ``UserWarning``, so it shows by default; said once per wait."""


class DeviceSetupError(PathwaysError, RuntimeError):
    """JAX's devices cannot be arranged into the requested islands."""


class CancelledError(PathwaysError, RuntimeError, concurrent.futures.CancelledError):
    """A computation was cancelled (by the user, an interrupt or a timeout) before it ran.
    Also a ``concurrent.futures.CancelledError``, which code written for those futures
    catches."""


class IslandLostError(PathwaysError, RuntimeError):
    """An island's process died (Ray backend): its buffers are gone, and computations that
    needed them fail. ``ctl.reattach(island)`` starts a replacement."""


class NoValueError(PathwaysError, RuntimeError):
    """A future of a simulated controller (``backend="sim"``) was asked for its value: a
    simulation knows shapes, dtypes, shardings and times, and computes nothing."""


class NeedsValueError(ProgramError):
    """Python asked for the value of something a program has not computed yet, while the
    program was traced (``float(v)``, ``if v:``): a ``%%pathways`` cell runs that statement
    as plain Python instead."""


_RETYPED: dict[tuple[type, type], type] = {}


def retyped(err: PathwaysError, base: type[BaseException]) -> PathwaysError:
    """``err``, made also an instance of ``base``: the type of the error it stands for, so
    that an ``except`` clause written for plain JAX (``except ValueError``) still catches it.
    ``err`` itself where ``base`` already is one of its types, is not an ``Exception``, or
    cannot be combined with it (built-ins with their own instance layout, e.g. ``OSError``)."""
    cls = type(err)
    if issubclass(cls, base) or not issubclass(base, Exception):
        return err
    both = _RETYPED.get((cls, base))
    if both is None:
        try:
            both = type(cls.__name__, (cls, base), {
                "__init__": _plain_init, "__str__": BaseException.__str__,
                "__reduce__": _reduce_as_own, "__module__": cls.__module__,
                "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
        except TypeError:
            both = cls
        _RETYPED[cls, base] = both
    return err if both is cls else both(*err.args)


def _plain_init(self, *args):
    # The combined type takes a message, whatever ``base``'s own constructor takes.
    BaseException.__init__(self, *args)


def _reduce_as_own(self):
    # Pickled (e.g. across Ray) as the pwkernel error alone: the combined type is made here.
    return type(self).__mro__[1], self.args


def launch_error(e: BaseException, name: str) -> BaseException:
    """What a compiled call of ``name`` raised, as ``jax.jit`` raises it: JAX's internal NaN/Inf
    check error (``jax_debug_nans``/``jax_debug_infs``, which only ``jax.jit``'s own path turns
    into a ``FloatingPointError``) becomes that; anything else is itself."""
    if type(e).__name__ != "InternalFloatingPointError":
        return e
    return FloatingPointError(
        f"invalid value ({getattr(e, 'ty', 'nan')}) encountered in {name} (jax_debug_nans / "
        "jax_debug_infs is on). To find the operation, call the function with "
        "jax.disable_jit() on the same inputs.")


def deleted_input(what: str, shape: str = "") -> PathwaysError:
    """What reading a buffer an earlier donating call consumed raises, on every backend: a
    ``ProgramError`` that is also the ``RuntimeError`` ("Array has been deleted") ``jax.jit``
    raises; ``what`` says which value and who has it, ``shape`` its type (``float32[4]``)."""
    return retyped(ProgramError(
        f"Array has been deleted{f' with shape={shape}' if shape else ''}: {what}. Use that "
        "call's result, or pass each donating call its own copy (jnp.copy(x))."), RuntimeError)


def freed_by_close() -> ControllerClosedError:
    """What ``fut.result()`` raises once the future's controller was closed (its buffer freed)."""
    return ControllerClosedError(
        "this future belongs to a closed controller and its buffer was freed; "
        "keep the value (fut.result()) before ctl.close(), or rerun the program.")


def copy_error(name: str, source, error: BaseException) -> BaseException:
    """What copy ``name`` that could not start fails with: a source array that is gone (the
    user deleted it, or a donating call consumed it) says so as a computation's input does
    (``deleted_input``), not with JAX's bare "Array has been deleted"; else ``error``."""
    is_deleted = getattr(source, "is_deleted", None)
    if is_deleted is None or not is_deleted():
        return error
    return deleted_input(f"the copy {name} was given an array that an earlier call that "
                         "donates it now owns (or that was deleted)", source.aval.str_short())


def donated_and_read(name: str, i: int, j: int | None = None, names=()) -> PathwaysError:
    """What a call of ``name`` that donates its input ``i`` and also reads it (as its input
    ``j``) raises; ``names``: the inputs' places in the call's arguments, where known."""
    other = "another input" if j is None else f"input {j}"
    where = ""
    if j is not None and names:
        where = f" (one array at {names[i]} and at {names[j]})"
        if _root(names[i]) == _root(names[j]):
            where = (f"{where[:-1]}: a tree that holds one array twice, as "
                     "optax.LookaheadParams.init_synced makes, is donated as "
                     "jax.tree.map(jnp.copy, tree))")
    return retyped(ProgramError(
        f"{name} donates input {i} and also reads the same array as {other}{where}: a "
        "computation cannot be given a buffer it still reads. Pass a copy (jnp.copy(x)) as "
        "one of them, or donate neither."), RuntimeError)


def _root(name: str) -> str:
    """The argument a leaf's name (``p.fast['w']``) belongs to (``p``)."""
    return re.split(r"[.\[]", name, maxsplit=1)[0]


def donated_and_read_in(name: str, inputs: list, donated, kind: type | None = None,
                        names=tuple):
    """``donated_and_read`` for the first donated input (of type ``kind``, if given) that is
    also another of ``inputs`` (the same object), else None. One pass in C over the inputs'
    ids; the donated ones are looked at only if some input repeats (a state of many leaves
    must not cost a comparison per pair). ``names``: a function giving the inputs' places, for
    the error (called only then: reading them costs a pass over the leaves)."""
    if not donated:
        return None
    ids = list(map(id, inputs))
    if len(set(ids)) == len(ids):
        return None
    for i in donated:
        if ids.count(ids[i]) > 1 and (kind is None or isinstance(inputs[i], kind)):
            j = next(k for k, other in enumerate(ids) if other == ids[i] and k != i)
            return donated_and_read(name, i, j, names())
    return None


def origin(tb: TracebackType | None, module: str) -> TracebackType | None:
    """``tb`` less an earlier raise of its error by a future (the frames down to ``result()``
    or ``block_until_ready()`` in ``module``): the traceback the error came with, from which
    each raise of that one shared error starts again (else every ask added its frames)."""
    t = tb
    while t is not None:
        frame = t.tb_frame
        if frame.f_code.co_name in ("result", "block_until_ready") and frame.f_globals.get(
                "__name__") == module:
            return t.tb_next
        t = t.tb_next
    return tb


def timeout_seconds(timeout):
    """``timeout`` as a wait takes it (a future's ``result``/``wait``/``exception``, a run's,
    the controller's): a number of seconds, or None for no limit; anything else is refused
    at the call, not deep inside the wait. A negative one is 0 (``concurrent.futures``); one
    longer than a wait can take (``float('inf')``) is no limit, not an ``OverflowError``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None (no limit), got "
                        f"{type(timeout).__name__} {timeout!r}. Maybe you want timeout=5.0 "
                        f"or timeout=float(...).")
    if math.isnan(timeout):
        raise ValueError("timeout is NaN; pass a number of seconds, or None to wait without "
                         "a limit.")
    return None if timeout >= threading.TIMEOUT_MAX else timeout

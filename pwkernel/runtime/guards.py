"""JAX's transfer guards (``jax.transfer_guard("disallow")``, ``jax_transfer_guard``) as
``jax.jit`` applies them to a call, checked once in the calling thread when a program is
submitted.

``jax.jit`` moves a host argument (a NumPy array, a Python scalar) onto its devices, and an
uncommitted ``jax.Array`` onto its mesh, by implicit transfers: refused under ``"disallow"``
and ``"disallow_explicit"``, logged under ``"log"`` and ``"log_explicit"``. The runtime makes
these moves with ``jax.device_put`` (an explicit transfer, which ``"disallow"`` lets through),
and in whichever thread starts them (a sequential dispatcher's, a watcher's), where the
caller's ``with jax.transfer_guard(...)`` is not set: so the guard is read here, at the call,
as ``jax.jit`` reads it. The copies the runtime inserts between slices (and of a committed
argument onto another slice) are what ``jax.device_put`` is, explicit: refused under
``"disallow_explicit"`` at the call, never half-way through a run depending on which thread
happened to start them.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
from jax._src import config as jax_config

from .graph import Graph, TransferNode

__all__ = ["Guarded", "check", "guarded"]

_log = logging.getLogger(__name__)
_LEVELS = {"host_to_device": jax_config.transfer_guard_host_to_device,
           "device_to_device": jax_config.transfer_guard_device_to_device}
_REFUSES = {True: ("disallow", "disallow_explicit"), False: ("disallow_explicit",)}
_LOGS = {True: ("log", "log_explicit"), False: ()}  # (an explicit one: device_put logs it)


class Guarded(NamedTuple):
    """One transfer of a call that a transfer guard may refuse."""

    direction: str      # "host_to_device" or "device_to_device"
    implicit: bool      # as jax.jit's call makes it (an argument moved onto the devices)
    argument: int       # the argument leaf it moves; -1: a value the program made
    aval: str           # the value's type, as JAX's message writes it
    sharding: object    # where it goes


def guarded(graph: Graph) -> tuple[Guarded, ...]:
    """The transfers of ``graph`` a guard may refuse (made once per plan)."""
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    found = []
    for node in graph.nodes:
        if not isinstance(node, TransferNode):
            continue
        for src, out in ((node.input, node.output), *node.more):
            spec, dst = graph.values[src], graph.values[out]
            if src not in inputs and (src in graph.consts or spec.sharding == dst.sharding):
                continue  # a constant (jax.jit embeds it), or a copy on its own layout
            host = spec.sharding is None
            implicit = src in inputs and (host or spec.committed is False)
            found.append(Guarded("host_to_device" if host else "device_to_device", implicit,
                                 inputs.get(src, -1), _aval(spec), dst.sharding))
    for out in dict.fromkeys(graph.outputs):  # a host argument returned as it is: put on
        spec = graph.values[out]                # the default device, as jax.jit puts it
        if out in inputs and spec.sharding is None and graph.copies_arguments:
            found.append(Guarded("host_to_device", True, inputs[out], _aval(spec),
                                 "the default device"))
    return tuple(found)


def check(name: str, transfers: tuple[Guarded, ...]) -> None:
    """Refuse (or log) ``transfers`` as the calling thread's transfer guards say."""
    for t in transfers:
        level = _LEVELS[t.direction].value
        if level is None or level == "allow":
            continue
        what = (f"{t.direction.replace('_', '-')} transfer: aval={t.aval}, "
                f"dst_sharding={t.sharding}")
        if level in _REFUSES[t.implicit]:
            raise jax.errors.JaxRuntimeError(
                f"INVALID_ARGUMENT: Disallowed {what} ({_which(name, t)}, under "
                f"jax_transfer_guard_{t.direction}={level!r}). {_fix(t)}")
        if level in _LOGS[t.implicit]:
            _log.warning("%s (%s)", what, _which(name, t))


def _which(name: str, t: Guarded) -> str:
    if t.argument < 0:
        return f"a copy between slices in program {name}"
    return f"argument leaf {t.argument} of {name}"


def _fix(t: Guarded) -> str:
    if not t.implicit:
        return ("The runtime copies values between slices with jax.device_put (an explicit "
                "transfer): allow explicit transfers (jax.transfer_guard('disallow')), or keep "
                "the program's functions on one slice.")
    return (f"As jax.jit does, the call refuses to move it implicitly: put it there first, "
            f"jax.device_put(x, {t.sharding}), or pass a future.")


def _aval(spec) -> str:
    try:
        return repr(jax.core.ShapedArray(spec.shape, spec.dtype, weak_type=spec.weak))
    except Exception:  # noqa: BLE001 - a type ShapedArray does not take: written plainly
        return f"{spec.dtype}{list(spec.shape)}"

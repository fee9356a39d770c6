"""Meshes of simulated chips: ``abstract_mesh`` (a shape, axis names and types), and a
traced body with the concrete meshes it names made abstract, so that it lowers for simulated
chips: ``jax.shard_map(..., mesh=slice.mesh)`` and
``with_sharding_constraint(x, NamedSharding(slice.mesh, spec))`` record the slice's
``Mesh`` of ``SimDevice`` stand-ins in their equations, and lowering a ``Mesh`` asks its
devices for a backend (``device.client``), which stand-ins have none of. On the slice's
``AbstractMesh`` the same equations lower as on real chips (before, such a function was
refused as if XLA could not estimate it and asked for ``sim_cost=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.extend import core as jcore
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding

from ...runtime.resources import parse_axis_types
from .errors import SimError


def abstract_mesh(shape: int | Sequence[int] | AbstractMesh,
                  axis_names: Sequence[str] | None = None,
                  axis_types: str | AxisType | Sequence[str | AxisType] = "auto"
                  ) -> AbstractMesh:
    """An ``AbstractMesh`` of simulated chips: ``abstract_mesh((256, 8), ("data", "model"))``;
    ``axis_types`` ``"explicit"`` or ``"auto"``, once or per axis, as ``ctl.slice`` takes
    them (a slice's are explicit unless given; here auto, as ``estimate`` has always typed
    them: a ``shard_map`` whose ``in_specs`` its inputs' types do not say works there)."""
    if isinstance(shape, AbstractMesh):
        return shape
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        raise SimError(f"a mesh shape must be a positive int or a tuple of them, got {shape!r}; "
                       "e.g. mesh=(256, 8).")
    names = tuple(axis_names) if axis_names else ("x", "y", "z", "w")[:len(dims)]
    if len(names) != len(dims):
        raise SimError(f"mesh shape {dims} has {len(dims)} axes but axis_names {names} has "
                       f"{len(names)}; give one name per axis.")
    return AbstractMesh(dims, names, axis_types=parse_axis_types(dims, axis_types, None))


def abstract_meshes(closed: Any) -> Any:
    """``closed`` (a ``ClosedJaxpr``) with every concrete ``Mesh`` in its equations'
    parameters (nested jaxprs included) replaced by its ``abstract_mesh``; ``closed``
    itself when it names none."""
    jaxpr = _jaxpr(closed.jaxpr)
    return closed if jaxpr is closed.jaxpr else closed.replace(jaxpr=jaxpr)


def _jaxpr(jaxpr: Any) -> Any:
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        params = {k: _value(v) for k, v in eqn.params.items()}
        same = all(params[k] is v for k, v in eqn.params.items())
        eqns.append(eqn if same else eqn.replace(params=params))
        changed |= not same
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _value(v: Any) -> Any:
    if isinstance(v, Mesh):
        return v.abstract_mesh
    if isinstance(v, NamedSharding) and isinstance(v.mesh, Mesh):
        return NamedSharding(v.mesh.abstract_mesh, v.spec, memory_kind=v.memory_kind)
    if isinstance(v, jcore.ClosedJaxpr):
        return abstract_meshes(v)
    if isinstance(v, jcore.Jaxpr):
        return _jaxpr(v)
    if isinstance(v, tuple | list):
        out = [_value(x) for x in v]
        return v if all(a is b for a, b in zip(out, v, strict=True)) else type(v)(out)
    return v

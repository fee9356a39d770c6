"""A traced body with the concrete meshes it names made abstract, so that it lowers for
simulated chips: ``jax.shard_map(..., mesh=slice.mesh)`` and
``with_sharding_constraint(x, NamedSharding(slice.mesh, spec))`` record the slice's
``Mesh`` of ``SimDevice`` stand-ins in their equations, and lowering a ``Mesh`` asks its
devices for a backend (``device.client``), which stand-ins have none of. On the slice's
``AbstractMesh`` the same equations lower as on real chips (before, such a function was
refused as if XLA could not estimate it and asked for ``sim_cost=``).
"""

from __future__ import annotations

from typing import Any

from jax.extend import core as jcore
from jax.sharding import Mesh, NamedSharding


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

"""Where islands live. Each backend implements the executor interface (``runtime/executor.py``)
and is registered here by name with the options of ``pw.Controller`` it takes; ``pwkernel``
imports this package, so ``pw.Controller(backend="local" | "ray" | "sim")`` finds them while
the runtime imports none of them, and each backend gets only its own options.
A backend's module is imported only when a controller asks for it (Ray is heavy)."""

from __future__ import annotations

from ..runtime.executor import register_backend


def _local(islands, **options):
    from .local import LocalBackend

    return LocalBackend(islands, **options)


def _ray(islands, **options):
    from .ray import RayBackend

    return RayBackend(islands, **options)


def _sim(islands, **options):
    from .sim.executor import SimExecutor

    return SimExecutor(islands, **options)


def _ray_check(pool=None, address=None, ray_address=None, **_):
    if pool is not None:  # a pool named is written down here, or its address is given
        from .ray.attach import pool_address

        pool_address(pool, address if address is not None else ray_address)


register_backend("local", _local, {
    "dcn": "a pw.Link emulating the network between this process's islands"})
register_backend("ray", _ray, {
    "ray_address": "the Ray cluster to join: 'auto', 'host:port', or None for a local one",
    "address": "the Ray cluster to join (ray_address by a shorter name)",
    "pool": "the device pool on that cluster to attach to as one of its tenants",
    "tenant": "this controller's name in the pool",
    "weight": "this controller's share of the pool's devices"}, options_check=_ray_check)
def _sim_hint(name, hint):
    from .sim.program import hinted_seconds

    hinted_seconds(name, hint)


register_backend("sim", _sim, {
    "cluster": "the simulated cluster, e.g. pw.sim.Cluster.preset('tpu-v4', chips=2048)"},
    hint_check=_sim_hint)

"""Where islands live. Each backend implements the executor interface (``runtime/executor.py``)
and is registered here by name; ``pwkernel`` imports this package, so
``pw.Controller(backend="local" | "ray" | "sim")`` finds them while the runtime imports none
of them.
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


register_backend("local", _local)
register_backend("ray", _ray)
register_backend("sim", _sim)

"""The Ray backend: islands as Ray actors (see ``docs/ray.md``)."""

from .backend import RayBackend, RayIsland
from .dispatch import RayFuture, RemoteBuffer

__all__ = ["RayBackend", "RayFuture", "RayIsland", "RemoteBuffer"]

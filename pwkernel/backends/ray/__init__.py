"""The Ray backend: islands as Ray actors (see ``docs/ray.md``)."""

from .backend import RayBackend, RayIsland
from .island import RemoteBuffer

__all__ = ["RayBackend", "RayIsland", "RemoteBuffer"]

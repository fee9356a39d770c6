"""The local backend: islands made of the JAX devices this process sees (the default)."""

from ...runtime.resources import DEFAULT_ISLANDS, islands_from_env
from .devices import discover, request_host_devices
from .executor import LocalBackend

__all__ = ["DEFAULT_ISLANDS", "LocalBackend", "discover", "islands_from_env",
           "request_host_devices"]

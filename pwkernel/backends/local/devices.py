"""The local backend's islands: the JAX devices this process sees, grouped into islands.

On a machine without accelerators the host CPU is split into virtual devices (XLA's
host-platform device count), which must happen before JAX initializes its backend.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence

import jax

from ...runtime.errors import DeviceSetupError
from ...runtime.resources import DEFAULT_ISLANDS, Island


def _backends_initialized() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _accelerators() -> list:
    try:
        devices = jax.devices()
    except RuntimeError:
        return []
    return [d for d in devices if d.platform != "cpu"]


def request_host_devices(count: int) -> None:
    """Ask JAX for ``count`` virtual CPU devices, if its backend is not up yet."""
    if _backends_initialized() or "xla_force_host_platform_device_count" in os.environ.get(
            "XLA_FLAGS", ""):
        return  # too late, or the user chose the count: discover() checks it is enough
    jax.config.update("jax_num_cpu_devices", max(count, jax.config.jax_num_cpu_devices or 1))


def discover(islands: Sequence[int] | None) -> list[Island]:
    """Arrange the process's devices into islands.

    ``islands=None``: accelerators grouped by host (process); on CPU-only machines, the
    default (4, 4) of virtual host devices. A tuple of counts: that many devices per island,
    from the accelerators if there are any, else from the host CPU.
    """
    if islands is not None:
        sizes = tuple(int(n) for n in islands)
        if not sizes or min(sizes) < 1:
            raise DeviceSetupError(f"islands must be a tuple of positive device counts, got "
                                   f"{islands!r}; e.g. islands=(4, 4).")
        request_host_devices(sum(sizes))
    else:
        sizes = None
        request_host_devices(sum(DEFAULT_ISLANDS))
    accel = _accelerators()
    if sizes is None:
        if accel:
            by_host: dict[int, list] = defaultdict(list)
            for d in accel:
                by_host[d.process_index].append(d)
            return [Island(i, tuple(ds), ds[0].platform)
                    for i, (_, ds) in enumerate(sorted(by_host.items()))]
        sizes = DEFAULT_ISLANDS
    pool = accel or jax.devices("cpu")
    if sum(sizes) > len(pool):
        kind = accel[0].platform if accel else "cpu"
        if kind == "cpu":
            raise DeviceSetupError(
                f"islands={sizes} need {sum(sizes)} CPU devices but JAX was already "
                f"initialized with {len(pool)}. Create the controller before any JAX "
                f"operation (right after `import jax`), or start Python with "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={sum(sizes)} or "
                f"jax.config.update('jax_num_cpu_devices', {sum(sizes)}) before using JAX; "
                f"in a notebook, restart the kernel."
            )
        raise DeviceSetupError(f"islands={sizes} need {sum(sizes)} {kind} devices but this "
                               f"process sees {len(pool)}; ask for at most that many.")
    out, start = [], 0
    for i, n in enumerate(sizes):
        devs = tuple(pool[start:start + n])
        out.append(Island(i, devs, devs[0].platform))
        start += n
    return out

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
from ...runtime.sizes import sizes_problem


def _backends_initialized() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _accelerators() -> list:
    try:
        devices = jax.devices()
    except RuntimeError:
        return []
    return [d for d in devices if d.platform != "cpu"]


def _flags_count() -> bool:
    """Whether the user's ``XLA_FLAGS`` set the host platform's device count."""
    return "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")


def request_host_devices(count: int) -> None:
    """Ask JAX for ``count`` virtual CPU devices, if its backend is not up yet."""
    if _backends_initialized() or _flags_count():
        return  # too late, or the user chose the count: discover() checks it is enough
    jax.config.update("jax_num_cpu_devices", max(count, jax.config.jax_num_cpu_devices or 1))


def discover(islands: Sequence[int] | None) -> list[Island]:
    """Arrange the process's devices into islands.

    ``islands=None``: accelerators grouped by host (process); on CPU-only machines, the
    default (4, 4) of virtual host devices. A tuple of counts: that many devices per island,
    from the accelerators if there are any, else from the host CPU.
    """
    started_before = _backends_initialized()  # (else a count too small is XLA_FLAGS')
    if islands is not None:
        sizes = tuple(int(n) for n in islands)
        problem = sizes_problem(sizes)
        if problem is not None:
            raise DeviceSetupError(f"{problem}; e.g. islands=(4, 4).")
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
            raise DeviceSetupError(_too_few_cpus(sizes, len(pool), started_before))
        raise DeviceSetupError(_too_few_accelerators(sizes, len(pool), kind))
    out, start = [], 0
    for i, n in enumerate(sizes):
        devs = tuple(pool[start:start + n])
        out.append(Island(i, devs, devs[0].platform))
        start += n
    return out


def _too_few_accelerators(sizes: tuple[int, ...], have: int, kind: str) -> str:
    """Why ``sizes`` do not fit the ``have`` accelerators, and the ways out: ``islands=None``
    (pw.Controller()'s default is (4, 4), 8 devices), or the host CPU's virtual devices."""
    return (f"islands={sizes} need {sum(sizes)} {kind} devices but this process sees {have}. "
            f"Ask for at most that many: islands=None (the {kind} devices grouped by host; "
            f"pw.Controller()'s default is (4, 4)) or e.g. islands=({have},), or PWKERNEL_ISLANDS="
            f"{have} before the controller starts; or, for islands of virtual CPU devices "
            f"instead, start Python with JAX_PLATFORMS=cpu (in a notebook: restart the kernel "
            f"with it set, e.g. JAX_PLATFORMS=cpu make lab).")


def _too_few_cpus(sizes: tuple[int, ...], have: int, started_before: bool) -> str:
    """Why the host has ``have`` CPU devices, not ``sum(sizes)``, and the ways out."""
    need = sum(sizes)
    n = len(sizes)
    fit = (have // n,) * n if have >= n else (have,)
    smaller = (f"or ask for islands that fit in {have}: islands={fit} (pw.controller(islands="
               f"{fit}), or PWKERNEL_ISLANDS={','.join(map(str, fit))} before the controller "
               "starts)")
    if not started_before and _flags_count():
        return (f"islands={sizes} need {need} CPU devices but XLA_FLAGS="
                f"{os.environ['XLA_FLAGS']!r} gives JAX {have}. Set "
                f"--xla_force_host_platform_device_count={need} in XLA_FLAGS before Python "
                f"starts (in a notebook: restart the kernel), {smaller}.")
    return (f"islands={sizes} need {need} CPU devices but JAX was already initialized with "
            f"{have}. Create the controller before any JAX operation (right after "
            f"`import jax`), or start Python with XLA_FLAGS=--xla_force_host_platform_device_"
            f"count={need} or jax.config.update('jax_num_cpu_devices', {need}) before using "
            f"JAX (in a notebook: restart the kernel and put it in the first cell), {smaller}.")

"""``%pathways attach``: a new controller for the kernel, on another backend or in a pool.

``new_controller`` builds it from the magic's explicit arguments (the magic then releases
the old controller's slices and makes the new one the kernel's); with ``pool`` the new
controller is a tenant of a device pool (``pw.Controller(backend="ray", address=...,
pool=...)``, docs/pool.md), and its islands are the pool's.
"""

from __future__ import annotations

import warnings

from IPython.core.error import UsageError

from ..runtime import controller as process
from ..runtime import executor
from ..runtime.errors import PathwaysError
from ..runtime.objects import Future
from ..runtime.registry import SharedDevicesWarning
from ..runtime.resources import islands_from_env
from .scope import leaves
from .tenants import pool_of


def check(backend: str, address: str | None, preset: str | None, pool: str | None,
          tenant: str | None = None, weight: float | None = None) -> None:
    """Refuse options the backend does not take, saying which command was meant."""
    if pool is None and (tenant is not None or weight is not None):
        raise UsageError("--tenant and --weight name this kernel in a device pool; pass them "
                         "with --pool: %pathways attach ray --pool NAME --tenant alice "
                         "--weight 2.")
    if backend != "ray" and address is not None:
        raise UsageError(f"%pathways attach {backend} takes no --address; use "
                         "%pathways attach ray --address A for a Ray cluster.")
    if backend != "sim" and preset is not None:
        raise UsageError(f"%pathways attach {backend} takes no --preset; it names a "
                         "simulated machine: %pathways attach sim --preset tpu-v4.")
    if backend != "ray" and pool is not None:
        raise UsageError(f"%pathways attach {backend} takes no --pool; a device pool is "
                         "reached through Ray: %pathways attach ray --address A --pool NAME.")
    try:  # (a pool that does not exist: refused before the old controller is left)
        executor.check_options(backend, address=address, pool=pool)
    except (PathwaysError, ValueError) as e:
        raise UsageError(f"%pathways attach {backend}: {e}") from None


def leaves_first(old, backend: str, pool: str | None) -> bool:
    """Whether the old controller must close before the new one connects: one Ray
    connection per process, so a tenant of a pool and a controller elsewhere cannot share it."""
    return (old is not None and backend == "ray" and old.backend == "ray"
            and (pool is not None or pool_of(old) is not None))


def new_controller(backend: str, address: str | None, islands: tuple[int, ...] | None,
                   preset: str | None, pool: str | None, old, tenant: str | None = None,
                   weight: float | None = None) -> process.Controller:
    """The controller ``%pathways attach`` asked for (``old``: the kernel's, or None;
    ``tenant`` and ``weight``: its name and share in ``pool``)."""
    check(backend, address, preset, pool, tenant, weight)
    if backend == "sim" or pool is not None:  # a preset's machine / the pool's islands
        sizes = islands
    elif old is not None and old.backend != "sim" and pool_of(old) is None:
        sizes = islands or tuple(len(i.devices) for i in old.islands)  # the same devices
    else:  # (a simulated pod's chip counts, or a pool's islands, are not this machine's)
        sizes = islands or islands_from_env()
    options = {"pool": pool, "tenant": tenant, "weight": weight} if pool is not None else {}
    try:
        with warnings.catch_warnings():  # the old controller closes right after
            warnings.simplefilter("ignore", SharedDevicesWarning)
            return process.Controller(sizes, backend=backend, ray_address=address,
                                      cluster=(preset or "tpu-v4") if backend == "sim"
                                      else None, **options)
    except (PathwaysError, ValueError) as e:
        raise UsageError(f"%pathways attach {backend}: {e}") from None


def held_by(old, user_ns: dict, hidden=()) -> list[str]:
    """The notebook's names (not IPython's ``hidden`` ones, ``Out``) holding futures of
    ``old`` (the controller an attach closes), whose buffers go with it."""
    if old is None:
        return []
    return sorted(n for n, v in list(user_ns.items()) if not n.startswith("_")
                  and n not in hidden and any(
        isinstance(x, Future) and x.store is old.store for x in leaves(v)))


def attached_text(backend: str, address: str | None, pool: str | None, ctl,
                  lost: list[str] = ()) -> str:
    """What the magic prints once attached; ``lost``: the names that held futures of the
    old controller (before, nothing said that their values had gone with it)."""
    where = (f" to pool {pool!r}" if pool else "") + (f" at {address}" if address else "")
    note = "" if not lost else (
        f"\nnote: {', '.join(lost[:8])}{' ...' if len(lost) > 8 else ''} held futures of the "
        "old controller, closed now with their buffers; to keep values across an attach, "
        "take them first (w = w.result()) or run their cells again after it.")
    return f"attached {backend}{where}: " + ", ".join(
        f"island {i.id}: {len(i.devices)} {i.platform}" for i in ctl.islands) + note

"""How many devices a controller (local or Ray) or a device pool may be asked for, checked before
anything starts: a count past what JAX can make would otherwise fail inside JAX with its
"incompatible function arguments" text (on Ray, after a cluster started for it: a minute on a
small machine).

The bound is one of the controller's process, which makes one virtual CPU device per island
device: a local controller on the host runs programs there, a Ray one lowers them over its
own (``backend._stand_ins``), whatever the islands' platform. JAX makes a few thousand in a
second (4096: 0.6 s, 0.6 GB), a hundred thousand in minutes, and past 2**31 none at all.

>>> sizes_problem((4, 4)) is None
True
>>> sizes_problem((0,))
'islands must be positive device counts, one per island, got (0,)'
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

MAX_DEVICES = 4096  # island devices in all, for one controller or one pool


def sizes_problem(sizes: Sequence[int], named: str | None = None) -> str | None:
    """What is wrong with ``sizes`` (devices per island, already ints), or None; ``named``:
    how the user wrote them (default ``islands=(...)``)."""
    if not sizes or min(sizes) < 1:
        return f"islands must be positive device counts, one per island, got {tuple(sizes)}"
    if sum(sizes) > MAX_DEVICES:
        named = named or f"islands={tuple(sizes)}"
        return (f"{named} asks for {sum(sizes)} devices; at most {MAX_DEVICES} "
                "devices in all (a controller makes one virtual CPU device of its own per "
                "island device: a few thousand take a second, far more take minutes)")
    return None


def islands_fix(sizes: Sequence[int]) -> str:
    """How to get islands of ``sizes`` devices: a controller of one's own, or the kernel's
    process-wide one (``PWKERNEL_ISLANDS``, read when it starts; on CPU, before JAX starts).

    >>> islands_fix((4, 4))[:55]
    'pw.Controller(islands=(4, 4)), or PWKERNEL_ISLANDS=4,4 '
    """
    sizes = tuple(int(n) for n in sizes)
    return (f"pw.Controller(islands={sizes}), or PWKERNEL_ISLANDS={','.join(map(str, sizes))} "
            f"for the kernel's pw.controller() (set where Jupyter starts, or call pw.controller("
            f"islands={sizes}) first thing after restarting the kernel)")


def larger_island(size: int, islands: Sequence, ctl: object = None) -> str:
    """The fix for a slice of ``size`` devices larger than its ``islands`` (``Island``
    objects; simulated: whole hosts of its preset; a pool's tenant: a pool with islands that
    large)."""
    pod = next((isl for isl in islands if isl.simulated), None)
    if pod is not None:
        per_host = len(pod.devices) // len({getattr(d, "host", d) for d in pod.devices})
        size = -(-size // per_host) * per_host  # whole hosts
        name = getattr(getattr(getattr(ctl, "executor", None), "cluster", None), "name", None)
        name = name if isinstance(name, str) and name != "custom" else "tpu-v4"
        return (f"a simulated cluster with an island that large: its preset with islands="
                f"({size},), e.g. pw.Controller(backend='sim', cluster={name!r}, "
                f"islands=({size},))")
    return (backend_fix(ctl, [max(len(i.devices), size) for i in islands]) or f"a controller "
            f"with an island that large, e.g. {islands_fix((size,))}; on CPU that needs that "
            "many host devices")


def backend_fix(ctl: object, sizes: Sequence[int]) -> str | None:
    """How ``ctl``'s executor gets islands of ``sizes`` devices, where it has a way of its own
    (``executor.islands_fix(sizes)``: a pool's tenant has the pool's islands, so the fix is a
    pool that has them); None where it has not."""
    fix = getattr(getattr(ctl, "executor", None), "islands_fix", None)
    return fix(tuple(int(n) for n in sizes)) if callable(fix) else None


def more_islands(island: object, islands: Sequence, ctl: object = None) -> str:
    """The fix for ``island=`` past the last of ``islands`` (``Island`` objects): as many
    islands, of the devices there are; "" where none fits (simulated pods have presets)."""
    if not isinstance(island, Integral) or isinstance(island, bool) or any(
            i.simulated for i in islands):
        return ""
    want, have = int(island) + 1, sum(len(i.devices) for i in islands)
    if not len(islands) < want <= max(have, 16):
        return ""
    sizes = [len(i.devices) for i in islands]
    own = backend_fix(ctl, sizes + sizes[-1:] * (want - len(islands)))
    return (f" For {want} islands: {own}." if own else f" For {want} islands of these {have} "
            f"devices: {islands_fix((max(have // want, 1),) * want)}.")


def not_an_island_id(island: object, count: int) -> str:
    """What to say of ``island=`` that is no int (a string, a float), on ``count`` islands.

    >>> not_an_island_id("1", 2)
    "island must be an int (an island's id: 0 to 1), got str '1'. Maybe you want island=1."
    """
    try:
        fix = f" Maybe you want island={int(island)}." if 0 <= int(island) < count else ""
    except (TypeError, ValueError, OverflowError):
        fix = ""
    return (f"island must be an int (an island's id: 0 to {count - 1}), got "
            f"{type(island).__name__} {island!r}.{fix}")

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

"""A kernel shut down or restarted by its frontend closes its controllers first.

ipykernel answers a ``shutdown_request`` (the notebook's *Shut Down* or *Restart*,
``KernelManager.shutdown_kernel(now=False)`` / ``restart_kernel``) by calling the kernel's
``do_shutdown`` and then terminating every child process in its process group before the
interpreter exits. A Ray controller's local cluster (GCS, raylet, agents) is such a child:
killed under it, the ``ray.shutdown()`` of the exit hook that closes the controller waited for
the dead GCS until the frontend gave up (5 s) and killed the kernel (Ray printed its SIGTERM
stack dump), the island actors outlived it, and the cluster's session folder in /tmp stayed.
So ``do_shutdown`` closes every open controller first (newest first, as the exit hook would),
while what it started still runs; the exit hook then finds none open.
"""

from __future__ import annotations

from typing import Any

from ..runtime import registry

_ORIGINAL = "_pwkernel_do_shutdown"  # where the kernel's own do_shutdown is kept


def _kernel(ip: Any) -> Any:
    return getattr(ip, "kernel", None)  # (None in a plain IPython shell: no frontend)


def register(ip: Any) -> None:
    """Close the controllers when the kernel hosting ``ip`` is asked to shut down."""
    kernel = _kernel(ip)
    if kernel is None or hasattr(kernel, _ORIGINAL):
        return
    original = kernel.do_shutdown

    def do_shutdown(restart: bool) -> Any:
        registry.close_at_exit()  # (warns, never raises: the kernel shuts down all the same)
        return original(restart)  # (awaitable or not, as the kernel's own)

    setattr(kernel, _ORIGINAL, original)
    kernel.do_shutdown = do_shutdown


def unregister(ip: Any) -> None:
    kernel = _kernel(ip)
    if kernel is not None and hasattr(kernel, _ORIGINAL):
        kernel.do_shutdown = getattr(kernel, _ORIGINAL)
        delattr(kernel, _ORIGINAL)

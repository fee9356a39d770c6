"""A device pool: islands shared by many controllers (notebooks, scripts), gang-scheduled
together. ``python -m pwkernel.pool start|status|stop --name NAME`` (``__main__.py``) or the
functions of ``service``; controllers attach with ``pw.Controller(backend="ray",
address=ADDR, pool=NAME)``. See docs/pool.md."""

from .service import PoolError, PoolRunningError, start, status, stop

__all__ = ["PoolError", "PoolRunningError", "start", "status", "stop"]

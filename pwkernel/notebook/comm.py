"""The ``pwkernel`` comm target: how a frontend (the JupyterLab sidebar) asks for status.

Protocol (JSON, both directions):

- frontend opens a comm with target ``pwkernel`` -> kernel replies ``{"type": "status", "data":
  {...}}`` at once;
- frontend sends ``{"type": "status"}`` -> the same reply, fresh;
- anything else -> ``{"type": "error", "error": "<what was wrong and what is accepted>"}``.

``data`` is ``Controller.status()`` made JSON-safe (device ids as string keys).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TARGET = "pwkernel"
REQUESTS = ("status",)


def status_message(ctl) -> dict[str, Any]:
    """The reply to a status request, JSON-safe."""
    data = ctl.status() if not ctl.closed else {"closed": True}
    if "memory" in data:
        data["memory"] = {str(k): int(v) for k, v in data["memory"].items()}
    return {"type": "status", "data": data}


def reply(ctl, data: Any) -> dict[str, Any]:
    """The answer to one message's ``data`` from the frontend."""
    if not isinstance(data, dict) or "type" not in data:
        return {"type": "error", "error": f"expected a JSON object with a 'type' field, e.g. "
                                          f"{{'type': 'status'}}; got {data!r}."}
    if data["type"] not in REQUESTS:
        return {"type": "error", "error": f"unknown message type {data['type']!r}; this kernel "
                                          f"answers {list(REQUESTS)}."}
    return status_message(ctl)


def register(ip, get_controller: Callable[[], Any]) -> bool:
    """Register the target with the kernel's comm manager; False outside a kernel."""
    kernel = getattr(ip, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        return False

    def on_open(comm, open_msg) -> None:
        def on_msg(msg) -> None:
            comm.send(reply(get_controller(), msg["content"]["data"]))

        comm.on_msg(on_msg)
        comm.send(status_message(get_controller()))

    manager.register_target(TARGET, on_open)
    return True


def unregister(ip) -> None:
    manager = getattr(getattr(ip, "kernel", None), "comm_manager", None)
    if manager is not None:
        manager.unregister_target(TARGET, manager.targets.get(TARGET))

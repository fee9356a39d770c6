"""The ``pwkernel`` comm target: how a frontend (the JupyterLab Pathways sidebar) talks to the
controller in this kernel. It is the only channel the sidebar uses: no ports, no server polling.

Protocol (JSON objects, both directions; every request may carry an ``"id"`` (int or str) that
the reply echoes, so a frontend can match replies to requests):

==============================================  ==================================================
frontend sends                                  kernel replies
==============================================  ==================================================
comm open, data ``{}`` or ``{"interval": 0.5}``  ``{"type": "status", "data": {...}}`` at once;
                                                with ``interval`` it also pushes a status every
                                                ``interval`` seconds (when it changed) until the
                                                comm closes or ``unsubscribe``
``{"type": "status"}``                          ``{"type": "status", "data": {...}}``
``{"type": "subscribe", "interval": 0.5}``      a status now, then pushes as above
``{"type": "unsubscribe"}``                     ``{"type": "unsubscribe"}``; pushes stop
``{"type": "policy", "policy": "share"}``       ``{"type": "policy", "policy": "share"}``
``{"type": "dispatch", "dispatch": "parallel"}``  ``{"type": "dispatch", "dispatch": "parallel"}``
``{"type": "cancel", "run": 3}``                ``{"type": "cancel", "run": 3, "cancelled": 2}``
``{"type": "trace", "path": "t.json"}``         ``{"type": "trace", "path": "/abs/t.json",
(``path`` optional)                             "events": 120}``
anything else, or a bad field                   ``{"type": "error", "error": "<what was wrong,
                                                what is accepted>", "request": <its type>}``
==============================================  ==================================================

``data`` is ``Controller.status()`` made JSON-safe (device ids as string keys in ``memory``),
plus ``protocol`` (this protocol's version), per-island ``programs_running``/``programs_queued``,
``devices`` (``id``, ``island``, ``memory`` bytes, ``utilization`` 0..1 over the last
``WINDOW`` seconds, ``busy``), ``runs`` (``id``, ``name``, ``client``, ``state`` "running" or
"queued", ``islands``) and ``named_slices``: every slice of the controller (``name``: its
``%pathways slice`` name, else a variable holding it, else ``#<id>``; ``island``, ``devices``,
``shape``, ``axis_names``, ``axis_types``). A closed controller's data is
``{"closed": true, "protocol": 1}``. Before the controller has started (the kernel leaves JAX
alone until the first ``%pathways``), the data is a status with no islands and
``"started": false``.

>>> reply(ctl, {"type": "policy", "policy": "share", "id": 7})   # doctest: +SKIP
{'type': 'policy', 'policy': 'share', 'id': 7}
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET = "pwkernel"
PROTOCOL = 1
WINDOW = 2.0  # seconds of history behind each device's utilization
POLICIES = ("fifo", "priority", "share")
DISPATCH = ("parallel", "sequential")
MIN_INTERVAL, MAX_INTERVAL = 0.1, 10.0

# Each request type and its fields: name -> (required, check, what is accepted).
_INTERVAL = (lambda v: isinstance(v, int | float) and not isinstance(v, bool)
             and MIN_INTERVAL <= v <= MAX_INTERVAL,
             f"a number of seconds between {MIN_INTERVAL} and {MAX_INTERVAL}, e.g. 0.5")
SCHEMA: dict[str, dict[str, tuple[bool, Callable[[Any], bool], str]]] = {
    "status": {},
    "subscribe": {"interval": (True, *_INTERVAL)},
    "unsubscribe": {},
    "policy": {"policy": (True, lambda v: v in POLICIES, f"one of {list(POLICIES)}")},
    "dispatch": {"dispatch": (True, lambda v: v in DISPATCH, f"one of {list(DISPATCH)}")},
    "cancel": {"run": (True, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                       "a run id (int >= 0) from the status 'runs' list")},
    "trace": {"path": (False, lambda v: isinstance(v, str) and v.strip() != "",
                       "a non-empty file path string, e.g. 'trace.json'")},
}
REQUESTS = tuple(SCHEMA)


class RequestError(ValueError):
    """A message from the frontend that does not follow the protocol."""


def validate(data: Any) -> dict[str, Any]:
    """Check one frontend message against ``SCHEMA``; returns it, or raises ``RequestError``."""
    if not isinstance(data, dict) or "type" not in data:
        raise RequestError(f"expected a JSON object with a 'type' field, e.g. {{'type': "
                           f"'status'}}; got {data!r}.")
    kind = data["type"]
    if kind not in SCHEMA:
        raise RequestError(f"unknown message type {kind!r}; this kernel answers "
                           f"{list(REQUESTS)}.")
    fields = SCHEMA[kind]
    extra = sorted(set(data) - set(fields) - {"type", "id"})
    if extra:
        raise RequestError(f"{kind!r} message has unknown field(s) {extra}; it accepts "
                           f"{sorted(fields) + ['id']}.")
    if "id" in data and not (isinstance(data["id"], int | str) and not isinstance(data["id"],
                                                                                 bool)):
        raise RequestError(f"'id' must be an int or a string, got {data['id']!r}.")
    for name, (required, ok, accepted) in fields.items():
        if name not in data:
            if required:
                raise RequestError(f"{kind!r} message needs field {name!r}: {accepted}.")
            continue
        if not ok(data[name]):
            raise RequestError(f"{kind!r} message: field {name!r} must be {accepted}; got "
                               f"{data[name]!r}.")
    return data


# --- the status snapshot -------------------------------------------------------------------
class Utilization:
    """Busy fraction of each device over the last ``window`` seconds: finished computations
    from the trace (read incrementally) plus computations running now."""

    def __init__(self, window: float = WINDOW):
        self.window = window
        self._trace: Any = None
        self._cursor = 0
        self._spans: deque[tuple[float, float, tuple[int, ...]]] = deque()

    def sample(self, trace, running: list[tuple[float, tuple[int, ...]]],
               now: float | None = None) -> dict[int, float]:
        """``trace``: the controller's ``Trace``; ``running``: (start, devices) of computations
        launched and not finished; ``now``: a ``time.perf_counter()`` reading."""
        now = time.perf_counter() if now is None else now
        start = now - self.window
        if trace is not self._trace:  # a new controller (the old one was closed): start over
            self._trace, self._cursor, self._spans = trace, 0, deque()
        events = trace.events(since=self._cursor)
        if events:
            self._cursor = events[-1].index + 1
        for e in events:
            if e.kind == "compute" and e.t_end > start:
                self._spans.append((e.t_start, e.t_end, tuple(e.devices)))
        while self._spans and self._spans[0][1] <= start:
            self._spans.popleft()
        per_device: dict[int, list[tuple[float, float]]] = {}
        for t0, t1, devices in [*self._spans, *((t0, now, d) for t0, d in running)]:
            lo, hi = max(t0, start), min(t1, now)
            if hi > lo:
                for d in devices:
                    per_device.setdefault(d, []).append((lo, hi))
        return {d: min(1.0, _union(spans) / self.window) for d, spans in per_device.items()}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _runs(ctl) -> tuple[list[dict[str, Any]], list[tuple[float, tuple[int, ...]]]]:
    """Active programs with the islands they run or wait on, and the running computations."""
    runs, running = [], []
    for run in ctl.runs():
        on, waiting = set(), set()
        for task in list(getattr(run, "tasks", None) or ()):
            node = task.node
            island = getattr(node, "island", getattr(node, "dst", None))
            state = str(getattr(task, "state", ""))
            if state == "running":
                on.add(island)
                if hasattr(node, "fn"):  # a computation, not a transfer
                    running.append((task.t_launch, tuple(node.devices)))
            elif state in ("waiting", "queued"):
                waiting.add(island)
        runs.append({"id": run.id, "name": str(run.name), "client": str(run.client),
                     "state": "running" if on else "queued",
                     "islands": sorted(i for i in on | waiting if i is not None),
                     "running_on": sorted(i for i in on if i is not None)})
    return runs, running


def _named_slices(ctl) -> list[dict[str, Any]]:
    """Every slice of ``ctl``, named as the notebook knows it."""
    from . import extension  # late: extension imports this module

    st = extension.state()
    names = st.slice_names() if st is not None else {}
    out = []
    for vs in ctl.slices:
        try:
            out.append({"name": names.get(vs.id, f"#{vs.id}"), "island": vs.island.id,
                        "devices": list(vs.device_ids), "shape": list(vs.shape),
                        "axis_names": list(vs.axis_names),
                        "axis_types": list(vs.axis_type_names)})
        except Exception:  # noqa: BLE001 - released meanwhile (SliceError): not shown
            continue
    return out


def _not_started() -> dict[str, Any]:
    return {"type": "status", "data": {
        "started": False, "islands": [], "devices": [], "runs": [], "named_slices": [],
        "slices": [], "programs": [], "memory": {}, "policy": "", "dispatch": "",
        "closed": False, "protocol": PROTOCOL}}


def status_message(ctl, util: Utilization | None = None) -> dict[str, Any]:
    """The reply to a status request, JSON-safe (``ctl`` None: not started yet)."""
    if ctl is None:
        return _not_started()
    if ctl.closed:
        return {"type": "status", "data": {"closed": True, "protocol": PROTOCOL}}
    data = ctl.status()
    runs, running = _runs(ctl)
    busy = {d for _, devices in running for d in devices}
    use = (util or Utilization()).sample(ctl.trace, running)
    data["memory"] = {str(k): int(v) for k, v in data["memory"].items()}
    for isl in data["islands"]:
        isl["programs_running"] = sum(isl["id"] in r["running_on"] for r in runs)
        isl["programs_queued"] = sum(isl["id"] in r["islands"] and isl["id"] not in r["running_on"]
                                     for r in runs)
    data["devices"] = [{"id": d, "island": isl["id"], "memory": data["memory"].get(str(d), 0),
                        "utilization": round(use.get(d, 0.0), 4), "busy": d in busy}
                       for isl in data["islands"] for d in isl["devices"]]
    data["runs"] = runs
    data["named_slices"] = _named_slices(ctl)
    data["started"] = True
    data["protocol"] = PROTOCOL
    return {"type": "status", "data": data}


# --- requests ------------------------------------------------------------------------------
def _act(ctl, msg: dict[str, Any], conn: Connection | None) -> dict[str, Any]:
    kind = msg["type"]
    if kind == "status":
        return status_message(ctl, conn.util if conn else None)
    if kind in ("subscribe", "unsubscribe"):
        if conn is None:
            raise RequestError(f"{kind!r} needs an open comm; open one with target {TARGET!r}.")
        if kind == "unsubscribe":
            conn.unsubscribe()
            return {"type": "unsubscribe"}
        conn.subscribe(msg["interval"])
        return status_message(ctl, conn.util)
    if ctl is None:
        raise RequestError("the controller has not started yet; it starts with the first "
                           "%pathways command or cell (or pw.controller()).")
    if ctl.closed:
        raise RequestError("the controller is closed; run %load_ext pwkernel (or "
                           "pw.controller()) to start a new one.")
    if kind == "policy":
        ctl.policy = msg["policy"]
        return {"type": "policy", "policy": ctl.policy}
    if kind == "dispatch":
        ctl.dispatch = msg["dispatch"]
        return {"type": "dispatch", "dispatch": ctl.dispatch}
    if kind == "cancel":
        runs = ctl.runs()
        match = [r for r in runs if r.id == msg["run"]]
        if not match:
            raise RequestError(f"no active program with run id {msg['run']}; active run ids: "
                               f"{[r.id for r in runs]} (it may have finished already).")
        return {"type": "cancel", "run": msg["run"], "cancelled": int(match[0].cancel())}
    # trace
    path = Path(msg.get("path") or f"pwkernel-trace-{time.strftime('%Y%m%d-%H%M%S')}.json")
    try:
        saved = ctl.trace.save(path.expanduser().resolve())
    except OSError as e:
        raise RequestError(f"could not write the trace to {str(path)!r}: {e}. Pass a path in "
                           f"a writable directory.") from None
    return {"type": "trace", "path": str(saved), "events": len(ctl.trace)}


def reply(ctl, data: Any, conn: Connection | None = None) -> dict[str, Any]:
    """The answer to one message's ``data`` from the frontend (never raises)."""
    kind = data.get("type") if isinstance(data, dict) else None
    try:
        out = _act(ctl, validate(data), conn)
    except (RequestError, ValueError, TypeError) as e:
        out = {"type": "error", "error": str(e)}
        if isinstance(kind, str):
            out["request"] = kind
    if isinstance(data, dict) and isinstance(data.get("id"), int | str):
        out["id"] = data["id"]
    return out


# --- one open comm -------------------------------------------------------------------------
_live: set[Connection] = set()
_live_lock = threading.Lock()
_numbers = itertools.count()


class Connection:
    """One open comm: answers its messages and, while subscribed, pushes status from a daemon
    thread (so updates flow while a cell blocks the shell). Closing stops the thread."""

    def __init__(self, send: Callable[[dict], Any], get_controller: Callable[[], Any]):
        self.send = send
        self.get_controller = get_controller
        self.util = Utilization()
        self.number = next(_numbers)
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._last = ""
        with _live_lock:
            _live.add(self)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def handle(self, data: Any) -> dict[str, Any]:
        out = reply(self.get_controller(), data, self)
        self._send(out)
        return out

    def status(self) -> dict[str, Any]:
        out = status_message(self.get_controller(), self.util)
        self._send(out)
        return out

    def _send(self, msg: dict[str, Any], only_if_changed: bool = False) -> None:
        with self._lock:  # the pusher thread and the shell thread both send
            if msg.get("type") == "status":
                text = json.dumps(msg, sort_keys=True)
                if only_if_changed and text == self._last:
                    return
                self._last = text
            self.send(msg)

    def subscribe(self, interval: float) -> None:
        self.unsubscribe()
        self._halt = halt = threading.Event()
        self._thread = threading.Thread(target=self._push, args=(halt, float(interval)),
                                        name=f"pwkernel-comm-{self.number}", daemon=True)
        self._thread.start()

    def _push(self, halt: threading.Event, interval: float) -> None:
        while not halt.wait(interval):
            try:
                msg = status_message(self.get_controller(), self.util)
            except Exception:  # noqa: BLE001 - a snapshot taken mid-change: try next tick
                continue
            try:
                self._send(msg, only_if_changed=True)
            except Exception:  # noqa: BLE001 - the comm or kernel is going away: stop quietly
                halt.set()

    def unsubscribe(self) -> None:
        self._halt.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def close(self) -> None:
        self.unsubscribe()
        with _live_lock:
            _live.discard(self)


def connections() -> list[Connection]:
    """The comms open now (for tests and ``unregister``)."""
    with _live_lock:
        return list(_live)


def register(ip, get_controller: Callable[[], Any]) -> bool:
    """Register the target with the kernel's comm manager; False outside a kernel."""
    kernel = getattr(ip, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        return False

    def on_open(comm, open_msg) -> None:
        conn = Connection(comm.send, get_controller)
        comm.on_msg(lambda msg: conn.handle(msg["content"]["data"]))
        comm.on_close(lambda msg: conn.close())
        opts = open_msg["content"].get("data") or {}
        interval = opts.get("interval") if isinstance(opts, dict) else None
        conn.status()
        if interval:
            try:
                conn.subscribe(validate({"type": "subscribe", "interval": interval})["interval"])
            except RequestError as e:
                conn.send({"type": "error", "error": f"comm open: {e}", "request": "subscribe"})

    manager.register_target(TARGET, on_open)
    return True


def unregister(ip) -> None:
    """Remove the target and stop every open comm's pushes (``%unload_ext pwkernel``)."""
    for conn in connections():
        conn.close()
    manager = getattr(getattr(ip, "kernel", None), "comm_manager", None)
    if manager is not None:
        manager.unregister_target(TARGET, manager.targets.get(TARGET))

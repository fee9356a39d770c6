"""The ``pwkernel`` comm target: how a frontend (the JupyterLab Pathways sidebar) talks to the
controller in this kernel. It is the only channel the sidebar uses: no ports, no server polling.

Protocol (JSON objects, both directions; every request may carry an ``"id"`` (an int, or a string
of at most 200 characters) that the reply echoes, so a frontend can match replies to requests):

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
(``path`` optional: a NEW .json file in the     "events": 120, "rows": "auto"}``
notebook's directory; default: time-stamped;
``rows`` optional: ``"auto"`` (default),
``"device"``, ``"host"`` or ``"island"``, the
tracks of ``Trace.save(path, rows=...)``)
anything else, or a bad field                   ``{"type": "error", "error": "<what was wrong,
                                                what is accepted>", "request": <its type>}``
                                                (what came is quoted cut short, never whole)
==============================================  ==================================================

``data`` is ``Controller.snapshot()`` made JSON-safe: ``policy``, ``dispatch``, ``closed``,
``memory`` (device ids as string keys), ``islands`` (``id``, ``platform``, ``devices``, the
``running``/``queued`` computations, ``lost``, ``programs_running``/``programs_queued``), plus
``protocol`` (this protocol's version),
``devices`` (``id``, ``island``, ``memory`` bytes, ``utilization`` 0..1 over the last
``usage.WINDOW`` seconds, ``busy``), ``runs`` (``id``, ``name``, ``client``, ``state`` "running" or
"queued", ``islands``) and ``named_slices``: every slice of the controller (``name``: its
``%pathways slice`` name, else a variable holding it, else ``#<id>``; ``island``, ``devices``,
``shape``, ``axis_names``, ``axis_types``). A tenant of a shared device pool also gets ``pool``
(``name``, ``tenants``: each with ``name``, ``me``, ``color``, ``queued``, ``running``,
``share``, ``device_seconds``, ``bytes``, ``devices``; ``recent``: the other tenants'
computations that ended in the last ``WINDOW`` seconds, ``tenant``, ``client``, ``name``,
``island``, ``devices``, ``ago``, ``duration``; ``usage.pool_part``), and each device its
``others``: ``{tenant: busy fraction}`` of the other tenants over the same window. A closed
controller's data is ``{"closed": true, "protocol": 1}``. Before the controller has started
(the kernel leaves JAX alone until the first ``%pathways``), the data is a status with no
islands and ``"started": false``.

Requests are answered while a cell runs: JupyterLab sends comm messages to a kernel subshell
(JEP 91) and the handlers here run in that subshell's thread. They read and steer the controller
through its thread-safe API only, never the shell or the user's namespace. One updater thread
pushes to every subscribed comm, at most ``MAX_SUBSCRIBERS`` of them.

>>> reply(ctl, {"type": "policy", "policy": "share", "id": 7})   # doctest: +SKIP
{'type': 'policy', 'policy': 'share', 'id': 7}
"""

from __future__ import annotations

import itertools
import json
import os
import reprlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runtime.device_groups import ROW_MODES
from ..runtime.dispatcher import DispatchMode
from ..runtime.errors import PathwaysError
from ..runtime.scheduler import Policy
from ..runtime.snapshot import Snapshot
from ..runtime.tasks import TaskState
from . import state
from .pushes import Updater
from .usage import Utilization, device_others, pool_part

TARGET = "pwkernel"
PROTOCOL = 1
POLICIES = tuple(p.value for p in Policy)  # the names come from the runtime's enums
DISPATCH = tuple(d.value for d in DispatchMode)
MIN_INTERVAL, MAX_INTERVAL = 0.1, 10.0
MAX_SUBSCRIBERS = 16  # comms served status pushes; one more drops the oldest subscription
MAX_ID = 2**53  # ids and run ids: integers a JavaScript number holds exactly
MAX_TEXT = 200  # characters of an id or a trace path
CANCEL_REASON = "cancelled from the Pathways sidebar"


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < MAX_ID


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
    "cancel": {"run": (True, _is_int, "a run id (int >= 0) from the status 'runs' list")},
    "trace": {"path": (False, lambda v: isinstance(v, str) and 0 < len(v.strip()) <= MAX_TEXT
                       and v.endswith(".json"),
                       f"a new .json file name in the notebook's directory (at most {MAX_TEXT} "
                       "characters), e.g. 'trace.json'"),
              "rows": (False, lambda v: isinstance(v, str) and v in ROW_MODES,
                       f"one of {list(ROW_MODES)} (a track per device, host or island; 'auto' "
                       "groups them past 64 devices)")},
}
REQUESTS = tuple(SCHEMA)


class RequestError(PathwaysError, ValueError):
    """A message from the frontend that does not follow the protocol."""


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
_short.maxlist = _short.maxdict = _short.maxtuple = _short.maxset = 4
_short.maxlevel = 2


def _clip(value: Any, limit: int = 120) -> str:
    """A short repr of ``value``: replies quote what came, never echo it back whole."""
    text = _short.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _valid_id(v: Any) -> bool:
    return _is_int(v, -MAX_ID) or (isinstance(v, str) and len(v) <= MAX_TEXT)


def validate(data: Any) -> dict[str, Any]:
    """Check one frontend message against ``SCHEMA``; returns it, or raises ``RequestError``."""
    if not isinstance(data, dict) or "type" not in data:
        raise RequestError(f"expected a JSON object with a 'type' field, e.g. {{'type': "
                           f"'status'}}; got {_clip(data)}.")
    kind = data["type"]
    if not isinstance(kind, str) or kind not in SCHEMA:
        raise RequestError(f"unknown message type {_clip(kind)}; this kernel answers "
                           f"{list(REQUESTS)}.")
    fields = SCHEMA[kind]
    extra = sorted(str(k) for k in set(data) - set(fields) - {"type", "id"})
    if extra:
        raise RequestError(f"{kind!r} message has unknown field(s) {_clip(extra)}; it accepts "
                           f"{sorted(fields) + ['id']}.")
    if "id" in data and not _valid_id(data["id"]):
        raise RequestError(f"'id' must be an int or a string of at most {MAX_TEXT} characters, "
                           f"got {_clip(data['id'])}.")
    for name, (required, ok, accepted) in fields.items():
        if name not in data:
            if required:
                raise RequestError(f"{kind!r} message needs field {name!r}: {accepted}.")
            continue
        if not ok(data[name]):
            raise RequestError(f"{kind!r} message: field {name!r} must be {accepted}; got "
                               f"{_clip(data[name])}.")
    return data


# --- the status snapshot -------------------------------------------------------------------
def _runs(snap: Snapshot) -> list[dict[str, Any]]:
    """Active programs with the islands they run or wait on."""
    return [{"id": r.id, "name": r.name, "client": r.client, "state": r.state,
             "islands": list(r.islands), "running_on": list(r.running_on)} for r in snap.runs]


def _running(snap: Snapshot) -> list[tuple[float, tuple[int, ...]]]:
    """(launch time, devices) of every computation running now."""
    return [(n.t_launch, n.devices) for r in snap.runs for n in r.nodes
            if n.compute and n.state is TaskState.RUNNING]


def _named_slices(snap: Snapshot) -> list[dict[str, Any]]:
    """Every slice, named as the notebook knows it."""
    st = state.current()
    names = st.slice_names() if st is not None else {}
    return [{"name": names.get(vs.id, f"#{vs.id}"), "island": vs.island,
             "devices": list(vs.device_ids), "shape": list(vs.shape),
             "axis_names": list(vs.axis_names), "axis_types": list(vs.axis_types)}
            for vs in snap.slices]


def _not_started() -> dict[str, Any]:
    return {"type": "status", "data": {
        "started": False, "islands": [], "devices": [], "runs": [], "named_slices": [],
        "memory": {}, "policy": "", "dispatch": "",
        "closed": False, "protocol": PROTOCOL}}


def status_message(ctl, util: Utilization | None = None) -> dict[str, Any]:
    """The reply to a status request, JSON-safe (``ctl`` None: not started yet)."""
    if ctl is None:
        return _not_started()
    if ctl.closed:
        return {"type": "status", "data": {"closed": True, "protocol": PROTOCOL}}
    snap = ctl.snapshot()
    if snap.closed:  # closed between the two reads
        return {"type": "status", "data": {"closed": True, "protocol": PROTOCOL}}
    runs, running = _runs(snap), _running(snap)
    busy = {d for _, devices in running for d in devices}
    util = util or Utilization()
    now = ctl.executor.now()
    use = util.sample(ctl.trace, running, now)
    memory = {str(d): n for d, n in snap.memory.items()}
    islands = [{"id": i.id, "platform": i.platform, "devices": list(i.device_ids),
                "running": i.running, "queued": i.queued, "lost": i.lost,
                "programs_running": sum(i.id in r["running_on"] for r in runs),
                "programs_queued": sum(i.id in r["islands"] and i.id not in r["running_on"]
                                       for r in runs)} for i in snap.islands]
    data: dict[str, Any] = {
        "islands": islands, "memory": memory, "policy": snap.policy, "dispatch": snap.dispatch,
        "closed": False,
        "devices": [{"id": d, "island": i.id, "memory": memory.get(str(d), 0),
                     "utilization": round(use.get(d, 0.0), 4), "busy": d in busy}
                    for i in snap.islands for d in i.device_ids],
        "runs": runs, "named_slices": _named_slices(snap)}
    if snap.pool is not None:  # a tenant of a shared pool: the others' use of the devices
        data["pool"] = pool_part(snap, util, now)
        for d in data["devices"]:
            d["others"] = device_others(util, d["id"])
    data["started"] = True
    data["protocol"] = PROTOCOL
    return {"type": "status", "data": data}


# --- requests ------------------------------------------------------------------------------
def _act(ctl, msg: dict[str, Any], conn: Connection | None, root: Path | None) -> dict[str, Any]:
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
        raise RequestError("the controller is closed; the next %pathways command "
                           "(%pathways status) or pw.controller() starts a new one.")
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
                               f"{_clip([r.id for r in runs])} (it may have ended already).")
        cancelled = match[0].cancel(CANCEL_REASON)
        return {"type": "cancel", "run": msg["run"], "cancelled": int(cancelled)}
    # trace
    rows = msg.get("rows", "auto")
    path = save_trace(ctl, msg.get("path"), Path.cwd() if root is None else root, rows)
    return {"type": "trace", "path": str(path), "events": len(ctl.trace), "rows": rows}


def save_trace(ctl, name: str | None, root: Path, rows: str = "auto") -> Path:
    """Write the trace to a NEW .json file in ``root`` (the notebook's directory): never over
    a file that exists, never outside ``root``, never hidden (no part of the path may start
    with '.'). Without ``name``: a time-stamped one. ``rows``: its tracks, as
    ``Trace.save(path, rows=...)`` cuts them."""
    root = Path(root).resolve()
    if name is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = next(n for n in (f"pwkernel-trace-{stamp}{f'-{i}' if i else ''}.json"
                                for i in itertools.count()) if not (root / n).exists())
    if "\0" in name:  # (the OS would refuse it with a bare "embedded null byte")
        raise RequestError(f"the trace path {_clip(name)} has a NUL byte, which no file name "
                           "may hold. Pass a file name such as 'trace.json'.")
    path = (root / os.path.expanduser(name)).resolve()
    if path.parent != root and root not in path.parents:
        raise RequestError(f"the trace goes in the notebook's directory {str(root)!r}; "
                           f"{_clip(name)} is outside it. Pass a file name such as 'trace.json'.")
    if any(part.startswith(".") for part in path.relative_to(root).parts):
        raise RequestError(f"the trace path {_clip(name)} names a hidden file or folder (one "
                           "that starts with '.'), which the file browser would not show. Pass "
                           "a file name such as 'trace.json'.")
    try:
        with open(path, "x") as f:  # "x": refuse a file that exists (no overwriting)
            json.dump(ctl.trace.to_chrome(rows), f)
    except FileExistsError:
        raise RequestError(f"{str(path)!r} exists already; the sidebar writes new files only. "
                           "Pass another name, or leave 'path' out for a time-stamped one."
                           ) from None
    except OSError as e:
        raise RequestError(f"could not write the trace to {str(path)!r}: {e.strerror}. Pass a "
                           f"file name in a writable directory under {str(root)!r}.") from None
    return path


def reply(ctl, data: Any, conn: Connection | None = None,
          root: Path | None = None) -> dict[str, Any]:
    """The answer to one message's ``data`` from the frontend (never raises). ``root``: where
    trace files may be written (default: the working directory)."""
    kind = data.get("type") if isinstance(data, dict) else None
    try:
        out = _act(ctl, validate(data), conn, root)
    except (RequestError, ValueError, TypeError) as e:
        out = {"type": "error", "error": str(e)}
        if isinstance(kind, str):
            out["request"] = kind if len(kind) <= 40 else kind[:40] + "..."
    if isinstance(data, dict) and "id" in data and _valid_id(data["id"]):
        out["id"] = data["id"]
    return out


# --- one open comm -------------------------------------------------------------------------
_live: set[Connection] = set()
_live_lock = threading.Lock()
_numbers = itertools.count()
_updater = Updater(MAX_SUBSCRIBERS)
_push_util = Utilization()  # the updater thread's own (one snapshot serves every comm)


class Connection:
    """One open comm: answers its messages and, while subscribed, gets status pushes from the
    one updater thread (so updates flow while a cell blocks the shell). ``root``: the directory
    trace files may be written to (the notebook's)."""

    def __init__(self, send: Callable[[dict], Any], get_controller: Callable[[], Any],
                 root: Path | None = None, end: Callable[[], Any] | None = None):
        self.send = send
        self.end = end  # closes the comm from the kernel's side (the frontend is told)
        self.get_controller = get_controller
        self.root = Path.cwd() if root is None else Path(root)
        self.util = Utilization()
        self.number = next(_numbers)
        self._lock = threading.Lock()
        self._last = ""
        with _live_lock:
            _live.add(self)

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that pushes to this comm while it is subscribed."""
        return _updater.thread if _updater.subscribed(self) else None

    def handle(self, data: Any) -> dict[str, Any]:
        out = reply(self.get_controller(), data, self, self.root)
        self._send(out)
        return out

    def status(self) -> dict[str, Any]:
        out = status_message(self.get_controller(), self.util)
        self._send(out)
        return out

    def _send(self, msg: dict[str, Any], only_if_changed: bool = False) -> None:
        with self._lock:  # the updater thread and the comm's handler both send
            if msg.get("type") == "status":
                text = json.dumps(msg, sort_keys=True)
                if only_if_changed and text == self._last:
                    return
                self._last = text
            self.send(msg)

    def subscribe(self, interval: float) -> None:
        dropped = _updater.add(self, float(interval))
        if dropped is not None:
            dropped.send({"type": "error", "request": "subscribe", "error": (
                f"status pushes stopped: more than {MAX_SUBSCRIBERS} comms subscribed and this "
                "one subscribed first. Send 'subscribe' again to resume.")})

    def push(self, cache: dict[Any, Any]) -> bool:
        """One tick of the updater: send the status if it changed; False if the comm is gone."""
        try:
            ctl = self.get_controller()
            if id(ctl) not in cache:  # one snapshot for every comm served in this tick
                cache[id(ctl)] = status_message(ctl, _push_util)
        except Exception:  # noqa: BLE001 - a snapshot taken mid-change: try next tick
            return True
        try:
            self._send(cache[id(ctl)], only_if_changed=True)
        except Exception:  # noqa: BLE001 - the comm or kernel is going away: stop quietly
            return False
        return True

    def unsubscribe(self) -> None:
        _updater.remove(self)

    def close(self) -> None:
        self.unsubscribe()
        with _live_lock:
            _live.discard(self)


def subscribed() -> int:
    """How many comms get status pushes now."""
    return _updater.count()


def connections() -> list[Connection]:
    """The comms open now (for tests and ``unregister``)."""
    with _live_lock:
        return list(_live)


def _route_as_sent(comm) -> None:
    """Keep each frontend message on the subshell the frontend sent it to.

    ipykernel (7.x) sends a comm's incoming messages to the subshell that last *published* on
    it, for widgets whose kernel code waits for a reply. Our pushes publish from the updater
    thread, which ipykernel counts as the main shell: every sidebar request would then queue
    behind the running cell. This comm waits for no reply, so the frontend's choice stands
    (JupyterLab sends comm messages to a subshell of their own; JEP 91).
    """
    if hasattr(comm, _ROUTE_HOOK):
        setattr(comm, _ROUTE_HOOK, lambda data, default: default)


# ipykernel 7's routing hook: its kernel looks the method up by this name (``getattr``) on the
# comm a message is for; a comm without it keeps the sender's subshell (ipykernel < 7).
_ROUTE_HOOK = "_reply_subshell_for"


def register(ip, get_controller: Callable[[], Any]) -> bool:
    """Register the target with the kernel's comm manager; False outside a kernel.

    Messages are handled in the thread of the subshell they arrive on, possibly while a cell
    runs on the main thread: ``get_controller`` must only read (never build a controller), and
    nothing here touches the shell or the user's namespace.
    """
    kernel = getattr(ip, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        return False
    root = Path.cwd()  # the notebook's directory: where the kernel started

    def on_open(comm, open_msg) -> None:
        _route_as_sent(comm)
        conn = Connection(comm.send, get_controller, root, end=comm.close)
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
    """Remove the target, stop every open comm's pushes and close the comms, so that each
    sidebar learns the extension went (``%unload_ext pwkernel``)."""
    for conn in connections():
        conn.close()
        if conn.end is not None:
            try:
                conn.end()
            except Exception:  # noqa: BLE001 - closed already, or the kernel is going away
                pass
    manager = getattr(getattr(ip, "kernel", None), "comm_manager", None)
    if manager is not None:
        manager.unregister_target(TARGET, manager.targets.get(TARGET))

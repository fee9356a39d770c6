"""A pool's own Ray cluster on this machine: started on 127.0.0.1 with a token, and stopped.

``start_head`` runs ``ray start --head`` so that every Ray server binds the loopback address
(multi-node mode off: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` with ``--node-ip-address
127.0.0.1``, as ``backends/ray/cluster.py`` does for a controller's local cluster), without
the dashboard, with Ray's token authentication on (``RAY_AUTH_MODE=token``, the token read
from the pool's token file through ``RAY_AUTH_TOKEN_PATH``; ``ray start`` and every process
it starts read both from their environment). The cluster gets a temporary directory of its
own (``--temp-dir``): its session directory, sockets and address file are there, so it never
touches another cluster's ``/tmp/ray`` (``ray.init(address="auto")`` of other programs does
not find it), and its processes are told apart from every other Ray cluster's by that
directory in their environment (``MARK``, set only in the processes ``start_head`` starts and
inherited by every process Ray starts from them: Ray's agents and workers rename themselves),
by descending from such a process, or by their session: ``ray start`` runs in a session of its
own (``start_new_session``), which every Ray process of the cluster stays in. The session is
what finds Ray's dashboard and runtime-env agents once their raylet has died: they were its
children (now init's), and renaming themselves blanked their ``/proc/PID/environ``; left
alone, they wait a minute or more for a dead GCS. ``stop_head`` ends exactly those processes: never
``ray stop``, which ends every Ray cluster of the user, and never a process that merely names
the directory on its command line (a user's ``tail -f`` of the pool's logs).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ..runtime.errors import DeviceSetupError

START_TIMEOUT = 180.0  # seconds; `ray start` takes ~15 s on two busy cores


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MARK = "PWKERNEL_POOL_HEAD"  # in the environment of every process of a pool's cluster


def ray_env(token: Path, temp_dir: str) -> dict[str, str]:
    """The environment of the pool's Ray processes: loopback only, the pool's token, and the
    mark that tells them apart (Ray's agents and workers rename themselves, so their command
    lines no longer name the cluster; the environment they started with still does)."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN_PATH=str(token), **{MARK: temp_dir})
    env.pop("RAY_AUTH_TOKEN", None)  # it would win over the pool's token file
    env.pop("RAY_ADDRESS", None)  # `ray start --head` starts a head, whatever the user set
    return env


def start_head(name: str, token: Path, port: int | None = None, tries: int = 3) -> dict:
    """Start the pool's Ray head; returns ``address``, ``session_dir``, ``temp_dir``, ``pids``
    and ``started``. Ray finds the machine's GPUs itself (they become the islands' devices).

    ``ray start`` gives its raylet a fixed 30 s to register, which a busy machine can miss,
    and a free port may be taken before Ray binds it: then it is tried again (``tries`` in
    all), from nothing. On failure nothing of it is left (its processes are ended, its
    directory removed)."""
    for attempt in range(1, tries + 1):
        record, failure = _start_once(name, token, port)
        if failure is None:
            return record
        again = "timed out during startup" in failure or (port is None and "in use" in failure)
        if not again or attempt == tries:
            hint = f"\nIs port {port} taken? Pass another --port, or leave it out." if port \
                else ""
            raise DeviceSetupError(f"`ray start --head` for pool {name!r} failed:\n{failure}"
                                   f"{hint}")
    raise AssertionError("unreachable")


def _start_once(name: str, token: Path, port: int | None) -> tuple[dict, str | None]:
    """One ``ray start --head``: the record and None, or what went wrong (all ended)."""
    port = port or free_port()
    # Short, under /tmp: Ray's Unix sockets live in here (paths are limited to 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix=f"pwpool-{name[:16]}-", dir="/tmp")
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli) if ray_cli.exists() else "ray", "start", "--head",
           "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", temp_dir,
           "--include-dashboard", "false", "--disable-usage-stats",
           "--num-cpus", "1"]  # island actors take no CPU slot; few idle workers
    record = {"address": f"127.0.0.1:{port}", "temp_dir": temp_dir, "session_dir": None,
              "pids": [], "started": time.time()}
    try:
        # a session of its own: every Ray process of the cluster stays in it (``processes``)
        launch = subprocess.Popen(cmd, env=ray_env(token, temp_dir), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                  start_new_session=True)
    except OSError as e:
        stop_head(record)
        return record, f"it did not start: {e}. Is Ray installed (pip install 'pwkernel[ray]')?"
    record["sid"] = launch.pid  # (the session's number: its leader's pid)
    try:
        record["sid_created"] = psutil.Process(launch.pid).create_time()
    except psutil.Error:  # (it ended already: failed at once)
        pass
    try:
        out, err = launch.communicate(timeout=START_TIMEOUT)
    except BaseException as e:  # timed out, or Ctrl-C: its session is not the terminal's
        launch.kill()
        launch.wait()
        stop_head(record)
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        return record, f"it did not finish: {e}. Is Ray installed (pip install 'pwkernel[ray]')?"
    if launch.returncode != 0:
        stop_head(record)
        tail = (err or out).strip().splitlines()[-6:]
        return record, f"exit {launch.returncode}:\n" + "\n".join(tail)
    latest = Path(temp_dir, "session_latest")
    record["session_dir"] = str(latest.resolve()) if latest.exists() else None
    record["pids"] = sorted(p.pid for p in processes(record))
    return record, None


def processes(record: dict) -> list[psutil.Process]:
    """The live processes of a pool's own cluster: those whose environment carries its mark
    (``ray_env``: only processes the pool started, and what they started, have it), the pids
    it wrote down when they still run since before the pool started (a pid used again later
    is another program), and their descendants. A process that only names the pool's
    directory on its command line is not the pool's."""
    temp_dir = record.get("temp_dir")
    roots: dict[int, psutil.Process] = {}
    if temp_dir:
        for p in psutil.process_iter(["environ"]):
            if (p.info["environ"] or {}).get(MARK) == temp_dir:
                roots[p.pid] = p
    started = float(record.get("started") or 0.0)
    if record.get("sid") and not _reused(record["sid"], record.get("sid_created")):
        roots.update((p.pid, p) for p in session_processes(record["sid"], started))
    for pid in record.get("pids") or ():
        if pid in roots:
            continue
        try:
            p = psutil.Process(pid)
            if p.create_time() <= started + START_TIMEOUT and _may_be_ours(p, temp_dir):
                roots[pid] = p
        except psutil.Error:
            continue
    found = dict(roots)
    for p in roots.values():
        try:
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.Error:
            continue
    return [p for p in found.values() if _alive(p)]


def session_processes(sid: int, since: float) -> list[psutil.Process]:
    """The live processes of session ``sid`` (a program started with ``start_new_session``,
    such as ``ray start``, and every process started from it that did not leave the session:
    Ray's never do) created since ``since`` (``time.time()`` before the start). The number of
    a session is not given to a new process while any process of it lives, so those are the
    processes that program started, renamed, orphaned or not."""
    found = []
    for p in psutil.process_iter(["create_time"]):
        try:
            if os.getsid(p.pid) == sid and p.info["create_time"] >= since - 1.0:
                found.append(p)  # (create_time is rounded to clock ticks)
        except (OSError, psutil.Error):
            continue
    return [p for p in found if _alive(p)]


def _reused(sid: int, created: float | None) -> bool:
    """Whether ``sid``, the number of the session ``ray start`` led, now leads another: its
    pid was given to a new process (then every process of the old session had ended)."""
    try:
        return created is not None and psutil.Process(sid).create_time() != created
    except psutil.Error:
        return False


def _may_be_ours(p: psutil.Process, temp_dir: str | None) -> bool:
    """A recorded pid's process: ours unless its environment, readable, lacks the mark."""
    try:
        env = p.environ()
    except psutil.AccessDenied:
        return True
    return not temp_dir or env.get(MARK) == temp_dir


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_head(record: dict, grace: float = 5.0) -> list[int]:
    """End the pool cluster's processes (SIGTERM, then SIGKILL after ``grace`` seconds) and
    remove its temporary directory; returns the pids that were ended."""
    procs = processes(record)
    for p in procs:
        try:
            if _rays_monitor(p):  # on SIGTERM it tells every driver (the tenants still
                p.kill()  # attached) "The autoscaler failed ...": nothing failed
            else:
                p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:  # gcs_server, for one, may not end on SIGTERM while peers go away
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    left = [p for p in processes(record) if p not in procs]  # started meanwhile (workers)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace)
    if record.get("temp_dir"):
        shutil.rmtree(record["temp_dir"], ignore_errors=True)
    # Ray notes the newest cluster of the machine here whatever --temp-dir says; a stale note
    # would send a later `ray.init("auto")` to this dead one
    current = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")
    try:
        if current.read_text().strip() == record.get("address"):
            current.unlink()
    except OSError:
        pass
    return sorted(p.pid for p in procs + left)


def _rays_monitor(p: psutil.Process) -> bool:
    """Whether ``p`` is Ray's autoscaler monitor (``ray/autoscaler/_private/monitor.py``)."""
    try:
        return any(a.endswith("autoscaler/_private/monitor.py") for a in p.cmdline())
    except psutil.Error:
        return False


def answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True

"""Connecting to a Ray cluster, and the controller's handle on one island actor.

A controller either joins a running cluster (``ray_address="auto"`` or ``"host:port"``) or
starts a local one that listens on 127.0.0.1 only, without the dashboard, with Ray's token
authentication on (Ray 2.5x enables it by default for new local clusters; we never turn it
off). When the last controller using the connection closes, a local cluster this module started
is shut down, and a cluster it joined is left (it keeps running; this process disconnects). A
Ray connection the user made before (``ray.init`` of their own) is used and left alone.

Attaching to a device pool (``connect(address, pool=NAME)``): when the pool is written down on
this machine (``poolfile``), the connection uses its token file (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN_PATH``) unless the user set ``RAY_AUTH_*`` themselves; what was changed is
put back after ``ray.shutdown``, so a later local cluster starts as it would have.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable

import ray

from ...runtime.errors import DeviceSetupError
from . import poolfile
from .actor import MAX_CONCURRENCY, IslandActor

_lock = threading.Lock()
_users = 0            # open controllers using the Ray connection
_initialized_here = False  # this module called ray.init (so it calls ray.shutdown)
_lost_islands: set = set()  # islands whose actor died: the local cluster's logs are kept
_undo: list[Callable[[], None]] = []  # put back what _loopback_only / _pool_token changed


def connect(address: str | None, pool: str | None = None, own_token: bool = False) -> None:
    """Join ``address`` (or start a local cluster when None), once per process.

    With ``pool``, a pool written down on this machine (``poolfile``) lends its token: the
    connection uses Ray's token authentication with the pool's token file, unless the user
    set ``RAY_AUTH_*`` themselves (theirs win; ``own_token`` is for the pool's own commands,
    where the pool's token always wins)."""
    global _users, _initialized_here
    with _lock:
        if not ray.is_initialized():
            try:
                if pool is not None:
                    _pool_token(pool, own_token)
                _start_or_join(address, pool)
            except BaseException:
                _restore()
                raise
            _initialized_here = True
        else:
            _refuse_another_cluster(address, pool)
        _users += 1


def address_problem(address: str) -> str | None:
    """Why ``address`` cannot name a Ray cluster to join (None when it can): ``HOST:PORT``
    with a port of 1 to 65535, or ``auto``. A ``ray://`` (Ray Client) address is refused: the
    controller joins as a driver (Ray Client needs ``ray[client]``, which pwkernel does not
    install: Ray's own error said to install it by hand, and nothing here ran over it)."""
    host, _, port = address.rpartition(":")
    if address.startswith("ray://"):
        return (f"a Ray Client address ({address!r}) is not supported: pwkernel joins the "
                "cluster as a driver, from a machine that reaches every node. Expected "
                "HOST:PORT of the cluster's head (its GCS address, e.g. 10.0.0.1:6379, what "
                "`ray start --head` prints) or 'auto' on a node of it")
    if address == "auto" or (host.strip("[]") and port.isdigit() and 0 < int(port) < 65536):
        return None
    return (f"expected HOST:PORT of a running Ray cluster's head (e.g. 10.0.0.1:6379) or "
            f"'auto', got {address!r}")


def same_address(a: str, b: str) -> bool:
    """Whether ``host:port`` ``a`` and ``b`` name the same server (host names resolved)."""
    def key(address: str) -> tuple[str, str]:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            host = socket.gethostbyname(host)
        except (OSError, UnicodeError):
            pass
        return host, port
    return a == b or key(a) == key(b)


def _refuse_another_cluster(address: str | None, pool: str | None) -> None:
    """Under the lock, connected already: ``address`` must be the cluster this process is
    connected to (one Ray connection per process), else say which one it is and what to do."""
    if address is None or address == "auto" or "://" in address or ":" not in address:
        return
    current = ray.get_runtime_context().gcs_address
    if same_address(address, current):
        return
    by = (f"{_users} open controller(s) of this process use it" if _users
          else "a ray.init() of your own made it")
    what = f"pool {pool!r} at {address}" if pool is not None else f"the cluster at {address}"
    raise DeviceSetupError(
        f"this process is connected to the Ray cluster at {current} ({by}), so it cannot "
        f"join {what}: a process talks to one Ray cluster at a time. Close those "
        "controllers first (ctl.close(); in a notebook, %pathways attach replaces the "
        "kernel's controller) or call ray.shutdown(), then attach again"
        + ("; or attach to a pool that runs on the cluster at " + current if pool else "")
        + ".")


def _start_or_join(address: str | None, pool: str | None = None) -> None:
    """``ray.init``: a new local cluster (None), or the cluster at ``address`` (``pool``: the
    pool it is joined for, named when the cluster refuses the token)."""
    if address is None:
        # Ray's default for a new local cluster is token authentication (a token in
        # ~/.ray/auth_token, made if missing); we keep it and check it in tests.
        _loopback_only()
        _token_auth_chosen()
        # address="local": a new cluster, even if `ray start` left one (or its
        # address file) on this machine.
        # Ray starts its processes with subprocess.Popen(preexec_fn=...): a fork whose child
        # only masks SIGINT and sets its parent-death signal, then execs Ray's programs; it
        # runs no JAX, so JAX's at-fork "will likely lead to a deadlock" does not apply.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            context = ray.init(address="local", _node_ip_address="127.0.0.1",
                               include_dashboard=False, log_to_driver=False,
                               configure_logging=False,
                               num_cpus=1)  # island actors take no CPU slot; few idle workers
        session = context.address_info.get("session_dir")
        _lost_islands.clear()  # (of an earlier cluster)
        if session:  # Ray leaves it (logs, sockets) behind: one more per controller
            _undo.append(lambda: _remove_session(session))
    else:
        local_ip = {}
        if _is_loopback(address):  # a cluster on this machine's loopback address
            _loopback_only()
            local_ip = {"_node_ip_address": "127.0.0.1"}
        _token_auth_if_token()
        unreachable = _unreachable(address)
        if unreachable and pool is not None:  # (a cluster of one's own is not the pool)
            raise DeviceSetupError(poolfile.not_answering(pool, address, unreachable))
        if unreachable:  # Ray itself would retry for minutes before saying so
            raise DeviceSetupError(
                f"could not connect to the Ray cluster at {address!r}: {unreachable}. "
                "Is its head running (`ray status --address ...` on that machine)? "
                "Start one with `ray start --head --node-ip-address <ip> --port 6379`, "
                "or pass ray_address=None to start a local cluster.")
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False,
                     **local_ip)
        except ConnectionError as e:
            cause = f" ({e.__cause__})" if e.__cause__ is not None else ""
            if _refused_token(f"{e}{cause}"):
                raise DeviceSetupError(poolfile.token_advice(address, pool)) from None
            loopback = (" A head on this machine registers under its own address unless "
                        "started with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: join that address, "
                        "or 'auto'." if local_ip else "")
            raise DeviceSetupError(
                f"could not connect to the Ray cluster at {address!r}: {e}{cause}.{loopback} "
                "Start one with `ray start --head --node-ip-address <ip> --port 6379` "
                "(with RAY_AUTH_MODE=token and this machine's ~/.ray/auth_token), or "
                "pass ray_address=None to start a local cluster.") from None


def _refused_token(text: str) -> bool:
    """Whether Ray's connection error says the cluster refused this process's token."""
    return any(w in text for w in ("AuthenticationError", "InvalidAuthToken", "Unauthenticated"))


def _restore() -> None:
    while _undo:
        _undo.pop()()


def _remove_session(session: str) -> None:
    """Remove a local cluster's session directory once it is shut down (its processes' logs
    and sockets), and Ray's ``session_latest`` link when it still points there; kept when an
    island actor died meanwhile (``mark_lost``): its logs say why."""
    import shutil

    if _lost_islands:
        logging.getLogger("pwkernel").warning(
            "island actors died on the local Ray cluster (%s); its logs are kept in %s",
            ", ".join(map(str, sorted(_lost_islands))), session)
        _lost_islands.clear()
        return

    shutil.rmtree(session, ignore_errors=True)
    latest = os.path.join(os.path.dirname(session), "session_latest")
    with contextlib.suppress(OSError):
        if os.readlink(latest) == session:
            os.unlink(latest)


def _pool_token(pool: str, own_token: bool) -> None:
    """Set ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` to pool ``pool``'s token file
    (when its pool file is here) for this process and the Ray processes it starts; Ray reads
    them (its C++ token loader) at ``ray.init``, so they are set before it and put back
    after ``ray.shutdown``."""
    from . import poolfile

    record = poolfile.load(pool)
    path = record.get("token_path") if record else None
    if not path:
        return
    env = os.environ
    changes: dict[str, str | None] = {}
    if own_token or "RAY_AUTH_MODE" not in env:
        changes["RAY_AUTH_MODE"] = "token"
    if own_token or not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & env.keys():
        # RAY_AUTH_TOKEN would win over the path: the pool's own commands drop it
        changes.update(RAY_AUTH_TOKEN_PATH=str(path), RAY_AUTH_TOKEN=None)
    old = {k: env.get(k) for k in changes}
    _set_env(changes)
    _undo.append(lambda: _set_env(old))


def lend_token(path) -> Callable[[], None]:
    """Talk to Ray with token authentication, the token read from the file ``path``, in this
    process and the Ray processes it starts (what a pool's own commands do); returns what
    puts the settings back as they were."""
    changes = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path),
               "RAY_AUTH_TOKEN": None}  # (RAY_AUTH_TOKEN would win over the path)
    old = {k: os.environ.get(k) for k in changes}
    _set_env(changes)
    return lambda: _set_env(old)


def _set_env(values: dict[str, str | None]) -> None:
    """Set (None: unset) environment variables, and make Ray read its settings again."""
    from ray._raylet import AuthenticationTokenLoader, Config

    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    Config.initialize("")  # Ray caches RAY_AUTH_MODE; its own setup reloads it the same way
    AuthenticationTokenLoader.instance().reset_cache()


def _token_auth_chosen() -> None:
    """A new local cluster with Ray's default, token authentication, chosen here
    (``RAY_AUTH_MODE=token`` until the cluster stops) unless the user chose: left to itself,
    Ray turns it on with a warning that a notebook shows in red under the cell."""
    if "RAY_AUTH_MODE" not in os.environ:
        _set_env({"RAY_AUTH_MODE": "token"})
        _undo.append(lambda: _set_env({"RAY_AUTH_MODE": None}))


def _token_auth_if_token() -> None:
    """Talk to a cluster we join with Ray's token authentication when a token is at hand
    (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``) and the user did not
    choose (``RAY_AUTH_MODE``): Ray turns it on by itself only for ``address="auto"``."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _unreachable(address: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at ``host:port`` (None if something does, or for "auto")."""
    if address == "auto" or "://" in address or ":" not in address:
        return None
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    return host in ("127.0.0.1", "localhost", "::1")


def _loopback_only() -> None:
    """Make a local cluster listen on 127.0.0.1 only.

    Ray turns ``_node_ip_address="127.0.0.1"`` into the machine's reachable address unless
    multi-node clustering is off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at import by
    ``ray_constants`` here and by every Ray process we start), so we turn it off for this
    single-machine cluster; then every Ray server binds the loopback address."""
    from ray._private import ray_constants

    old_env = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    old_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False

    def restore() -> None:  # after shutdown: a later ray_address= connection needs clustering
        if old_env is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = old_env
        ray_constants.ENABLE_RAY_CLUSTER = old_flag

    _undo.append(restore)


def disconnect() -> None:
    """One controller is done. The last one stops the local cluster this module started, or
    disconnects from the cluster it joined (and puts back the settings it changed, also when
    the user's ``ray.shutdown()`` disconnected first)."""
    global _users, _initialized_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _initialized_here:
            if ray.is_initialized():
                ray.shutdown()
            _initialized_here = False
            _restore()


def connected() -> bool:
    """Whether this process is connected to Ray. After a ``ray.shutdown()`` (the user's, or
    ``drop_lost``'s) every Ray call would start a new local cluster (Ray's auto-init, with
    its defaults: not loopback-only, dashboard on) that nothing stops: so the controller
    checks this before it calls Ray, and treats its islands as lost instead."""
    return ray.is_initialized()


def gone() -> bool:
    """Whether the cluster this process is connected to has gone away (its GCS takes no
    connection: a pool was stopped, the head died). Never raises."""
    try:
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return False
    except OSError:
        return True
    except Exception:  # noqa: BLE001 - not connected, or Ray cannot say: not known gone
        return False


def drop_lost() -> None:
    """Disconnect from a cluster that has gone away, at once: Ray ends a process that cannot
    reach its cluster's GCS for 60 s (a notebook kernel, with everything in it). Open
    controllers keep their lost islands (their calls fail, saying so); their ``close()``
    finds nothing left to disconnect."""
    global _initialized_here
    with _lock:
        if ray.is_initialized():
            ray.shutdown()
        if _initialized_here:
            _initialized_here = False
            _restore()


def token_auth_enabled() -> bool:
    """Whether this process talks to Ray with token authentication."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return get_authentication_mode() == AuthenticationMode.TOKEN


def gpus_available() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


class IslandHost:
    """The controller's side of one island actor: its handle, clock offset and buffer ids.

    ``generation`` grows on every ``reattach``: buffers of an older generation are lost.
    """

    def __init__(self, island: int, devices: int, platform: str):
        self.island, self.devices, self.platform = island, devices, platform
        self.generation = -1
        self.actor = None
        self.offset = 0.0        # actor clock - controller clock
        self.info: dict = {}
        self.lost = False
        self.sent: set[str] = set()  # executables this actor has (touched by its launcher)
        self.last_message: tuple | None = None  # (actor, seq) its launcher sent last
        self._bids = itertools.count()
        self._frees: list[int | str] = []  # buffer ids; a str: an executable key
        self._lock = threading.Lock()
        self.wake = lambda: None  # set by the island's executor: send pending frees soon
        self.on_lost = lambda host: None  # set by the backend: tell the other islands

    def start(self) -> None:
        """Start (or restart) the actor and measure its clock offset."""
        opts: dict = {"max_concurrency": MAX_CONCURRENCY, "max_restarts": 0, "num_cpus": 0}
        if self.platform == "gpu":
            opts["num_gpus"] = self.devices
        actor = ray.remote(IslandActor).options(**opts).remote(
            self.island, self.devices, "cpu" if self.platform == "cpu" else "gpu")
        try:
            info = ray.get(actor.info.remote(), timeout=300)
        except Exception as e:  # noqa: BLE001 - Ray's errors are varied; name the island
            ray.kill(actor)
            raise DeviceSetupError(f"island {self.island}'s Ray actor did not start: {e}") \
                from None
        self.started(actor, info, clock_offset(actor))

    def started(self, actor, info: dict, offset: float) -> None:
        """A new actor (generation) serves the island from now on."""
        with self._lock:
            self.actor, self.info, self.offset = actor, info, offset
            self.generation += 1
            self.lost = False
            self.sent = set()
            self._frees = []

    def to_local(self, t_actor: float) -> float:
        """An actor time on the controller's clock."""
        return t_actor - self.offset

    def new_id(self) -> int:
        return next(self._bids)

    def free(self, generation: int, bid: int | str) -> None:
        """Free a buffer later (called from GC callbacks: no Ray call here)."""
        with self._lock:
            if generation != self.generation or self.lost:
                return
            first = not self._frees
            self._frees.append(bid)
        if first:  # later frees ride along: one message frees many buffers
            self.wake()

    def take_frees(self) -> list[int]:
        """The buffer ids to free, for the island's next message."""
        with self._lock:
            bids, self._frees = self._frees, []
            return bids

    def keep_frees(self, bids: list[int]) -> None:
        """Give back frees taken for a message they may not ride in (the operation that makes
        their buffers is not sent yet): the message that sends it takes them."""
        with self._lock:
            self._frees[:0] = bids

    def lost_advice(self) -> str:
        """What to do once this island is lost."""
        if not connected():
            return (f"this process left its Ray cluster (ray.shutdown()), and island "
                    f"{self.island}'s actor ended with it: close this controller (ctl.close())"
                    " and create a new one")
        return f"ctl.reattach({self.island}) starts a new actor"

    def reachable(self) -> bool:
        """Whether a Ray call to the island's actor may be made now: not when this process
        has left its Ray cluster (the call would start a new one); the island is lost then."""
        if connected():
            return True
        self.mark_lost()
        return False

    def mark_lost(self) -> None:
        """The actor died (a call to it failed): its buffers are gone, and the islands that
        wait for a value from it must stop waiting."""
        with self._lock:
            if self.lost:
                return
            self.lost = True
        _lost_islands.add(self.island)
        self.on_lost(self)

    def kill(self) -> None:
        with self._lock:
            actor, self.actor, self.lost = self.actor, None, True
        if actor is not None:
            self.release(actor)

    def release(self, actor) -> None:
        """Let go of the island's actor: this controller started it, so it is killed (it
        ended already if this process left its Ray cluster)."""
        if not connected():  # (ray.kill would start a new local cluster)
            return
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass


def clock_offset(actor) -> float:
    """``actor``'s clock minus this process's (``actor.clock()``), from a few pings."""
    offset, best = 0.0, float("inf")
    for _ in range(5):  # the ping with the shortest round trip estimates best
        t_send = time.perf_counter()
        t_actor = ray.get(actor.clock.remote())
        t_recv = time.perf_counter()
        if t_recv - t_send < best:
            best, offset = t_recv - t_send, t_actor - (t_send + t_recv) / 2
    return offset

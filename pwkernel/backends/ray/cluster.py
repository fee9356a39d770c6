"""Connecting to a Ray cluster, and the controller's handle on one island actor.

A controller either joins a running cluster (``ray_address="auto"`` or ``"host:port"``) or
starts a local one that listens on 127.0.0.1 only, without the dashboard, with Ray's token
authentication on (Ray 2.5x enables it by default for new local clusters; we never turn it
off). A local cluster this module started is shut down when the last controller using it
closes.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import ray

from ...runtime.errors import DeviceSetupError
from .actor import _MAX_CONCURRENCY, IslandActor

_lock = threading.Lock()
_users = 0            # open controllers using the Ray connection
_started_here = False  # this process started the local cluster (so it shuts it down)
_restore = lambda: None  # noqa: E731 - undoes _loopback_only once the local cluster is gone


def connect(address: str | None) -> None:
    """Join ``address`` (or start a local cluster when None), once per process."""
    global _users, _started_here
    with _lock:
        if not ray.is_initialized():
            if address is None:
                # Ray's default for a new local cluster is token authentication (a token in
                # ~/.ray/auth_token, made if missing); we keep it and check it in tests.
                _loopback_only()
                ray.init(_node_ip_address="127.0.0.1", include_dashboard=False,
                         log_to_driver=False, configure_logging=False,
                         num_cpus=1)  # island actors take no CPU slot; few idle workers
                _started_here = True
            else:
                try:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
                except ConnectionError as e:
                    raise DeviceSetupError(
                        f"could not connect to the Ray cluster at {address!r}: {e}. Start one "
                        "with `ray start --head --node-ip-address <ip> --port 6379`, or pass "
                        "ray_address=None to start a local cluster.") from None
                _started_here = False
        _users += 1


def _loopback_only() -> None:
    """Make a local cluster listen on 127.0.0.1 only.

    Ray turns ``_node_ip_address="127.0.0.1"`` into the machine's reachable address unless
    multi-node clustering is off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at import by
    ``ray_constants`` here and by every Ray process we start), so we turn it off for this
    single-machine cluster; then every Ray server binds the loopback address."""
    from ray._private import ray_constants

    global _restore
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

    _restore = restore


def disconnect() -> None:
    """One controller is done; shut down the local cluster if we started it and it was last."""
    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here and ray.is_initialized():
            ray.shutdown()
            _started_here = False
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
        self._bids = itertools.count()
        self._frees: list[int] = []
        self._lock = threading.Lock()
        self.wake = lambda: None  # set by the island's executor: send pending frees soon
        self.on_lost = lambda host: None  # set by the dispatcher: tell the other islands

    def start(self) -> None:
        """Start (or restart) the actor and measure its clock offset."""
        opts: dict = {"max_concurrency": _MAX_CONCURRENCY, "max_restarts": 0, "num_cpus": 0}
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
        offset, best = 0.0, float("inf")
        for _ in range(5):  # the ping with the shortest round trip estimates best
            t_send = time.perf_counter()
            t_actor = ray.get(actor.clock.remote())
            t_recv = time.perf_counter()
            if t_recv - t_send < best:
                best, offset = t_recv - t_send, t_actor - (t_send + t_recv) / 2
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

    def free(self, generation: int, bid: int) -> None:
        """Free a buffer later (called from GC callbacks: no Ray call here)."""
        with self._lock:
            if generation != self.generation or self.lost:
                return
            self._frees.append(bid)
        self.wake()

    def take_frees(self) -> list[int]:
        """The buffer ids to free, for the island's next message."""
        with self._lock:
            bids, self._frees = self._frees, []
            return bids

    def mark_lost(self) -> None:
        """The actor died (a call to it failed): its buffers are gone, and the islands that
        wait for a value from it must stop waiting."""
        with self._lock:
            if self.lost:
                return
            self.lost = True
        self.on_lost(self)

    def kill(self) -> None:
        with self._lock:
            actor, self.actor, self.lost = self.actor, None, True
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass

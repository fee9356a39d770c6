"""The Ray backend: islands are Ray actors, each a process with its own JAX devices.

The controller keeps everything that decides: tracing (lowered over stand-in meshes of its own
virtual CPU devices, one per island device, then exported for the island's platform), the
per-island gang schedulers, futures, the object store and the trace. The actors only compile,
run, hold buffers and move bytes. ``RayBackend`` is the executor (``runtime/executor.py``):

- launches become items of the island's next message (``island.py``); while a program is
  submitted (``group()``) every island holds its message, so with parallel dispatch an island
  gets the program's nodes in one message and waits on its inputs itself;
- transfers: host values are uploaded (``put``), transfers inside an island reshard there, and
  between islands the source actor pushes the value to the destination actor (``send`` ->
  ``deliver``), which waits for it (``recv``): bytes go island to island, never through the
  controller;
- an actor that dies fails what depended on it with ``IslandLostError``, and the other islands
  are told to stop waiting for values from it;
- with ``pool=NAME`` the islands are a device pool's, shared with other controllers
  (``tenancy.py``: the island actors, whose schedulers order every tenant's work;
  ``attach.py``: this controller as one tenant); ``close()`` leaves them running.

>>> ctl = pw.Controller(backend="ray", islands=(4, 4))          # doctest: +SKIP
>>> ctl.islands[0].actor                                         # doctest: +SKIP
Actor(IslandActor, ...)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from ...runtime import callbacks
from ...runtime.errors import DeviceSetupError, copy_error, deleted_input
from ...runtime.executor import IslandFacts
from ...runtime.resources import DEFAULT_ISLANDS, Island
from ...runtime.sizes import sizes_problem
from ...runtime.specialization import jitted
from ...runtime.tasks import Task
from ..local import request_host_devices
from . import attach, cluster, others
from .cluster import IslandHost
from .hostvalues import to_host
from .island import RaySite, RemoteBuffer, host_lost, layout
from .ops import jax_settings


class RayIsland(Island):
    """An island served by a Ray actor; ``actor`` is its current handle (it changes on
    ``ctl.reattach``). ``devices`` are the controller's stand-in devices used for lowering.
    ``host_callbacks``: whether functions placed here may call back into Python (no: they are
    exported to the actor, and ``jax.export`` cannot serialize a callback's function)."""

    host_callbacks = False

    @property
    def actor(self):
        return self.__dict__["_host"].actor

    @property
    def host(self) -> IslandHost:
        return self.__dict__["_host"]


def _device_kind(sizes: Sequence[int]) -> str:
    """``gpu`` when the cluster has GPUs for every island (or PWKERNEL_RAY_DEVICES=gpu)."""
    choice = os.environ.get("PWKERNEL_RAY_DEVICES", "auto").strip().lower()
    if choice not in ("auto", "cpu", "gpu"):
        raise DeviceSetupError(f"PWKERNEL_RAY_DEVICES={choice!r}; expected auto, cpu or gpu.")
    if choice == "cpu":
        return choice
    gpus, needed = cluster.gpus_available(), sum(sizes)
    if choice == "gpu" and gpus < needed:  # Ray would wait for GPUs that never come
        raise DeviceSetupError(
            f"PWKERNEL_RAY_DEVICES=gpu, but the Ray cluster has {gpus:g} GPUs and "
            f"islands={tuple(sizes)} need {needed}; add GPU machines (`ray start --address "
            "<head> --num-gpus N`), use fewer or smaller islands, or unset it.")
    return "gpu" if gpus >= needed else "cpu"


def _one_address(ray_address: str | None, address: str | None) -> str | None:
    """``address=`` is ``ray_address=`` under its shorter name (the two must agree)."""
    for name, value in (("ray_address", ray_address), ("address", address)):
        if value is not None and not isinstance(value, str):
            raise DeviceSetupError(f"{name} must be a string ('auto' or 'host:port') or "
                                   f"None, got {type(value).__name__}.")
        problem = None if value is None else cluster.address_problem(value)
        if problem is not None:
            raise DeviceSetupError(f"{name}: {problem}; or leave it out (None) to start a "
                                   "local cluster.")
    if ray_address is not None and address is not None and ray_address != address:
        raise DeviceSetupError(f"address={address!r} and ray_address={ray_address!r} name two "
                               "clusters; they are the same option, pass one of them.")
    return address if address is not None else ray_address


def _stand_ins(sizes: Sequence[int]) -> list:
    """Stand-in devices for lowering: one host CPU device of this process per island
    device."""
    request_host_devices(sum(sizes))
    pool = jax.devices("cpu")
    if len(pool) < sum(sizes):
        raise DeviceSetupError(
            f"backend='ray' with islands={tuple(sizes)} lowers programs over {sum(sizes)} "
            f"virtual CPU devices of this process, but JAX was initialized with {len(pool)}. "
            f"Create the controller before any JAX operation, or set "
            f"jax.config.update('jax_num_cpu_devices', {sum(sizes)}) first.")
    return pool


class _JaxSetup:
    """JAX's host device count before a controller asked for stand-ins, put back by
    ``restore`` if JAX has not started since (a failed attach changes nothing)."""

    def __init__(self):
        self.started = _jax_started()
        self.count = jax.config.jax_num_cpu_devices

    def restore(self) -> None:
        if not self.started and not _jax_started():
            jax.config.update("jax_num_cpu_devices", self.count)


def _jax_started() -> bool:
    from jax._src import xla_bridge  # (JAX has no public "are backends up?")

    return xla_bridge.backends_are_initialized()


class RayBackend:
    """Owns the Ray connection and the island actors of one controller (the executor of
    ``backend="ray"``)."""

    name = "ray"
    program_ahead = True  # a program's nodes queue behind each other: one message for them

    def __init__(self, islands: Sequence[int] | None = DEFAULT_ISLANDS,
                 ray_address: str | None = None, address: str | None = None,
                 pool: str | None = None, tenant: str | None = None,
                 weight: float | None = None):
        address = _one_address(ray_address, address)
        self.pool = pool
        if pool is None and (tenant is not None or weight is not None):
            raise DeviceSetupError("tenant= and weight= name this controller in a pool; pass "
                                   "pool=NAME with them (and address=), or drop them.")
        if pool is not None:
            weight = attach.tenant_weight(weight)  # (refused before anything connects)
            if tenant is not None:
                attach.tenant_name(tenant)  # (likewise)
            address = attach.pool_address(pool, address)
        sizes = None if pool is not None and islands is None else tuple(
            int(n) for n in (islands if islands is not None else DEFAULT_ISLANDS))
        if sizes is not None and (not sizes or min(sizes) < 1):
            raise DeviceSetupError(f"islands must be a tuple of positive device counts, got "
                                   f"{islands!r}; e.g. islands=(4, 4).")
        if sizes is not None and sizes_problem(sizes):  # (before a cluster starts for them)
            raise DeviceSetupError(f"{sizes_problem(sizes)}; e.g. islands=(4, 4).")
        # JAX is asked for the stand-in devices now (before anything starts it), and started
        # only once the islands are up: a failed attach leaves it as it was, so the local
        # backend (or another attach) can still have the devices it asks for.
        before = _JaxSetup()
        if pool is None:
            request_host_devices(sum(sizes))
        try:
            cluster.connect(address, pool=pool)  # a pool on this machine lends its token
        except BaseException:
            before.restore()
            raise
        self.hosts: dict[int, IslandHost] = {}
        self._closed = False
        self.others: others.OtherTenants | None = None  # a pool's other tenants' work
        try:
            if pool is not None:
                hosts = attach.attach(pool, sizes, tenant, weight)
                sizes = tuple(h.devices for h in hosts)
            else:
                kind = _device_kind(sizes)
                hosts = [IslandHost(i, n, kind) for i, n in enumerate(sizes)]
            for i, host in enumerate(hosts):
                host.start()
                self.hosts[i] = host
            stand_ins = _stand_ins(sizes)
            islands_out, start = [], 0
            for i, host in enumerate(hosts):
                n = host.devices
                isl = RayIsland(i, tuple(stand_ins[start:start + n]), host.info["platform"])
                isl.__dict__["_host"] = host
                islands_out.append(isl)
                start += n
        except BaseException:
            self.close()
            before.restore()
            raise
        self.islands: tuple[RayIsland, ...] = tuple(islands_out)
        for host in self.hosts.values():
            host.on_lost = self._island_lost
        # id(executable) -> (weakref to it, key, bytes); an entry goes with its executable
        self._exports: dict[int, tuple] = {}
        self._export_keys = itertools.count()  # (a key is never reused: an island keeps it)
        self._export_lock = threading.Lock()
        self.sites = {isl.id: RaySite(isl, self.hosts[isl.id], self.exported)
                      for isl in self.islands}
        # a pool drops a tenant silent for its lease: renewed from a thread of its own
        self.keepalive = attach.KeepAlive(list(self.hosts.values())) if pool else None
        self._introduce()

    def _introduce(self) -> None:
        """Give every island's actor the others' handles (they send values to each other);
        a pool's islands know each other already."""
        import ray

        if self.pool is not None or not cluster.connected():
            return
        live = {i: h.actor for i, h in self.hosts.items() if h.actor is not None and not h.lost}
        ray.get([actor.peers.remote({j: a for j, a in live.items() if j != i})
                 for i, actor in live.items()])

    def _island_lost(self, host: IslandHost) -> None:
        """Tell the other islands: a ``recv`` from the lost one fails instead of waiting."""
        if not cluster.connected():  # (they ended with the connection; a call would start
            return  # a new local cluster)
        for other in self.hosts.values():
            if other is not host and other.actor is not None and not other.lost:
                other.actor.source_lost.remote(host.island, host.generation)

    # --- the executor interface ------------------------------------------------------------
    now = staticmethod(time.perf_counter)

    def record_into(self, trace) -> None:
        """In a pool: the other tenants' computations go into the controller's trace too."""
        if self.pool is not None and self.others is None:
            self.others = others.OtherTenants(trace, self.hosts, self.islands)
            self.others.start()

    def prepare(self, plan) -> None:
        """Serialize each computation's executable for its island's platform, once."""
        for node in plan.nodes:
            if node.is_compute:
                self.exported(node, self.hosts[node.island])

    def forget_export(self, ident: int, key: str) -> None:
        """Its export goes, and the islands that compiled it drop their executable with their
        next message, as the local backend lets it go. Runs in a GC callback: no lock and no
        Ray call here (the frees' path sends it)."""
        entry = self._exports.get(ident)
        if entry is not None and entry[1] == key:
            self._exports.pop(ident, None)
        for host in self.hosts.values():
            if key in host.sent:
                host.sent.discard(key)
                host.free(host.generation, key)

    def exported(self, node, host: IslandHost) -> tuple[str, bytes | None]:
        """The serialized ``jax.export`` of a node's executable, and its cache key; the bytes
        are sent only to an island that has not compiled it yet."""
        exe = node.exe
        with self._export_lock:
            entry = self._exports.get(id(exe))
            if entry is None or entry[0]() is not exe:
                # jax.export takes only a jax.jit function and traces it itself (a Lowered is
                # for this process, docs/ray.md): what it traces is the jaxpr recorded when
                # the function was first traced, so the user's Python runs once, not again.
                body = jitted(exe)
                structs = exe.structs
                platform = "cuda" if host.platform == "gpu" else "cpu"
                # under the slice's mesh, as when it was traced: its types name its axes
                with jax.set_mesh(node.fn.slice.mesh):
                    try:
                        blob = bytes(jax.export.export(body, platforms=[platform])(*structs)
                                     .serialize())
                    except Exception as e:  # host callbacks fail in several ways in there
                        hosts = callbacks.found(body.trace(*structs).jaxpr)
                        if hosts:
                            raise callbacks.not_exportable(node.name, hosts) from e
                        raise
                key = f"{node.name}-{next(self._export_keys)}"
                entry = self._exports[id(exe)] = (weakref.ref(exe), key, blob)
                weakref.finalize(exe, _forget, weakref.ref(self), id(exe), key)
        _, key, blob = entry
        return key, (None if key in host.sent else blob)

    def launch(self, island: int, tasks: Sequence[Task]) -> None:
        site = self.sites[island]
        for task in tasks:
            site.launch(task)

    def transfer(self, task: Task) -> None:
        node = task.node
        site = self.sites[node.island]
        dst = self.hosts[node.island]
        try:
            if dst.lost or dst.actor is None:
                raise host_lost(dst)
            value = task.inputs()[0]
            lay = layout(node.sharding, site.island)
            handle = RemoteBuffer(dst, dst.new_id())
            settings = jax_settings()  # (the dtypes a value is placed with there)
            if isinstance(value, RemoteBuffer):
                if not value.alive:
                    raise value.lost_error()
                if value.donated is not None:
                    raise deleted_input(f"it was given to {value.donated}, which donates it "
                                        "and now owns its buffer, before this copy of it")
                if value.host is dst:  # inside the island: reshard there
                    site.enqueue(("reshard", value.bid, handle.bid, lay), task, [handle])
                else:  # island to island: the source pushes the value to the destination
                    # (to a pool's island, for this tenant: its secret there travels along)
                    to = () if self.pool is None else (dst.actor.secret,)
                    self.sites[value.host.island].enqueue(
                        ("send", value.bid, dst.island, handle.bid, *to), None, [])
                    site.enqueue(("recv", handle.bid, lay, value.host.island,
                                  value.host.generation, settings), task, [handle],
                                 value.host)
            else:  # a host value (program argument, constant, a fetched result)
                site.enqueue(("put", handle.bid, to_host(value), lay, settings), task,
                             [handle])
        except BaseException as e:  # noqa: BLE001 - failed in order, by the island's watcher
            site.enqueue(None, task, [], error=copy_error(node.name, task.inputs()[0], e))
            return
        task.launched([handle])

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Every island's site pauses its launches until the block ends: a program submitted
        inside reaches each island in one message."""
        sites = list(self.sites.values())
        for site in sites:
            site.pause()
        try:
            yield
        finally:
            for site in sites:
                site.resume()

    def fetch(self, value, sharding) -> Any:
        return value.fetch(sharding) if isinstance(value, RemoteBuffer) else value

    def reattach(self, island: int) -> RayIsland:
        """Start a new actor for ``island`` (killing the old one if it still runs)."""
        if island not in self.hosts:
            raise DeviceSetupError(f"island {island!r} does not exist; this controller has "
                                   f"islands {sorted(self.hosts)}.")
        host = self.hosts[island]
        if not cluster.connected():
            raise DeviceSetupError(f"cannot reattach island {island}: {host.lost_advice()}.")
        host.mark_lost()  # the other islands stop waiting for values from the old actor
        host.kill()
        host.start()
        self._introduce()
        return self.islands[island]

    def buffers(self, island: int) -> dict[int, int]:
        """The buffers the island's actor holds once the frees pending now are done."""
        import ray

        sent = self.sites[island].sync()
        if sent is None:
            raise DeviceSetupError(f"island {island} was lost; "
                                   f"{self.hosts[island].lost_advice()} first.")
        actor, seq = sent
        return ray.get(actor.buffers.remote(seq))

    def islands_fix(self, sizes: tuple[int, ...]) -> str | None:
        """How to get islands of ``sizes`` devices (the runtime's slice errors ask): a pool's
        tenant has the pool's islands, so a pool that has them; None otherwise (the runtime's
        own advice, a controller of one's own, holds)."""
        if self.pool is None:
            return None
        return (f"pool {self.pool!r} with islands that large (its tenants share the pool's "
                f"islands): python -m pwkernel.pool stop --name {self.pool}, then python -m "
                f"pwkernel.pool start --name {self.pool} --islands {','.join(map(str, sizes))}"
                ", and attach again")

    def status(self, island: int | None = None) -> IslandFacts | dict[str, Any]:
        """One island's actor (for ``ctl.status()``), or the whole cluster's view."""
        if island is not None:
            return IslandFacts.of(self.sites[island].status())
        out = {"token_auth": cluster.token_auth_enabled(),
               "islands": {i: {"pid": h.info.get("pid"), "host": h.info.get("host"),
                               "generation": h.generation, "lost": h.lost,
                               "clock_offset": h.offset} for i, h in self.hosts.items()}}
        if self.pool is not None:
            if self.others is not None:
                self.others.pull()  # what a view shows next has the others' latest work
            out["pool"] = attach.pool_view(self.pool, list(self.hosts.values()))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(self, "keepalive", None) is not None:
            self.keepalive.close()
        if self.others is not None:
            self.others.close()
        sites = getattr(self, "sites", {}).values()
        if self.pool is not None:
            # A pool's islands drop this tenant's work they have not launched yet when it
            # unregisters, once they have taken its last message: so it leaves before its
            # watchers wait (they would wait for all it sent to run, holding the devices
            # other tenants wait for; a closed controller reads none of it).
            for site in sites:
                site.stop_sending()
            for host in self.hosts.values():
                host.kill()
        for site in sites:
            site.close()
        for host in self.hosts.values():
            host.kill()
        cluster.disconnect()


def _forget(backend_ref, ident: int, key: str) -> None:
    """An executable the controller let go (its function's caches dropped it, or
    ``jax.clear_caches()`` cleared them), for its backend if it is still there (a GC callback:
    ``RayBackend.forget_export``)."""
    backend = backend_ref()
    if backend is not None:
        backend.forget_export(ident, key)

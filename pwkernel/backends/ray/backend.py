"""The Ray backend: islands are Ray actors, each a process with its own JAX devices.

The controller keeps everything that decides: tracing (lowered over stand-in meshes of its own
virtual CPU devices, one per island device, then exported for the island's platform), the
per-island gang schedulers, futures, the object store and the trace. The actors only compile,
run, hold buffers and move bytes.

>>> ctl = pw.Controller(backend="ray", islands=(4, 4))          # doctest: +SKIP
>>> ctl.islands[0].actor                                         # doctest: +SKIP
Actor(IslandActor, ...)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax

from ...runtime.errors import DeviceSetupError
from ...runtime.resources import Island
from .. import local
from . import cluster
from .cluster import IslandHost
from .dispatch import RayDispatcher, RayIslandExecutor

DEFAULT_ISLANDS = (4, 4)


class RayIsland(Island):
    """An island served by a Ray actor; ``actor`` is its current handle (it changes on
    ``ctl.reattach``). ``devices`` are the controller's stand-in devices used for lowering."""

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


class RayBackend:
    """Owns the Ray connection and the island actors of one controller."""

    name = "ray"

    def __init__(self, islands: Sequence[int] | None, address: str | None):
        sizes = tuple(int(n) for n in (islands if islands is not None else DEFAULT_ISLANDS))
        if not sizes or min(sizes) < 1:
            raise DeviceSetupError(f"islands must be a tuple of positive device counts, got "
                                   f"{islands!r}; e.g. islands=(4, 4).")
        if address is not None and not isinstance(address, str):
            raise DeviceSetupError(f"ray_address must be a string ('auto' or 'host:port') or "
                                   f"None, got {type(address).__name__}.")
        # Stand-in devices for lowering: one host CPU device of this process per island device.
        local.request_host_devices(sum(sizes))
        pool = jax.devices("cpu")
        if len(pool) < sum(sizes):
            raise DeviceSetupError(
                f"backend='ray' with islands={sizes} lowers programs over {sum(sizes)} virtual "
                f"CPU devices of this process, but JAX was initialized with {len(pool)}. Create "
                f"the controller before any JAX operation, or set "
                f"jax.config.update('jax_num_cpu_devices', {sum(sizes)}) first.")
        cluster.connect(address)
        self.hosts: dict[int, IslandHost] = {}
        self._closed = False
        try:
            kind = _device_kind(sizes)
            islands_out, start = [], 0
            for i, n in enumerate(sizes):
                host = IslandHost(i, n, kind)
                host.start()
                self.hosts[i] = host
                isl = RayIsland(i, tuple(pool[start:start + n]), host.info["platform"])
                isl.__dict__["_host"] = host
                islands_out.append(isl)
                start += n
        except BaseException:
            self.close()
            raise
        self.islands: tuple[RayIsland, ...] = tuple(islands_out)
        self.dispatcher: RayDispatcher | None = None
        self._introduce()

    def _introduce(self) -> None:
        """Give every island's actor the others' handles (they send values to each other)."""
        import ray

        live = {i: h.actor for i, h in self.hosts.items() if h.actor is not None and not h.lost}
        ray.get([actor.peers.remote({j: a for j, a in live.items() if j != i})
                 for i, actor in live.items()])

    def make_dispatcher(self, store, trace, transfers, mode, policy, memory_budget):
        d = RayDispatcher(store, trace, transfers, mode, self.hosts)
        for isl in self.islands:
            d.islands[isl.id] = RayIslandExecutor(isl, self.hosts[isl.id], d, policy,
                                                  memory_budget)
        self.dispatcher = d
        return d

    def reattach(self, island: int) -> RayIsland:
        """Start a new actor for ``island`` (killing the old one if it still runs)."""
        if island not in self.hosts:
            raise DeviceSetupError(f"island {island!r} does not exist; this controller has "
                                   f"islands {sorted(self.hosts)}.")
        host = self.hosts[island]
        host.mark_lost()  # the other islands stop waiting for values from the old actor
        host.kill()
        host.start()
        self._introduce()
        return self.islands[island]

    def buffers(self, island: int) -> dict[int, int]:
        """The buffers the island's actor holds once the frees pending now are done."""
        import ray

        sent = self.dispatcher.islands[island].sync()
        if sent is None:
            raise DeviceSetupError(f"island {island} was lost; ctl.reattach({island}) first.")
        actor, seq = sent
        return ray.get(actor.buffers.remote(seq))

    def status(self) -> dict[str, Any]:
        return {"token_auth": cluster.token_auth_enabled(),
                "islands": {i: {"pid": h.info.get("pid"), "host": h.info.get("host"),
                                "generation": h.generation, "lost": h.lost,
                                "clock_offset": h.offset} for i, h in self.hosts.items()}}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            host.kill()
        cluster.disconnect()

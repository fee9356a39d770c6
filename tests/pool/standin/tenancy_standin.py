"""A stand-in for pool-core's ``tenancy`` (the shared design's signatures, no scheduling):
detached actors named ``island-<i>`` in namespace ``pwkernel-pool-<NAME>`` that report
``info()`` and an empty ``pool_status()``. Used by tests/pool/ only while the real module is
missing (see ``sitecustomize.py``)."""

from __future__ import annotations

import os

import ray

from pwkernel.runtime.errors import DeviceSetupError


def namespace(pool: str) -> str:
    return f"pwkernel-pool-{pool}"


class PoolIslandActor:
    def __init__(self, island: int, devices: int, platform: str, pool: str, lease: float):
        self.island, self.devices, self.platform = island, devices, platform
        self.pool, self.lease = pool, lease

    def info(self) -> dict:
        return {"island": self.island, "devices": list(range(self.devices)),
                "platform": self.platform, "pid": os.getpid()}

    def pool_status(self) -> dict:
        return {"island": self.island, "devices": self.devices, "platform": self.platform,
                "pid": os.getpid(), "tenants": [], "bytes": 0, "launches": 0}


def find_islands(pool: str) -> list:
    handles, i = [], 0
    while True:
        try:
            handles.append(ray.get_actor(f"island-{i}", namespace=namespace(pool)))
        except ValueError:
            break
        i += 1
    if not handles:
        raise DeviceSetupError(f"no pool {pool!r} on this Ray cluster; start it with "
                               f"python -m pwkernel.pool start --name {pool} --islands 4,4")
    return handles


def create_islands(pool: str, sizes: tuple[int, ...], platform: str,
                   lease: float) -> list[dict]:
    try:
        find_islands(pool)
    except DeviceSetupError:
        pass
    else:
        raise DeviceSetupError(f"pool {pool!r} already has island actors on this cluster")
    actors = [ray.remote(PoolIslandActor).options(
        name=f"island-{i}", namespace=namespace(pool), lifetime="detached", num_cpus=0,
        max_restarts=0).remote(i, n, platform, pool, lease) for i, n in enumerate(sizes)]
    return ray.get([a.info.remote() for a in actors], timeout=300)


def destroy_islands(pool: str) -> None:
    for handle in find_islands(pool):
        ray.kill(handle, no_restart=True)

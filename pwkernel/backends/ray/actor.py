"""The island process: one Ray actor per island, owning that island's JAX devices and buffers.

The actor knows nothing of programs, futures or scheduling. The controller sends it
serialized ``jax.export`` artifacts (compiled here once per island and cached), and one method
call per launch; Ray runs an actor's calls one at a time in submission order, so the island
executes computations in the order the controller's gang scheduler chose. Buffers stay in the
island's device memory under integer ids the controller assigns (so it can name an output
before it exists); values leave the island only when asked (``fetch``, ``send``).

Every call that does work returns a small completion record with times on this process's
clock (``time.perf_counter``); the controller maps them onto its own clock with the offset it
measured at start (``clock``).

A layout (how a buffer is laid out on the island) is ``(positions, mesh_shape, axis_names,
spec)``: ``positions`` are indices into this island's devices, in mesh order.
"""

from __future__ import annotations

import os
import time
from typing import Any

_now = time.perf_counter


class IslandActor:
    """One island: ``devices`` JAX devices of this process (virtual CPU devices or GPUs).

    Created by the controller as ``ray.remote(IslandActor).options(max_concurrency=1)``.
    """

    def __init__(self, island: int, devices: int, platform: str):
        self.island = island
        if platform == "cpu":
            os.environ["JAX_PLATFORMS"] = "cpu"
        import jax  # imported here: the device count must be set before JAX initializes

        if platform == "cpu":
            jax.config.update("jax_num_cpu_devices", devices)
        self._jax = jax
        pool = jax.devices()
        if len(pool) < devices:
            raise RuntimeError(f"island {island} needs {devices} {platform} devices but its "
                               f"process sees {len(pool)} ({pool[0].platform}).")
        self.devices = pool[:devices]
        self._buffers: dict[int, Any] = {}
        self._executables: dict[str, Any] = {}
        self._meshes: dict[tuple, Any] = {}

    # --- set-up and introspection ----------------------------------------------------------
    def info(self) -> dict:
        import socket

        return {"island": self.island, "platform": self.devices[0].platform,
                "devices": [str(d) for d in self.devices], "pid": os.getpid(),
                "host": socket.gethostname()}

    def clock(self) -> float:
        """This process's clock, for the controller's offset measurement."""
        return _now()

    def buffers(self) -> dict[int, int]:
        """Live buffer ids and their bytes (on all devices together)."""
        return {bid: int(a.nbytes) for bid, a in self._buffers.items()}

    def executables(self) -> list[str]:
        return sorted(self._executables)

    # --- layouts ---------------------------------------------------------------------------
    def _sharding(self, layout):
        import numpy as np
        from jax.sharding import Mesh, NamedSharding

        positions, shape, names, spec = layout
        key = (positions, shape, names)
        mesh = self._meshes.get(key)
        if mesh is None:
            grid = np.array([self.devices[p] for p in positions], dtype=object).reshape(shape)
            mesh = self._meshes[key] = Mesh(grid, names)
        return NamedSharding(mesh, spec)

    def _arg(self, ref, layout):
        """An input: a buffer id of this island, or a host array to place."""
        if isinstance(ref, int):
            if ref not in self._buffers:
                raise KeyError(f"buffer {ref} is not on island {self.island} (its producer "
                               "failed, or it was freed)")
            return self._buffers[ref]
        return self._jax.device_put(ref, self._sharding(layout))

    # --- work ------------------------------------------------------------------------------
    def _compiled(self, key: str, blob: bytes | None, in_layouts, out_layouts):
        exe = self._executables.get(key)
        if exe is not None:
            return exe
        if blob is None:
            raise KeyError(f"executable {key} was never sent to island {self.island}")
        jax = self._jax
        exported = jax.export.deserialize(bytearray(blob))
        in_sh = tuple(self._sharding(lay) for lay in in_layouts)
        out_sh = tuple(self._sharding(lay) for lay in out_layouts)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                   for a, sh in zip(exported.in_avals, in_sh, strict=True)]
        jitted = jax.jit(exported.call, in_shardings=in_sh, out_shardings=out_sh)
        exe = self._executables[key] = jitted.lower(*structs).compile()
        return exe

    def run(self, key: str, blob: bytes | None, in_layouts, out_layouts, inputs: list,
            outputs: list[int]) -> dict:
        """Run one computation: inputs are buffer ids (or host arrays), outputs get ``outputs``."""
        t0 = _now()
        try:
            exe = self._compiled(key, blob, in_layouts, out_layouts)
            args = [self._arg(r, lay) for r, lay in zip(inputs, in_layouts, strict=True)]
            t_start = _now()
            outs = exe(*args)
            self._jax.block_until_ready(outs)
            t_end = _now()
        except Exception as e:  # noqa: BLE001 - the record carries the error to the controller
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "t_start": t0,
                    "t_end": _now()}
        for bid, out in zip(outputs, outs, strict=True):
            self._buffers[bid] = out
        return {"ok": True, "t_start": t_start, "t_end": t_end}

    def put(self, bid: int, value, layout) -> dict:
        """A host value arrives (a program argument or constant)."""
        t_start = _now()
        try:
            self._buffers[bid] = self._arg(value, layout)
            self._buffers[bid].block_until_ready()
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "t_start": t_start,
                    "t_end": _now()}
        return {"ok": True, "t_start": t_start, "t_end": _now()}

    def reshard(self, src: int, bid: int, layout) -> dict:
        """A transfer inside the island (the paper's ICI): another layout of one buffer."""
        t_start = _now()
        try:
            out = self._jax.device_put(self._arg(src, None), self._sharding(layout))
            self._buffers[bid] = out.block_until_ready()
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "t_start": t_start,
                    "t_end": _now()}
        return {"ok": True, "t_start": t_start, "t_end": _now()}

    def send(self, src: int) -> tuple:
        """The first half of a transfer to another island: the value and when it left.

        The controller passes the ObjectRef of this result straight to the destination's
        ``receive``; Ray moves the bytes between the two processes (or machines)."""
        import numpy as np

        t_start = _now()
        return np.asarray(self._arg(src, None)), t_start

    def receive(self, sent: tuple, bid: int, layout) -> dict:
        value, t_src = sent
        record = self.put(bid, value, layout)
        record["t_src"] = t_src
        return record

    def fetch(self, bid: int):
        """A buffer's value as a host array (the controller asked for ``fut.result()``)."""
        import numpy as np

        return np.asarray(self._arg(bid, None))

    def free(self, bids: list[int]) -> int:
        """Delete buffers; returns how many were live."""
        n = 0
        for bid in bids:
            arr = self._buffers.pop(bid, None)
            if arr is not None:
                n += 1
                try:
                    arr.delete()
                except Exception:  # noqa: BLE001 - already deleted: nothing left to free
                    pass
        return n

"""How an island process issues operations on its devices and sees them end.

Shared by the two island actors: the single controller's (``actor.py``), which issues one
controller's messages in their order, and the pool's (``tenancy.py``), which issues the
messages of every tenant in the order its gang scheduler decides. Both hand this module an
operation and the buffers it may use (a dict of buffer id -> array: the island's, or one
tenant's), so the two never differ in what an operation does.

A layout (how a buffer is laid out on the island) is ``(positions, mesh_shape, axis_names,
spec)``: ``positions`` are indices into this island's devices, in mesh order. The operations
are listed in ``actor.py``'s docstring; ``issue`` starts one and returns the *item* the
completion side waits for, ``complete`` waits for it and makes its completion record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...runtime.compiled import Latest
from .hostvalues import from_host, to_host
from .sending import Sends

now = time.perf_counter


# Where an operation carries the controller's JAX settings (``settings`` below), by kind.
SETTINGS_AT = {"run": 10, "put": 5, "recv": 6}
DONATED_AT = 11  # a run's donated input positions (donate_argnums), after its settings
# A pool island's compiled executables kept by ``content_key`` for the next tenants (its own
# next attach, another notebook of the same code); each tenant also holds those it uses, by its
# own keys, until it leaves, so dropping one from these never takes it from a tenant.
KEEP_EXECUTABLES = 128
# The settings of the controller that an island applies to what it runs: dtypes (float64 and
# int64 exist only under x64) and the NaN/Inf checks of jax.jit's call.
JAX_SETTINGS = ("jax_enable_x64", "jax_debug_nans", "jax_debug_infs")


def jax_settings() -> tuple[tuple[str, bool], ...]:
    """This thread's values of ``JAX_SETTINGS`` (the controller's, sent with operations)."""
    import jax

    return tuple((name, bool(getattr(jax.config, name))) for name in JAX_SETTINGS)


@contextlib.contextmanager
def configured(settings) -> Iterator[None]:
    """``settings`` (``jax_settings()``'s) in force in this thread: JAX's own context
    managers, so the island's other threads (and a pool's other tenants) keep theirs."""
    import jax

    states = {"jax_enable_x64": jax.enable_x64, "jax_debug_nans": jax.debug_nans,
              "jax_debug_infs": jax.debug_infs}
    with contextlib.ExitStack() as stack:
        for name, value in settings or ():
            state = states.get(name)
            if state is not None:
                stack.enter_context(state(value))
        yield


def error_fields(error: BaseException) -> dict:
    """What a completion record says of ``error``: its text, and its type by import path
    (``module:qualname``) so the controller can raise the same type (``island.py``)."""
    cls = type(error)
    return {"error": f"{cls.__name__}: {error}", "message": str(error),
            "type": f"{cls.__module__}:{cls.__qualname__}"}


class Failed(Exception):
    """An operation that failed when it was issued (``fields``: its record's error fields)."""

    def __init__(self, fields: dict):
        super().__init__(fields["error"])
        self.fields = fields


class IslandDevices:
    """One island's JAX devices (virtual CPU devices or GPUs of this process), the meshes
    over them, and the issuing of operations on them (``shared``: a pool's island, where
    tenants that send the same computation share one compiled executable)."""

    def __init__(self, island: int, devices: int, platform: str,
                 shared: bool = False):
        self.island = island
        if platform == "cpu":
            os.environ["JAX_PLATFORMS"] = "cpu"
        import jax  # imported here: the device count must be set before JAX initializes

        if platform == "cpu":
            jax.config.update("jax_num_cpu_devices", devices)
        self.jax = jax
        pool = jax.devices()
        if len(pool) < devices:
            raise RuntimeError(f"island {island} needs {devices} {platform} devices but its "
                               f"process sees {len(pool)} ({pool[0].platform}).")
        self.devices = pool[:devices]
        self._meshes: dict[tuple, Any] = {}
        self.last_end: dict[int, float] = {}  # device position -> when its last work ended
        self.shared = Latest(KEEP_EXECUTABLES) if shared else None  # by ``content_key``
        self.sends = Sends()  # sends issued, not read yet (``sending.py``)

    def info(self) -> dict:
        import socket

        import ray

        return {"island": self.island, "platform": self.devices[0].platform,
                "devices": [str(d) for d in self.devices], "pid": os.getpid(),
                "host": socket.gethostname(),
                "actor": ray.get_runtime_context().get_actor_id()}

    # --- layouts and executables -----------------------------------------------------------
    def sharding(self, layout):
        import numpy as np
        from jax.sharding import Mesh, NamedSharding

        positions, shape, names, spec = layout
        key = (positions, shape, names)
        mesh = self._meshes.get(key)
        if mesh is None:
            grid = np.array([self.devices[p] for p in positions], dtype=object).reshape(shape)
            mesh = self._meshes[key] = Mesh(grid, names)
        return NamedSharding(mesh, spec)

    def arg(self, buffers: dict, ref, layout):
        """An input: a buffer id in ``buffers``, or a host array to place."""
        if isinstance(ref, int):
            if ref not in buffers:
                raise KeyError(f"buffer {ref} is not on island {self.island} (its producer "
                               "failed, or it was freed)")
            return buffers[ref]
        return from_host(ref, self.sharding(layout))

    def compiled(self, executables: dict, key: str, blob: bytes | None, in_layouts,
                 out_layouts, donated: tuple[int, ...] = (), settings=()):
        """The executable the caller calls ``key`` (``executables``: the caller's, by its
        keys), compiled from ``blob`` the first time; with ``shared`` (a pool's island), one
        already compiled from the same content for anyone is reused."""
        exe = executables.get(key)
        if exe is not None:
            return exe
        if blob is None:
            raise KeyError(f"executable {key} was never sent to island {self.island}")
        exported = self.jax.export.deserialize(bytearray(blob))
        digest = None
        if self.shared is not None:
            digest = content_key(exported, in_layouts, out_layouts, donated, settings)
            exe = self.shared.get(digest)
        if exe is None:
            exe = self._compile(exported, in_layouts, out_layouts, donated)
        if digest is not None:
            self.shared.put(digest, exe)
        executables[key] = exe
        return exe

    def _compile(self, exported, in_layouts, out_layouts, donated: tuple[int, ...]):
        jax = self.jax
        in_sh = tuple(self.sharding(lay) for lay in in_layouts)
        out_sh = tuple(self.sharding(lay) for lay in out_layouts)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                   for a, sh in zip(exported.in_avals, in_sh, strict=True)]
        fence = _fence_sharding((*in_sh, *out_sh))

        def fenced(*args):  # the fence last: see ``Fenced``
            return (*exported.call(*args), self.jax.numpy.zeros((), self.jax.numpy.uint8))

        fenced.__name__ = exported.fun_name  # (jit_<name> in the island's logs, as at home)

        jitted = jax.jit(fenced, in_shardings=in_sh, out_shardings=(*out_sh, fence),
                         donate_argnums=tuple(donated))
        with jax.debug_nans(False):  # (donating what the controller's executable donates)
            exe = jitted.lower(*structs).compile()
        from ...runtime.callbacks import sub_byte

        if sub_byte(exported.in_avals):  # (int4/uint4 inputs: jax.jit's own call)
            exe = jitted
        return Fenced(exe)

    # --- issuing ---------------------------------------------------------------------------
    def issue(self, op: tuple, t_launch: float, buffers: dict, executables: dict,
              arrived: Callable[[int, int, int], tuple | None],
              deliver: Callable[[tuple], Callable]) -> tuple | None:
        """Start one operation; returns the item ``complete`` waits for (None for a free).

        ``arrived(bid, island, generation)``: a ``recv``'s value as ``(value, error, t_src)``,
        or None when its source island was lost. ``deliver(op)``: for a ``send``, the function
        that hands ``(bid, value, error, t_src)`` to the destination."""
        kind = op[0]
        at = SETTINGS_AT.get(kind)
        if at is not None and len(op) > at:
            with configured(op[at]):  # the controller's dtypes and checks
                return self._issue(op, t_launch, buffers, executables, arrived, deliver)
        return self._issue(op, t_launch, buffers, executables, arrived, deliver)

    def _issue(self, op: tuple, t_launch: float, buffers: dict, executables: dict,
               arrived, deliver) -> tuple | None:
        kind = op[0]
        if kind == "run":
            _, rid, key, blob, in_layouts, out_layouts, inputs, outputs, *_ = op
            donated = op[DONATED_AT] if len(op) > DONATED_AT else ()
            settings = op[SETTINGS_AT[kind]] if len(op) > SETTINGS_AT[kind] else ()
            exe = self.compiled(executables, key, blob, in_layouts, out_layouts, donated,
                                settings)
            t_launch = now()  # compiling (the first time) is host work, not device time
            args = [self.arg(buffers, r, lay)
                    for r, lay in zip(inputs, in_layouts, strict=True)]
            if donated:  # a send issued before it still reads what it donates
                self.sends.before_donating([args[i] for i in donated], self._copy)
            outs, fence = exe(*args)
            for bid, out in zip(outputs, outs, strict=True):
                buffers[bid] = out
            return ("done", rid, fence, t_launch, compute_positions(op), None)
        if kind == "put":
            _, rid, bid, value, layout, *_ = op
            out = buffers[bid] = self.arg(buffers, value, layout)
            return ("done", rid, out, t_launch, (), None)
        if kind == "reshard":
            _, rid, src, bid, layout = op
            # a copy, never an alias of the source (overlapping slices share devices)
            out = self.jax.device_put(self.arg(buffers, src, None), self.sharding(layout),
                                      may_alias=False)
            buffers[bid] = out
            return ("done", rid, out, t_launch, (), None)
        if kind == "send":
            _, rid, src, _island, bid, *_ = op
            to = deliver(op)
            return ("send", rid, self.sends.issued(buffers.get(src)), t_launch, (to, bid), None)
        if kind == "recv":
            _, rid, bid, layout, island, generation, *_ = op
            got = arrived(bid, island, generation)
            if got is None:
                raise RuntimeError(f"island {island} was lost before it sent buffer {bid}")
            value, error, t_src = got
            if error is not None:
                raise RuntimeError(error)
            out = buffers[bid] = self.arg(buffers, value, layout)
            return ("done", rid, out, t_launch, (), t_src)
        if kind == "free":
            for bid in op[1]:  # (a str: an executable the controller let go)
                (executables if isinstance(bid, str) else buffers).pop(bid, None)
            return None  # (freed when the last computation using it ends)
        raise ValueError(f"island {self.island}: unknown operation {kind!r}")

    def failed(self, op: tuple, error: Exception, t_launch: float) -> tuple:
        """The item of an operation whose issue raised ``error`` (JAX's NaN/Inf check error
        becomes the ``FloatingPointError`` ``jax.jit`` raises, as on the local backend)."""
        if op[0] == "run":
            from ...runtime.errors import launch_error

            error = launch_error(error, op[8] if len(op) > 8 else op[2])
        return ("error", op[1], error_fields(error), t_launch, (), None)

    # --- seeing issued work end --------------------------------------------------------------
    def complete(self, item: tuple) -> dict:
        """Wait for ``item`` to end; its completion record (times on this process's clock).
        Items complete in issue order per caller, so ``last_end`` is up to date."""
        kind, rid, value, t_launch, extra, t_src = item
        record: dict = {"rid": rid, "ok": True}
        try:
            if kind == "error":
                raise Failed(value)
            if kind == "send":
                self._send(value, *extra, t_launch)
            else:
                _wait(self.jax, value)
        except Exception as e:  # noqa: BLE001 - the record carries it to the controller
            record |= {"ok": False} | (e.fields if isinstance(e, Failed) else error_fields(e))
        t_end = now()
        # A computation starts when it was issued, or when its devices finished the work
        # issued before it, whichever is later.
        devices = extra if kind == "done" else ()
        t_start = max([t_launch, *(self.last_end.get(p, 0.0) for p in devices)])
        for p in devices:
            self.last_end[p] = t_end
        record |= {"t_start": min(t_start, t_end), "t_end": t_end}
        if t_src is not None:
            record["t_src"] = t_src
        return record

    def _copy(self, array):
        """A copy of ``array`` on its devices (never an alias of it)."""
        return self.jax.device_put(array, array.sharding, may_alias=False)

    def _send(self, sending, deliver, bid: int, t_launch: float) -> None:
        if sending.array is None:
            deliver(bid, None, f"the value to send (island {self.island}) was never made: "
                    "its producer failed", t_launch)
            raise RuntimeError("nothing to send: the producer failed")
        try:
            value = self.sends.read(sending, to_host)
        except Exception as e:  # noqa: BLE001 - the receiver fails with the same error
            deliver(bid, None, f"{type(e).__name__}: {e}", t_launch)
            raise
        deliver(bid, value, None, t_launch)


def content_key(exported, *made_with) -> str:
    """What an executable is compiled from, leaving out where its code was written: the
    computation (its StableHLO without debug locations, as a notebook cell's file name differs
    from kernel to kernel), its signature and ``made_with`` (layouts, donations, settings)."""
    from jax._src.interpreters import mlir  # (JAX has no public "print without locations")
    from jax._src.lib.mlir import ir

    try:
        with mlir.make_ir_context():
            text = ir.Module.parse(exported.mlir_module()).operation.get_asm(
                enable_debug_info=False)
    except Exception:  # noqa: BLE001 - one it cannot print is shared by exact bytes only
        text = exported.mlir_module_serialized
    signature = [(f.name, repr(getattr(exported, f.name))) for f in dataclasses.fields(exported)
                 if not f.name.startswith("_") and f.name != "mlir_module_serialized"]
    return hashlib.sha256(repr((text, signature, made_with)).encode()).hexdigest()


class Fenced:
    """A compiled computation with one more output, its *fence* (one byte nobody else sees:
    ready once the whole computation has run): a call returns ``(outputs, fence)``. Its end
    is watched on the fence, never on the outputs, which a later launch may donate (a
    training state given on step to step) before the island looks at them."""

    __slots__ = ("call",)

    def __init__(self, call):
        self.call = call

    def __call__(self, *args) -> tuple[list, Any]:
        *outs, fence = self.call(*args)
        return outs, fence


def _fence_sharding(shardings):
    """The fence's place: replicated over the computation's devices (its first layout's)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(shardings[0].mesh, PartitionSpec()) if shardings else None


def _wait(jax, value) -> None:
    """Wait for ``value`` (an array, or a list of them) to be made. One that a later launch
    took (donated) before this wait is made already: the launch that took it waits for it."""
    try:
        jax.block_until_ready(value)
    except Exception:
        leaves = jax.tree_util.tree_leaves(value)
        if not any(isinstance(a, jax.Array) and a.is_deleted() for a in leaves):
            raise
        jax.block_until_ready([a for a in leaves
                               if not (isinstance(a, jax.Array) and a.is_deleted())])


def compute_positions(op: tuple) -> frozenset[int]:
    """The device positions a ``run`` operation computes on (its layouts' devices)."""
    in_layouts, out_layouts = op[4], op[5]
    return frozenset(p for lay in (*in_layouts, *out_layouts) for p in lay[0])

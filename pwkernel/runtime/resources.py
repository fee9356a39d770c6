"""Islands, virtual slices and the resource manager that maps virtual devices to physical ones.

An island is a group of devices joined by a fast interconnect (the paper's ICI). A virtual slice
is a mesh-shaped set of virtual devices on one island; the resource manager places it on
physical devices, spreading load, and may move it later (``remap``), after which the functions
placed on it are lowered again. Slices are not exclusive: several may map onto the same devices
and are time-multiplexed by the island's gang scheduler.

A slice's mesh axes have JAX axis types: ``Explicit`` (shardings are part of array types,
JAX's sharding-in-types) or ``Auto`` (the compiler propagates shardings). The default is what
``jax.make_mesh`` gives in the installed JAX, so a slice's mesh behaves like the mesh JAX's own
tutorials make.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from .errors import ControllerClosedError, DeviceSetupError, SliceError
from .placements import placements
from .sizes import larger_island, more_islands, not_an_island_id

# The islands a controller gets when nothing names them (pw.Controller(), a backend made by
# name): 2 islands x 4 devices, the host CPU split into 8 on a machine without accelerators.
# The one definition; the backends import it.
DEFAULT_ISLANDS: tuple[int, ...] = (4, 4)


@dataclass(frozen=True)
class Island:
    """A group of devices joined by a fast interconnect. ``devices`` are JAX devices, or
    stand-ins of a simulated cluster (``simulated``: functions placed there are lowered for
    its chips, never compiled or run)."""

    id: int
    devices: tuple[Any, ...]
    platform: str
    simulated: bool = False

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices)

    def __repr__(self) -> str:
        return f"Island(id={self.id}, devices={list(self.device_ids)}, platform={self.platform!r})"


def _normalize_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        dims: tuple = (shape,)
    elif isinstance(shape, Sequence) and not isinstance(shape, str | bytes):
        dims = tuple(shape)
    else:
        dims = ()
    if not dims or any(not isinstance(d, int | np.integer) or isinstance(d, bool) or d < 1
                       for d in dims):
        raise SliceError(
            f"a slice shape must be a positive int or a tuple of positive ints, got {shape!r}. "
            "Maybe you want ctl.slice(2) or ctl.slice((2, 2))."
        )
    return tuple(int(d) for d in dims)


def islands_from_env(variable: str = "PWKERNEL_ISLANDS") -> tuple[int, ...] | None:
    """``PWKERNEL_ISLANDS="4,4"`` -> (4, 4); unset -> None (another ``variable`` alike)."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    try:
        sizes = tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise DeviceSetupError(f"{variable}={raw!r} is not a list of positive device "
                               f"counts; expected e.g. {variable}=4,4.")
    return sizes


def _what(v: Any) -> str:
    if isinstance(v, VirtualSlice):
        return f"a slice of another controller ({v.controller!r})"
    return type(v).__name__


class VirtualSlice:
    """A mesh of virtual devices on one island, placed on physical devices by the controller.

    >>> s = ctl.slice((2, 2), axis_names=("data", "model"))   # doctest: +SKIP
    >>> s.mesh.shape, s.axis_types                              # doctest: +SKIP
    ({'data': 2, 'model': 2}, (AxisType.Explicit, AxisType.Explicit))
    """

    _ids = itertools.count()

    def __init__(self, manager: ResourceManager, shape: tuple[int, ...],
                 axis_names: tuple[str, ...], island: Island, devices: tuple[Any, ...],
                 axis_types: tuple[AxisType, ...]):
        self.id = next(self._ids)
        self.shape = shape
        self.axis_names = axis_names
        self.axis_types = axis_types
        self._manager = manager
        self._island = island
        self._devices = devices
        self._mesh: tuple[tuple[Any, ...], Mesh] | None = None  # (the devices it is over, it)
        self.version = 0
        self.released = False

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def controller(self) -> Any:
        """The controller whose devices the slice is on (None for a bare manager)."""
        return self._manager.controller

    @property
    def island(self) -> Island:
        self.check_usable()
        return self._island

    @property
    def devices(self) -> tuple[Any, ...]:
        self.check_usable()
        return self._devices

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices)

    @property
    def mesh(self) -> Mesh:
        """A ``jax.sharding.Mesh`` over the physical devices the slice is mapped to now."""
        self.check_usable()
        devices, made = self._mesh or (None, None)
        if devices is not self._devices:  # (first use, or moved since: a remap on another
            devices = self._devices  # thread may change the devices while this builds)
            grid = np.array(devices, dtype=object).reshape(self.shape)
            made = Mesh(grid, self.axis_names, axis_types=self.axis_types)
            self._mesh = (devices, made)
        return made

    def ambient(self) -> contextlib.AbstractContextManager:
        """The slice's mesh as the ambient mesh (``with vs.ambient(): ...``), as
        ``jax.set_mesh`` makes it in plain JAX: ``jax.shard_map`` and ``jax.sharding.reshard``
        find it there. A simulated slice's chips exist only as its abstract mesh."""
        if self.island.simulated:
            return jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh)
        return jax.set_mesh(self.mesh)

    @property
    def axis_type_names(self) -> tuple[str, ...]:
        """The axis types in words: ``("explicit", "explicit")``."""
        return tuple(t.name.lower() for t in self.axis_types)

    def moved(self, island: Island, devices: tuple[Any, ...]) -> None:
        """The slice now lives on ``devices`` of ``island`` (its manager's ``remap`` says so;
        users call ``ctl.remap``): its mesh is built again and its ``version`` counts up."""
        self._island, self._devices, self._mesh = island, devices, None
        self.version += 1

    def check_usable(self) -> None:
        """Raise ``SliceError`` once the slice is released, ``ControllerClosedError`` once its
        controller is closed (naming the slice: a function placed on it stays bound to it
        after a new controller is made)."""
        try:
            self._manager.check_open()
        except ControllerClosedError:
            raise ControllerClosedError(
                f"slice {self.id} belongs to a controller that was closed, and what is placed "
                "on it (a pw.function, a program, a cell's --slice) cannot run any more. Make a "
                "slice on an open controller and place the function there again: "
                "pw.function(fn, slice=ctl.slice(...)).") from None
        if self.released:
            raise SliceError(
                f"slice {self.id} was released and can no longer be used; "
                "ask the controller for a new one with ctl.slice(...)."
            )

    def release(self) -> None:
        """Give the slice back; functions placed on it raise ``SliceError`` from now on."""
        if not self.released:
            self._manager.release(self)

    def __repr__(self) -> str:
        if self.released:
            return f"VirtualSlice(id={self.id}, released)"
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape, strict=True))
        return (f"VirtualSlice(id={self.id}, {dims}, {describe_axis_types(self.axis_types)}, "
                f"island={self._island.id}, devices={list(self.device_ids)})")


def _default_axis_names(ndim: int) -> tuple[str, ...]:
    return ("x", "y", "z", "w")[:ndim] if ndim <= 4 else tuple(f"a{i}" for i in range(ndim))


AXIS_TYPES = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}


def default_axis_type(device: Any) -> AxisType:
    """The axis type ``jax.make_mesh`` gives in the installed JAX (``Explicit`` today)."""
    if not isinstance(device, jax.Device):  # a simulated chip: ask with a host device
        device = jax.devices("cpu")[0]
    return jax.make_mesh((1,), ("x",), devices=[device]).axis_types[0]


def describe_axis_types(types: Sequence[AxisType | str]) -> str:
    """``"explicit"`` when every axis has one type, else ``"explicit,auto"`` (from the types
    or their names)."""
    names = [t if isinstance(t, str) else t.name.lower() for t in types]
    return names[0] if len(set(names)) == 1 else ",".join(names)


def _as_tuple(given, one) -> tuple:
    """``given`` as a tuple: ``(given,)`` for one value of type ``one``, ``()`` where it is
    neither that nor an iterable (so the caller's error, which says what fits, is raised)."""
    if isinstance(given, one):
        return (given,)
    return tuple(given) if isinstance(given, Iterable) and not isinstance(given, bytes) else ()


def parse_axis_types(dims: tuple[int, ...], axis_types, device: Any) -> tuple[AxisType, ...]:
    """One ``AxisType`` per mesh dimension from None, a type, a name, or one per axis."""
    if axis_types is None:
        return (default_axis_type(device),) * len(dims)
    given = _as_tuple(axis_types, str | AxisType)
    types = [AXIS_TYPES.get(t.lower()) if isinstance(t, str) else t for t in given]
    if len(types) == 1:
        types = types * len(dims)
    if len(types) != len(dims) or not all(t in AXIS_TYPES.values() for t in types):
        raise SliceError(
            f"axis_types {axis_types!r} must be 'explicit' or 'auto' (or jax.sharding.AxisType"
            f".Explicit / .Auto), once for all axes or once for each of the {len(dims)} mesh "
            f"dimensions of shape {dims}. Maybe you want axis_types='explicit'.")
    return tuple(types)


class ResourceManager:
    """Hands out virtual slices and keeps the virtual -> physical mapping.

    Placement is a static heuristic that spreads load, as in the paper: the island whose least
    loaded devices would carry the fewest other slices (so a slice shares no device while
    enough free ones exist on any island), ties going to the least loaded island (by slices
    mapped per device); then those devices, keeping device order.
    """

    def __init__(self, islands: Sequence[Island], check_open=lambda: None):
        self.islands = tuple(islands)
        self._slices: dict[int, VirtualSlice] = {}
        self._held: dict[int, tuple[Any, ...]] = {}  # slice id -> the devices it is on
        self._load: dict[int, int] = {d.id: 0 for isl in self.islands for d in isl.devices}
        self._lock = threading.Lock()
        self.check_open = check_open  # raises once the controller is closed
        self.controller: Any = None  # the controller that owns it sets this
        self.epoch = 0  # bumped on every remap: traced programs are lowered again

    @property
    def slices(self) -> tuple[VirtualSlice, ...]:
        return tuple(self._slices.values())

    def island(self, island: int) -> Island:
        if not isinstance(island, int | np.integer):  # ("0" does exist, by another name)
            raise SliceError(not_an_island_id(island, len(self.islands)))
        if isinstance(island, bool) or not 0 <= island < len(self.islands):
            raise SliceError(f"island {island!r} does not exist; this controller has islands "
                             f"{list(range(len(self.islands)))} with "
                             f"{[len(i.devices) for i in self.islands]} devices."
                             + more_islands(island, self.islands, self.controller))
        return self.islands[island]

    def allocate(self, shape: int | Sequence[int], island: int | None = None,
                 axis_names: Sequence[str] | None = None,
                 axis_types: str | AxisType | Sequence[str | AxisType] | None = None,
                 devices: Sequence[int] | None = None,
                 replacing: VirtualSlice | None = None) -> VirtualSlice:
        """A new slice (``ctl.slice`` documents the arguments). ``replacing``: a slice of this
        manager that the new one takes the place of: placed as though it were given back,
        and given back once the new one is made (a failed call leaves it as it was)."""
        self.check_open()
        dims = _normalize_shape(shape)
        names = self._axis_names(dims, axis_names)
        types = parse_axis_types(dims, axis_types, self.islands[0].devices[0])
        if replacing is not None and (not isinstance(replacing, VirtualSlice)
                                      or self._slices.get(replacing.id) is not replacing):
            got = (f"slice {replacing.id}, released already" if isinstance(
                replacing, VirtualSlice) and replacing.controller is self.controller
                   else _what(replacing))
            raise SliceError(f"replacing= takes a slice of this controller that is not "
                             f"released, got {got}. Maybe you want replacing=None (nothing "
                             "given back).")
        with self._lock:
            old = () if replacing is None else self._held[replacing.id]
            for d in old:  # (placed as though it were given back already)
                self._load[d.id] -= 1
            try:
                if devices is None:
                    target = self._choose_island(math.prod(dims), island)
                    chosen = self._choose_devices(target, math.prod(dims))
                else:
                    target, chosen = self._given_devices(dims, devices, island)
            except BaseException:
                for d in old:
                    self._load[d.id] += 1
                raise
            vs = VirtualSlice(self, dims, names, target, chosen, types)
            self._slices[vs.id] = vs
            self._held[vs.id] = chosen
            for d in chosen:
                self._load[d.id] += 1
            if replacing is not None:
                self._forget(replacing, count=False)
        return vs

    def remap(self, vs: VirtualSlice, island: int | None = None) -> VirtualSlice:
        """Move ``vs`` to other physical devices (on ``island``, or the least loaded one),
        once no other thread is tracing a program (``placements``)."""
        if not isinstance(vs, VirtualSlice) or (self._slices.get(vs.id) is not vs
                                                and not vs.released):
            raise SliceError(f"remap needs a VirtualSlice of this controller (from "
                             f"ctl.slice(...)), got {_what(vs)}. Maybe you want "
                             "ctl.remap(ctl.slice(2), island=1).")
        old = vs.devices  # (raises SliceError once it is released)
        with placements.moving(), self._lock:
            for d in old:
                self._load[d.id] -= 1
            try:
                target = self._choose_island(vs.size, island)
            except SliceError:
                for d in old:
                    self._load[d.id] += 1
                raise
            devices = self._choose_devices(target, vs.size)
            for d in devices:
                self._load[d.id] += 1
            vs.moved(target, devices)
            self._held[vs.id] = devices
            self.epoch += 1
        return vs

    def release(self, vs: VirtualSlice) -> None:
        """Give ``vs`` back (``vs.release()`` calls this): its devices' load goes down, and
        programs traced before are traced again (so a call on it raises ``SliceError``)."""
        with self._lock:
            self._forget(vs)

    def _forget(self, vs: VirtualSlice, count: bool = True) -> None:
        """Under the lock: ``vs`` is released (``count``: its devices' load goes down; False
        where the caller took it off already)."""
        if self._slices.pop(vs.id, None) is not None:
            held = self._held.pop(vs.id)
            for d in held if count else ():
                self._load[d.id] -= 1
            self.epoch += 1
        vs.released = True

    def release_all(self) -> None:
        for vs in list(self._slices.values()):
            self.release(vs)

    def island_of(self, devices) -> Island | None:
        """The island holding all of ``devices`` (device objects: an array on other devices
        with the same ids, e.g. real ones beside a simulated cluster, is on none), or None."""
        wanted = set(devices)
        for isl in self.islands:
            if wanted <= set(isl.devices):
                return isl
        return None

    def _axis_names(self, dims: tuple[int, ...], axis_names) -> tuple[str, ...]:
        if axis_names is None:
            return _default_axis_names(len(dims))
        names = _as_tuple(axis_names, str)
        if (len(names) != len(dims) or not all(isinstance(n, str) and n for n in names)
                or len(set(names)) != len(names)):  # (str names: what views and specs show)
            raise SliceError(
                f"axis_names {axis_names!r} must name each of the {len(dims)} mesh dimensions "
                f"of shape {dims} once, with non-empty strings. Maybe you want "
                f"axis_names={_default_axis_names(len(dims))}."
            )
        return names

    def _given_devices(self, dims: tuple[int, ...], ids, island: int | None):
        """The island and devices named by ``ids`` (device ids, in mesh order)."""
        given, ids = ids, self._ids_of(ids, math.prod(dims))
        if (ids is None or len(ids) != math.prod(dims) or not all(
                isinstance(i, int | np.integer) and not isinstance(i, bool) for i in ids)
                or len(set(ids)) != len(ids)):  # (ints first: a list in it is unhashable)
            raise SliceError(f"devices= must list {math.prod(dims)} distinct device ids for a "
                             f"slice of shape {dims}, got {given!r}. Maybe you want "
                             f"devices={list(self.islands[0].device_ids[:math.prod(dims)])}.")
        missing = [i for i in ids if all(i not in isl.device_ids for isl in self.islands)]
        if missing:
            raise SliceError(f"device {missing[0]} does not exist here; the islands here are "
                             + self._listed() + f". Maybe you want devices="
                             f"{list(self.islands[0].device_ids[:len(ids)])}.")
        for isl in self.islands if island is None else (self.island(island),):
            by_id = {d.id: d for d in isl.devices}
            if all(i in by_id for i in ids):
                return isl, tuple(by_id[i] for i in ids)
        fits = [isl for isl in self.islands if len(isl.devices) >= len(ids)]
        home = next((isl for isl in fits if ids[0] in isl.device_ids), fits[0] if fits else None)
        if island is not None and self.island(island) in fits:
            home = self.island(island)
        pod = larger_island(len(ids), self.islands, self.controller)
        hint = (f" Maybe you want {pod}." if home is None else
                f" Maybe you want devices={list(home.device_ids[:len(ids)])}"
                + ("" if island is None else f", island={home.id}") + ".")
        raise SliceError(f"devices {ids} are not all on "
                         + ("one island" if island is None else f"island {island}")
                         + "; a slice lives on one island, and the islands here are "
                         + self._listed() + "." + hint)

    def _listed(self) -> str:
        return ", ".join(f"{i.id}: {list(i.device_ids)}" for i in self.islands)

    def _ids_of(self, given, size: int) -> list | None:
        """``devices=`` as a list of ids: ids, or devices of these islands (as
        ``jax.make_mesh`` takes them), in a sequence or an array in mesh order; None where it
        is neither a sequence nor an array."""
        if isinstance(given, np.ndarray):
            given = given.ravel().tolist()
        if not isinstance(given, Sequence) or isinstance(given, str | bytes):
            return None
        ours = {d for isl in self.islands for d in isl.devices}
        ids = []
        for item in given:
            if isinstance(item, int | np.integer) or not hasattr(item, "id"):
                ids.append(item)  # (an id, or what the caller's check refuses)
            elif item in ours:
                ids.append(item.id)
            else:
                raise SliceError(f"device {item.id} ({item!r}) is not one of this controller's"
                                 f"; its islands hold devices {self._listed()}. Maybe you want "
                                 f"devices={list(self.islands[0].device_ids[:size])}.")
        return ids

    def _choose_island(self, size: int, island: int | None) -> Island:
        fits = [isl for isl in self.islands if len(isl.devices) >= size]
        if island is not None:
            target = self.island(island)
            if size > len(target.devices):
                fix = (f"island={fits[0].id} (or leave island= out: it fits there)" if fits
                       else f"ctl.slice({len(target.devices)}, island={target.id}), or "
                       f"{larger_island(size, self.islands, self.controller)}")
                raise SliceError(
                    f"a slice of {size} devices does not fit on island {target.id}, which has "
                    f"{len(target.devices)}. Islands here: "
                    f"{[len(i.devices) for i in self.islands]} devices. Maybe you want {fix}."
                )
            return target
        if not fits:
            largest = max(len(i.devices) for i in self.islands)
            raise SliceError(
                f"a slice of {size} devices does not fit on any island; the largest has "
                f"{largest} devices (islands: {[len(i.devices) for i in self.islands]}). A "
                f"slice lives on one island: maybe you want ctl.slice({largest}), or "
                f"{larger_island(size, self.islands, self.controller)}."
            )
        return min(fits, key=lambda isl: (self._shared(isl, size), self._island_load(isl),
                                          isl.id))

    def _island_load(self, isl: Island) -> float:
        return sum(self._load[d.id] for d in isl.devices) / len(isl.devices)

    def _shared(self, isl: Island, size: int) -> int:
        """How many other slices the ``size`` devices ``_choose_devices`` would pick on
        ``isl`` carry in all (0: they are free)."""
        return sum(sorted(self._load[d.id] for d in isl.devices)[:size])

    def _choose_devices(self, isl: Island, size: int) -> tuple[Any, ...]:
        # The least loaded devices, ties broken by position, returned in island order.
        order = sorted(range(len(isl.devices)), key=lambda i: (self._load[isl.devices[i].id], i))
        return tuple(isl.devices[i] for i in sorted(order[:size]))

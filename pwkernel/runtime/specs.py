"""Where a compiled function's inputs and outputs live: partition specs, their defaults, checks.

``pw.function`` follows ``jax.jit`` under ``jax.set_mesh(slice.mesh)``: an argument already laid
out on the slice's mesh keeps its sharding; anything else (a host value, an array elsewhere) is
placed as ``jax.jit`` types a host value, replicated; outputs are laid out as JAX lays them out
(``INFERRED``). Specs are pytree prefixes, as ``jax.jit``'s shardings are: one spec for a whole
argument or output pytree, or a pytree of specs down to the leaves. Two named choices:

- ``pw.INFERRED``: an output laid out as a plain ``jax.jit`` lays it out (the default);
- ``pw.BATCH``: an array's leading axis sharded over every axis of the slice (data parallelism
  in one word), e.g. ``in_specs=(pw.BATCH, P())`` for a batch and replicated weights.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any

import jax
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from .errors import ControllerClosedError, ProgramError, SliceError, SpecError, retyped


class Inferred(enum.Enum):
    """``out_specs=pw.INFERRED``: an output is laid out as JAX lays it out in a plain
    ``jax.jit`` over the slice's mesh: by its type on explicit axes (sharding in types), by
    the compiler's sharding propagation on auto axes. Read back from the compiled executable,
    so it is still known before anything runs."""

    INFERRED = "inferred"


class Batch(enum.Enum):
    """``pw.BATCH``: shard the array's leading axis over all of the slice's axes."""

    BATCH = "batch"


INFERRED = Inferred.INFERRED
BATCH = Batch.BATCH


def is_spec(s: Any) -> bool:
    """A leaf of a spec pytree: a PartitionSpec, a named choice, or None (the default)."""
    return s is None or isinstance(s, P | Inferred | Batch)


def spec_leaves(specs, args: tuple, what: str = "in_specs", statics=()) -> list[Any]:
    """One spec (or None) per flattened leaf of ``args``: ``specs`` is one spec for all, or a
    tuple with one pytree prefix per argument (``jax.jit``'s ``in_shardings`` rule; ``args``
    without the static ones, at positions ``statics``)."""
    if is_spec(specs):
        return [specs] * len(jax.tree_util.tree_leaves(args))
    if not isinstance(specs, tuple | list) or len(specs) != len(args):
        where = ", ".join(map(str, sorted(statics)))
        static = (f": the static ones (at {where}) take no entry, as in jax.jit" if statics
                  else "")
        batch = " or in_specs=pw.BATCH (shard the leading axis)" if what == "in_specs" else ""
        raise SpecError(
            f"{what} must be one PartitionSpec, or a tuple with one entry per positional "
            f"argument ({len(args)} here{static}), got {specs!r}. Maybe you want {what}=P() "
            f"(replicate){batch}.")
    return [leaf for spec, arg in zip(specs, args, strict=True)
            for leaf in prefix_leaves(spec, arg, "in_specs entry")]


def prefix_leaves(spec, tree, what: str) -> list[Any]:
    """``spec`` (a pytree prefix of ``tree``) broadcast to one spec per leaf of ``tree``."""
    if is_spec(spec):
        return [spec] * len(jax.tree_util.tree_leaves(tree))
    try:
        full = jax.tree.broadcast(spec, tree, is_leaf=is_spec)
    except Exception:
        n = len(jax.tree_util.tree_leaves(tree))
        raise SpecError(
            f"{what} {spec!r} is not a pytree prefix of the value it describes "
            f"({jax.tree_util.tree_structure(tree)}, {n} arrays). Give one spec for the whole "
            "value (e.g. P()), or a pytree of specs with the value's structure.") from None
    # (read at the value's leaves: a None spec where the value has no array stays out)
    return jax.tree_util.tree_structure(tree).flatten_up_to(full)


def out_spec_leaves(name: str, out_specs, out_struct) -> list[Any]:
    """One spec per output leaf of function ``name``: ``out_specs`` is a pytree prefix of the
    result (``out_struct``)."""
    try:
        return prefix_leaves(out_specs, out_struct, f"{name}: out_specs")
    except SpecError:
        n = len(jax.tree_util.tree_leaves(out_struct))
        raise SpecError(
            f"{name}: out_specs {out_specs!r} does not match the function's result "
            f"({jax.tree_util.tree_structure(out_struct)}, {n} arrays): give one spec for the "
            "whole result, or a pytree prefix of it, e.g. one spec per element of a returned "
            "tuple.") from None


def on_mesh(sharding, mesh) -> bool:
    """``sharding`` is a NamedSharding over ``mesh``'s devices, grid and axis names."""
    if not isinstance(sharding, NamedSharding):
        return False
    have = sharding.mesh
    return (tuple(have.axis_names) == tuple(mesh.axis_names)
            and have.devices.shape == mesh.devices.shape
            and [d.id for d in have.devices.flat] == [d.id for d in mesh.devices.flat])


def placed_spec(sharding, mesh) -> P:
    """The default for an input: its own spec when it is on the slice's mesh, else replicated
    (as ``jax.jit`` types a host value)."""
    return sharding.spec if on_mesh(sharding, mesh) else P()


def check_committed(name: str, i: int, shape: tuple[int, ...], placed, spec: P,
                    mesh) -> None:
    """Refuse ``in_shardings`` that disagree with a committed argument's layout (a
    ``jax.Array`` placed with ``jax.device_put``, or a future), as ``jax.jit`` refuses them
    (``ValueError``): it moves a committed array between devices, never into another layout.
    Layouts are compared as ``jax.jit`` compares them, devices aside (what each device's
    position in the mesh holds)."""
    wanted = NamedSharding(mesh, spec)
    if placed.is_fully_replicated or wanted.is_fully_replicated:
        same = placed.is_fully_replicated and wanted.is_fully_replicated
    else:
        same = (list(placed.devices_indices_map(shape).values())
                == list(wanted.devices_indices_map(shape).values()))
    if same:
        return
    have = (placed.spec if isinstance(placed, NamedSharding) else
            f"on device {next(iter(placed.device_set)).id}" if len(placed.device_set) == 1
            else placed)
    raise SpecError(
        f"{name}: input {i} (shape {shape}) is committed to its layout ({have}: a jax.Array "
        f"placed with jax.device_put, or a future), but "
        f"in_shardings asks for {spec}; jax.jit refuses this too (\"Sharding passed to jit "
        "does not match the sharding on the respective arg\"): it does not move a committed "
        f"array into another layout. Put it there first, jax.device_put(x, NamedSharding("
        f"slice.mesh, {spec})), or leave this argument's in_shardings out (None) to keep its "
        "layout.")


def batch_spec(shape: tuple[int, ...], vs, what: str) -> P:
    """``pw.BATCH`` for an array of ``shape`` on slice ``vs``: the leading axis over every axis
    of the slice; a scalar is replicated."""
    if not shape or vs.size == 1:
        return P()
    if shape[0] % vs.size:
        raise SpecError(f"{what}: pw.BATCH shards the leading axis (size {shape[0]}) over the "
                        f"slice's {vs.size} devices, and {shape[0]} is not divisible by "
                        f"{vs.size}. Maybe you want a batch that is a multiple of {vs.size}, "
                        "or P() to replicate this argument.")
    names = vs.axis_names
    return P(names[0] if len(names) == 1 else tuple(names))


def entry_axes(entry) -> tuple[str, ...]:
    """The mesh axes one dimension of a spec is sharded over (none: replicated)."""
    if entry is None or entry is P.UNCONSTRAINED:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def explicit_axes(spec, mesh) -> bool:
    """``spec`` shards over axes of ``mesh``, all of them explicit (sharding in types)."""
    names = [a for entry in spec for a in entry_axes(entry)]
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return bool(names) and all(types.get(a) == jax.sharding.AxisType.Explicit for a in names)


def check_spec(spec: P, shape: tuple[int, ...], mesh, what: str) -> None:
    """Refuse a spec that does not fit ``shape`` on ``mesh``, naming the fix."""
    if len(spec) > len(shape):
        raise SpecError(f"{what}: {spec} names {len(spec)} dimensions but the array has shape "
                        f"{shape} ({len(shape)} dimensions). Maybe you want P() (replicate).")
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        names = entry_axes(entry)
        if not names:
            continue
        for name in names:
            if name not in mesh.shape:
                raise SpecError(f"{what}: {spec} uses mesh axis {name!r}, but the slice's mesh "
                                f"has axes {tuple(mesh.axis_names)}. Maybe you want one of "
                                f"those, P({mesh.axis_names[0]!r}), or a slice whose axes "
                                f"name it: ctl.slice(..., axis_names=({name!r}, ...)).")
            if name in used:
                raise SpecError(f"{what}: {spec} uses mesh axis {name!r} twice.")
            used.add(name)
        size = math.prod(mesh.shape[n] for n in names)
        if shape[dim] % size:
            raise SpecError(
                f"{what}: {spec} shards dimension {dim} (size {shape[dim]}) over mesh axis "
                f"{'x'.join(names)} of size {size}, and {shape[dim]} is not divisible by {size}."
                f" Maybe you want P() to replicate it, or a size that is a multiple of {size}."
            )


def describe(shape, dtype, spec, chosen_by: str) -> str:
    """``f32[8,8] P('x',) (kept from the argument)``: one input, for error messages."""
    name = "?" if dtype is None else getattr(dtype, "name", None) or str(dtype)
    short = {"float32": "f32", "float64": "f64", "int32": "i32", "uint32": "u32",
             "bfloat16": "bf16", "float16": "f16", "bool": "bool", "int64": "i64"}
    return f"{short.get(name, name)}[{','.join(map(str, shape))}] {spec} ({chosen_by})"


def _default_memory(mesh) -> str:
    """The memory kind arrays on ``mesh`` live in by default (simulated chips: "device")."""
    default_memory = getattr(mesh.devices.flat[0], "default_memory", None)
    return "device" if default_memory is None else default_memory().kind


def from_shardings(what: str, shardings, specs, mesh) -> Any:
    """``jax.jit``'s ``in_shardings`` or ``out_shardings`` (``what``) as specs on the slice's
    ``mesh``: a ``NamedSharding`` gives its spec (the slice places the function, so the
    sharding's own mesh only has to name the same axes), a ``PartitionSpec`` or None stays as
    it is. ``specs``: the matching ``in_specs``/``out_specs``, which must then be None."""
    if shardings is None:
        return specs
    kind = what.split("_")[0]
    if specs is not None:
        raise SpecError(f"give {kind}_specs or {what}, not both: they say the same thing "
                        f"(a NamedSharding's spec, or a PartitionSpec).")

    def spec_of(s):
        if s is None or isinstance(s, P):
            return s
        if isinstance(s, SingleDeviceSharding) and mesh.size == 1:
            # jax.jit takes one on a one-device mesh: the whole value on that device, as P()
            # there (its device aside, as a NamedSharding's mesh is)
            s = NamedSharding(mesh, P(), memory_kind=s.memory_kind)
        if not isinstance(s, NamedSharding):
            raise SpecError(
                f"{what} takes NamedShardings, PartitionSpecs or None, or pytrees of them (as "
                f"jax.jit's do), got {type(s).__name__} {s!r}. A slice places its function: "
                f"give the layout, e.g. {what}=NamedSharding(slice.mesh, P('x')) or P('x').")
        if s.memory_kind not in (None, "device", _default_memory(mesh)):
            raise SpecError(f"{what}: {s!r} asks for memory kind {s.memory_kind!r}; pwkernel "
                            "keeps values in the devices' own memory. Leave memory_kind unset.")
        unknown = [n for entry in s.spec for n in entry_axes(entry) if n not in mesh.shape]
        if unknown:
            raise SpecError(
                f"{what}: {s!r} shards over mesh axis {unknown[0]!r}, but the slice's mesh has "
                f"axes {tuple(mesh.axis_names)}. Name the slice's axes the same "
                f"(ctl.slice(..., axis_names={tuple(s.mesh.axis_names)!r})) or use the slice's "
                "mesh in the sharding.")
        return s.spec

    return jax.tree_util.tree_map(
        spec_of, shardings, is_leaf=lambda x: x is None or isinstance(x, P | jax.sharding.Sharding))


def check_specs_arg(what: str, specs) -> None:
    leaves = jax.tree_util.tree_leaves(specs, is_leaf=is_spec)
    bad = [x for x in leaves if not is_spec(x)]
    if bad:
        raise SpecError(f"{what} must be PartitionSpecs (P(...)), pw.BATCH, pw.INFERRED or None, "
                        f"or pytrees of them; got {type(bad[0]).__name__} {bad[0]!r}. Maybe you "
                        f"want {what}=P() (replicate) or {what}=P('x').")


def tracing_error(name: str, e: Exception, in_avals, in_shardings, why,
                  vs=None) -> Exception:
    """One pwkernel line on top of JAX's error: which function, how its inputs were laid
    out and who chose that, and the likely fix. A ``ProgramError`` that is also of the
    error's own type, so ``except ValueError`` catches what ``jax.jit`` would raise. Where
    the slice ``vs`` it was traced for went meanwhile (another thread closed its controller
    or released it), the slice's own error instead: the function is not to blame."""
    if vs is not None:
        try:
            vs.check_usable()
        except (SliceError, ControllerClosedError) as gone:
            return gone
    cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    inputs = [describe(s, d, sh.spec, w)
              for (s, d, *_), sh, w in zip(in_avals, in_shardings, why, strict=True)]
    shown = "; ".join(inputs[:4]) + (f"; ... ({len(inputs)} inputs)" if len(inputs) > 4
                                     else "")
    kind = type(e).__name__
    if "Concretization" in kind or "TracerBool" in kind or "TracerInteger" in kind:
        named = re.search(r"depends on the value of the argument (\S+?)\.?\s", str(e) + " ")
        which = f"argument {named.group(1)}" if named else "that argument"
        fix = (f"Python needs a concrete value of {which} while JAX traces this function: "
               "use jnp.where / jax.lax.cond for data-dependent choices, or mark "
               f"{which} static (static_argnums=... / static_argnames=...).")
    elif "gather" in str(e) and "out_sharding" in str(e):
        fix = ("A gather (table[idx], jnp.take, flax's nn.Embed) by indices sharded over the "
               "slice's explicit axes: JAX cannot tell its result's layout. Maybe you want "
               "table.at[idx].get(out_sharding=jax.typeof(idx).sharding.spec), a one-hot "
               "matmul (jax.nn.one_hot(idx, n, dtype=table.dtype) @ table), or a slice with "
               "axis_types='auto' (ctl.slice(n, axis_types='auto')).")
    elif "out_specs which require replication" in str(e):  # (not an input's layout)
        said = re.search(r"out_specs is .*?(?=\n|$)", str(e))
        fix = (f"{said.group(0) if said else 'A shard_map out_specs replicates an output'}. "
               "shard_map's out_specs ask for a value equal on every device of an axis its "
               "body leaves varying: reduce it over that axis (jax.lax.psum / pmean), give "
               "out_specs that shard it over the axis (P('x')), or, where the values are "
               "equal (an all_gather's), jax.shard_map(..., check_vma=False).")
    elif "shard" in str(e).lower():
        fix = ("Maybe you want in_specs=pw.BATCH (the leading axis sharded over the "
               "slice) or in_specs=P(...) for the layout the function expects, P() to "
               "replicate, or jax.sharding.reshard(x, P(...)) inside the function.")
    else:
        fix = "(JAX raised it while tracing the function: its error is the cause, below.)"
    return retyped(ProgramError(f"{name} could not be traced: {kind}: {cause}\n  inputs: "
                                f"{shown}\n  {fix}"), type(e))

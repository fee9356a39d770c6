"""A ``%%pathways`` cell as ONE Pathways program.

The cell's top level runs as a notebook's top level runs, in a namespace of its own over the
user's (``CellScope``), wrapped in a function of the cell's array inputs::

    def cell(<inputs>):          # free names of the cell that hold arrays or futures
        exec(<the cell's body>, scope)   # same line numbers as in the notebook
        return {<names the cell bound or deleted>}

Then, in one of two ways:

- the cell calls compiled functions or programs (``pw.function`` / ``@pw.program`` objects):
  the function is traced as a ``@pw.program``, each call a node;
- otherwise the whole cell is ONE ``pw.function`` on the cell's slice (plain ``jax.jit``
  functions and ``jnp`` operations inside are traced into it), submitted as a one-node program
  while the slice's mesh is the ambient mesh (``jax.set_mesh``). It is the same JAX program as
  the plain cell under ``jax.set_mesh(<the slice's mesh>)``: arrays and futures already on the
  slice's mesh keep their shardings, and every output is laid out as JAX lays it out
  (``pw.INFERRED``: its type on explicit axes, the compiler's propagation on auto axes). Only
  inputs not on the slice's mesh (NumPy arrays, arrays elsewhere) are placed by pwkernel: they
  are replicated, as ``jax.jit`` types a host value (``pw.function``'s default).

Inputs are the cell's free names that hold arrays, futures, or any pytree of them (flax
parameters, optax state, dicts): state bound by one cell flows into the next on the devices.
A cell whose Python needs a value is split first (``segments.py``).

Names the cell binds to arrays come back as futures; plain Python values, and NumPy values
the cell's own NumPy code made, stay plain.
``jax.debug.print`` calls written in the cell print into the cell that ran them, even after it
returned (``--no-block``): see ``CellOutput``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import symtable
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import jax
import numpy as np
from IPython.core.error import UsageError
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from ..runtime.errors import NeedsValueError
from ..runtime.objects import Future
from ..runtime.program import INFERRED, CompiledFunction, Program, Value
from ..runtime.program import function as pw_function
from ..runtime.program import program as pw_program
from ..runtime.resources import VirtualSlice
from . import key_order
from .scope import CellScope, check_kept, rehome
from .scope import leaves as scope_leaves

LAST = "__pw_last__"  # holds the value of a cell's last expression
_PRINT, _PUT = "__pw_print__", "__pw_put__"


@dataclasses.dataclass
class CellPlan:
    """What the analysis of a cell found, and the function built from it."""

    fn: Callable[..., dict[str, Any]]
    params: list[str]          # names passed in: arrays, jax arrays and futures
    uses_pw: bool              # the cell calls compiled functions or programs
    filename: str
    last_name: str | None = None  # the cell ends with a bare name: show that value
    # inputs whose pytrees also hold plain values (ints, strings): those stay plain, only the
    # arrays are passed in (name -> (treedef, leaves with None where an array goes))
    mixed: dict[str, tuple[Any, list[Any]]] = dataclasses.field(default_factory=dict)
    # a name the cell reads whose object JAX code changes in place (a flax.nnx Module or
    # Optimizer): the cell runs as plain Python, as a value stored into an object does
    mutable: str | None = None
    last_line: int = 1  # the notebook line of ``last_name`` (a NameError there points at it)

    def inputs(self, user_ns: dict[str, Any]) -> list[Any]:
        """The values passed for ``params``: each input, or the arrays of a mixed one."""
        return [[x for x in jax.tree_util.tree_leaves(user_ns[p]) if _is_array(x)]
                if p in self.mixed else user_ns[p] for p in self.params]


def _is_array(value: Any) -> bool:
    # (typed PRNG keys, jax.random.key, included: the runtime moves them like any array; a
    # NumPy scalar the notebook holds is an argument too, as ``jax.jit`` takes it)
    return isinstance(value, Future | jax.Array | np.ndarray | np.generic)


def is_state(value: Any) -> bool:
    """An input of the cell: an array or future, or any pytree holding them (flax parameters,
    optax state, dicts, lists, registered dataclasses), moved on the devices, never copied
    to the host. Plain leaves beside the arrays stay plain (``_mixed``)."""
    if _is_array(value):
        return True
    if isinstance(value, str | bytes | int | float | complex | type) or callable(value):
        return False
    leaves = scope_leaves(value)  # ([value] where JAX cannot flatten it: no input, read as is)
    return bool(leaves) and leaves[0] is not value and any(_is_array(x) for x in leaves)


def in_place_state(value: Any) -> bool:
    """An object that JAX code changes in place rather than returning new values: a flax.nnx
    Module, Optimizer, Rngs or Variable (or a list, tuple or dict of them); not an
    ``nnx.State``, which is a plain pytree. Traced in a cell, its update would run at the
    trace's level, which nnx refuses, leaving the object emptied."""
    items = value.values() if type(value) is dict else value if type(value) in (
        list, tuple) else (value,)
    return any((c.__module__, c.__name__) in _IN_PLACE for x in items for c in type(x).__mro__)


def _check_in_place(bound: dict[str, Any]) -> None:
    """A name the cell binds to a flax.nnx object (``model = nnx.Linear(...)``): as a
    program's output its Variables would hold futures, which nnx's own in-place updates
    (``model(x)`` in train mode, ``optimizer.update``) cannot change; the cell runs as plain
    Python instead, as a cell that reads one does, and binds the object the plain cell binds."""
    name = next((n for n, v in bound.items() if in_place_state(v)), None)
    if name is not None:
        raise NeedsValueError(f"%%pathways: the cell binds {name!r}, a flax.nnx object that "
                              "JAX code changes in place; it runs as plain Python.")


#: the flax.nnx base classes of objects that change in place (graph nodes, variables)
_IN_PLACE = {("flax.nnx.pytreelib", "Pytree"), ("flax.nnx.object", "Object"),
             ("flax.nnx.variablelib", "Variable")}


def _mixed(value: Any) -> tuple[Any, list[Any]] | None:
    """``(treedef, plain leaves with None for arrays)`` when ``value`` mixes both."""
    leaves, tree = jax.tree_util.tree_flatten(value)
    if all(_is_array(x) for x in leaves):
        return None
    return tree, [None if _is_array(x) else x for x in leaves]


def _rebuild(tree, plain: list[Any], arrays: Sequence[Any]) -> Any:
    it = iter(arrays)
    return jax.tree_util.tree_unflatten(tree, [next(it) if x is None else x for x in plain])


class _Route(ast.NodeTransformer):
    """``jax.debug.print(...)`` -> ``__pw_print__(...)`` (prints into the cell that ran it);
    ``jax.device_put(...)`` -> ``__pw_put__(...)`` (see ``placed``)."""

    ROUTES = {("jax", "debug", "print"): _PRINT, ("jax", "device_put"): _PUT}

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f, path = node.func, []
        while isinstance(f, ast.Attribute):
            path.insert(0, f.attr)
            f = f.value
        if isinstance(f, ast.Name) and (f.id, *path) in self.ROUTES:
            node.func = ast.copy_location(ast.Name(self.ROUTES[(f.id, *path)], ast.Load()),
                                          node.func)
        return node


def placed(x: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``jax.device_put`` as the plain cell means it. Inside ``jax.jit`` on auto mesh axes
    JAX leaves a value where the compiler puts it; the plain cell places it. So there a
    ``PartitionSpec`` or ``NamedSharding`` target becomes ``with_sharding_constraint``, which
    holds inside the program. Everything else is ``jax.device_put`` unchanged."""
    leaves = jax.tree_util.tree_leaves(x)
    mesh = jax.sharding.get_abstract_mesh()
    if (not args and not kwargs and isinstance(device, P | NamedSharding)
            and any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)
            and not mesh.empty and AxisType.Explicit not in mesh.axis_types):
        return jax.lax.with_sharding_constraint(x, device)
    return jax.device_put(x, device, *args, **kwargs)


def _parse(source: str, line_offset: int) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        line = (e.lineno or 1) + line_offset
        text = (e.text or "").strip()
        raise UsageError(f"%%pathways: syntax error in the cell at line {line}: {e.msg}"
                         + (f" ({text!r})" if text else "")
                         + ". Fix that line and run the cell again.") from None


def analyse(source: str, user_ns: dict[str, Any], filename: str, line_offset: int,
            printer: Callable[..., None]) -> CellPlan:
    """Build the cell's function; ``line_offset`` lines precede the body in the notebook."""
    tree = _parse(source, line_offset)
    for node in tree.body:
        if isinstance(node, ast.Return | ast.Nonlocal) or any(
                isinstance(n, ast.Yield | ast.YieldFrom | ast.Await) for n in ast.walk(node)
                if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)):
            raise UsageError("%%pathways: a cell cannot use return, yield, await or nonlocal at "
                             "its top level; it runs as the body of one program. Move that code "
                             "into a function.")
    last_name, last_line = None, 1
    if tree.body and isinstance(tree.body[-1], ast.Expr) and isinstance(tree.body[-1].value,
                                                                         ast.Name):
        last_line = tree.body[-1].lineno + line_offset
        last_name = tree.body.pop().value.id  # no second buffer for a value already named
    elif tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign([ast.Name(LAST, ast.Store())], last.value), last)
    tree = _Route().visit(tree)
    loaded = reads_before_binding(tree)  # its inputs
    params = sorted(n for n in loaded if n in user_ns and is_state(user_ns[n]))
    seeded = sorted(n for n in loaded if n in user_ns and n not in params)
    uses_pw = any(isinstance(user_ns.get(n), CompiledFunction | Program) for n in loaded)
    mutable = next((n for n in sorted(loaded) if n in user_ns and in_place_state(user_ns[n])),
                   None)
    fn = _build(tree, params, seeded, user_ns, filename, line_offset, printer)
    mixed = {n: m for n in params if (m := _mixed(user_ns[n])) is not None}
    # (an input's dicts in their own key order, as the cell without the magic reads them:
    # JAX's flattening sorts them)
    orders = {n: o for n in params if (o := key_order.order_of(user_ns[n])) is not None}
    if mixed or orders:
        inner = fn

        def fn(*args):
            return inner(*[key_order.restore(_rebuild(*mixed[p], a) if p in mixed else a,
                                             orders.get(p))
                           for p, a in zip(params, args, strict=True)])
    return CellPlan(fn, params, uses_pw, filename, last_name, mixed, mutable, last_line)


def reads_before_binding(tree: ast.Module) -> set[str]:
    """The notebook names the cell may read before it binds them (its inputs): at its top
    level, and as globals of the functions, lambdas, classes and comprehensions it defines
    (not their own parameters and locals: a ``v`` in ``def f(v)`` is no input, whatever the
    notebook holds under that name). A name the cell binds first and reads after is its own
    (``y = f(x); z = y + 1`` reads ``x`` only); where control flow may skip the binding (one
    branch of an ``if``, a loop's body, a ``try``), the name stays an input."""
    reads: set[str] = set()
    _flow(tree.body, frozenset(), reads)
    return reads


def _node_reads(node: ast.AST) -> set[str]:
    """Names ``node`` (a statement or expression) reads from the cell's top-level scope, in
    itself and as globals of the scopes it defines (symtable); ``x += 1`` and ``del x`` read
    ``x`` first (symtable counts them as bindings only)."""
    def globals_read(table: symtable.SymbolTable) -> set[str]:
        out = {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        for child in table.get_children():
            out |= globals_read(child)
        return out

    body = node.body if isinstance(node, ast.Module) else [
        node if isinstance(node, ast.stmt) else ast.Expr(node)]
    top = symtable.symtable(ast.unparse(ast.Module(body=body, type_ignores=[])), "<cell>",
                            "exec")
    names = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    for child in top.get_children():
        names |= globals_read(child)
    todo: list[ast.AST] = list(body)
    while todo:
        n = todo.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del):
            names.add(n.id)
        todo.extend(ast.iter_child_nodes(n))
    return names


def _binds(node: ast.AST) -> set[str]:
    """Names a simple statement (or an expression, by ``:=``) binds at the top level."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    out, todo = set(), [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp
                      | ast.GeneratorExp):
            continue  # (a ``:=`` in a comprehension binds outside it: no binding counted)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _step(node: ast.AST | None, bound: frozenset[str], reads: set[str]) -> frozenset[str]:
    """An expression or simple statement: what it reads first, then what it binds."""
    if node is None:
        return bound
    reads |= _node_reads(node) - bound
    gone = {t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)} \
        if isinstance(node, ast.Delete) else set()
    return (bound | _binds(node)) - gone


def _target(target: ast.expr, bound: frozenset[str], reads: set[str]) -> frozenset[str]:
    """A loop's, ``with``'s or ``except``'s target, as ``target = None``."""
    return _step(ast.Assign([target], ast.Constant(None), lineno=0), bound, reads)


def _flow(body: list[ast.stmt], bound: frozenset[str], reads: set[str]) -> frozenset[str]:
    """Walk ``body`` in order with the names surely bound so far; collect into ``reads`` the
    names it may read unbound; return the names surely bound after it."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            bound = _step(stmt.test, bound, reads)
            bound = _flow(stmt.body, bound, reads) & _flow(stmt.orelse, bound, reads)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            head = (_target(stmt.target, _step(stmt.iter, bound, reads), reads)
                    if not isinstance(stmt, ast.While) else _step(stmt.test, bound, reads))
            _flow(stmt.body, head, reads)  # once is enough: a later pass has bound more
            bound = _flow(stmt.orelse, head if isinstance(stmt, ast.While) else bound, reads)
            bound &= head  # the body may not run, the else may be skipped (``break``)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                bound = _step(item.context_expr, bound, reads)
                if item.optional_vars is not None:
                    bound = _target(item.optional_vars, bound, reads)
            bound = _flow(stmt.body, bound, reads)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            after = _flow(stmt.orelse, _flow(stmt.body, bound, reads), reads)
            for handler in stmt.handlers:  # the body may fail before binding anything
                start = _step(handler.type, bound, reads)
                start |= {handler.name} if handler.name else set()
                after &= _flow(handler.body, start, reads)
            bound = after | (_flow(stmt.finalbody, bound, reads) - bound)
        elif isinstance(stmt, ast.Match):
            reads |= _node_reads(stmt) - bound  # cases bind and read in ways not followed
        else:
            bound = _step(stmt, bound, reads)
    return bound


def _build(tree: ast.Module, params: list[str], seeded: list[str], user_ns: dict[str, Any],
           filename: str, line_offset: int,
           printer: Callable[..., None]) -> Callable[..., dict[str, Any]]:
    ast.increment_lineno(tree, line_offset)
    code = compile(ast.fix_missing_locations(tree), filename, "exec")
    helpers = {_PRINT: printer, _PUT: placed, "__name__": user_ns.get("__name__", "__main__")}

    def cell(*args: Any) -> dict[str, Any]:
        __tracebackhide__ = True  # (the user's frames only: IPython hides this one)
        names = {n: user_ns[n] for n in seeded if n in user_ns}
        scope = CellScope(user_ns, helpers, names | dict(zip(params, args, strict=True)))
        before = dict(user_ns)
        try:
            exec(code, scope)  # noqa: S102 - the user's own cell, at its top level
            bound = scope.bound()
            check_kept(user_ns, before, bound)
            _check_in_place(bound)
            return {k: rehome(v, scope, user_ns) for k, v in bound.items()}
        finally:
            scope.close()

    return cell


# --- splitting a cell's results into arrays (futures) and plain values ---------------------
def _array_leaf(leaf: Any) -> bool:
    # (a NumPy value the cell made is host Python's, computed while the cell was traced: it
    # stays the NumPy value the plain cell binds, its float64 or int64 neither narrowed to
    # JAX's 32 bits nor made a future)
    return isinstance(leaf, jax.core.Tracer | jax.Array | Value)


@dataclasses.dataclass(frozen=True)
class MixedOutput:
    """A name the cell bound to a pytree of arrays and plain values (``loss, step``), or to
    dicts whose keys JAX's flattening reorders: the plain leaves, with None where the arrays
    (returned as a list) go back, and the dicts' own key order (``key_order``)."""

    tree: Any
    plain: list[Any]
    order: Any = None


def split_outputs(out: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """Array-valued outputs are returned; plain ones go to ``plain``; a pytree of both (or
    one holding a dict JAX would reorder) returns its arrays and leaves the rest in ``plain``
    as a ``MixedOutput``."""
    arrays: dict[str, Any] = {}
    for name, value in out.items():
        leaves, tree = jax.tree_util.tree_flatten(value)
        if not any(_array_leaf(leaf) for leaf in leaves):
            plain[name] = value
            continue
        order = key_order.order_of(value)
        if order is None and all(_array_leaf(leaf) for leaf in leaves):
            arrays[name] = value
        else:
            arrays[name] = [leaf for leaf in leaves if _array_leaf(leaf)]
            plain[name] = MixedOutput(tree, [None if _array_leaf(x) else x for x in leaves],
                                      order)
    return arrays


def bound_values(plain: dict[str, Any], results: Any) -> dict[str, Any]:
    """What each name the cell bound holds now: its plain value, its future(s), or both
    put back together (``MixedOutput``), its dicts in the order the cell made them."""
    out = dict(plain)
    for name, value in (results or {}).items():
        mixed = out.get(name)
        out[name] = (key_order.restore(_rebuild(mixed.tree, mixed.plain, value), mixed.order)
                     if isinstance(mixed, MixedOutput) else value)
    return out


@contextlib.contextmanager
def ambient_mesh(vs: VirtualSlice | None) -> Iterator[None]:
    """Make ``vs``'s mesh the ambient mesh while the cell is traced."""
    if vs is None:
        yield
        return
    with vs.ambient():
        yield


def build_program(plan: CellPlan, vs: VirtualSlice | None, name: str,
                  plain: dict[str, Any], inputs: list[Any]) -> Program:
    """The cell as a ``Program``: traced over its compiled functions, or ONE function on ``vs``
    taking ``inputs`` (the values of ``plan.params``).

    Plain values the cell binds are collected into ``plain`` while it is traced.
    """
    if plan.uses_pw:
        def traced(*args):
            return split_outputs(plan.fn(*args), plain)
        return Program(traced, name=name, returns_copies=False)  # (``a = x`` aliases)
    if vs is None:
        raise UsageError("%%pathways: this cell needs a slice; pass --slice NAME or --devices N.")

    # jit once so the cell's Python runs once although the runtime traces it twice (shapes,
    # then lowering): the second trace hits jit's cache.
    body = jax.jit(lambda *args: split_outputs(plan.fn(*args), plain))
    compiled = pw_function(body, slice=vs, name=name, out_specs=INFERRED)
    return pw_program(lambda *args: compiled(*args), name=name)


_LIBRARY = (str(Path(__file__).resolve().parents[1]), "site-packages", "<frozen ")


def _user_frames(tb) -> list:
    """The traceback entries in the user's code (not in pwkernel, JAX or other libraries)."""
    out = []
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not any(part in name for part in _LIBRARY):
            out.append(tb)
        tb = tb.tb_next
    return out


def _chain(entries: list):
    tb = None
    for entry in reversed(entries):
        tb = types.TracebackType(tb, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return tb


def user_error(exc: BaseException, filename: str) -> BaseException:
    """``exc`` with a traceback of the user's frames only: the cell's line first, then the
    user's functions it called. A runtime error that wraps the user's own error (a function
    that could not be traced) gives way to that error, its message kept as a note."""
    if isinstance(exc, UnboundLocalError):  # a name read before the cell assigns it: at a
        name = str(exc).split("'")[1] if "'" in str(exc) else "?"  # notebook's top level
        exc = NameError(f"name {name!r} is not defined", name=name).with_traceback(
            exc.__traceback__)  # that is a NameError
    frames = _user_frames(exc.__traceback__)
    cause = exc.__cause__
    if cause is not None and not isinstance(exc, UsageError):
        inner = _user_frames(cause.__traceback__)
        if inner:
            if inner[-1].tb_frame.f_code.co_filename != filename:  # failed in a helper
                cause.add_note(f"(pwkernel: {exc})")
            return cause.with_traceback(_chain(frames + inner))
    if not frames:
        return exc
    return exc.with_traceback(_chain(frames))


def raise_in_cell(exc: BaseException, filename: str) -> NoReturn:
    """Raise ``exc`` (an error pwkernel raises on purpose, a Ctrl-C) as the notebook shows it:
    with the user's frames only, or, where none is the user's (a ``--timeout`` that ran out, a
    cancel or an interrupt while the cell waits), at the cell's ``%%pathways`` line (line 1 of
    ``filename``): IPython always shows the frame an error was raised in, even a hidden one."""
    __tracebackhide__ = True
    frames = _user_frames(exc.__traceback__)
    if frames:
        raise exc.with_traceback(_chain(frames))
    exc.__traceback__ = None
    exec(compile("raise __pwkernel_error__", filename, "exec"), {"__pwkernel_error__": exc})

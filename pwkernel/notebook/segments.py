"""Values on demand in a ``%%pathways`` cell: where the cell's Python needs a value.

A cell is one program only while its Python never looks at an array's value: JAX traces it, and
a traced value has no value yet. A cell that prints a loss, converts it (``float(loss)``,
``.item()``, ``np.asarray``), formats it in an f-string or branches on it (``if loss < t:``)
is split at its top-level statements:

- runs of statements that only build array work stay ONE program each, on the cell's slice;
- a statement whose Python needs a value runs as plain Python under ``jax.set_mesh(slice)``,
  exactly as the same cell runs without the magic. The futures it reads are lent to it as their
  values (the wait happens there, where Python needs the value, as JAX's own asynchronous
  dispatch waits on ``float(x)``), and the notebook's names hold the same objects after it
  (``run_plain``); the arrays it makes stay on the slice's devices.
  On a simulated controller (``backend="sim"``) the futures stay futures: their shapes, dtypes
  and shardings serve the statement, and only reading a value raises ``pw.NoValueError``.

The split is read from the code (``segments``). A program segment whose tracing still needs a
value (a helper function that calls ``float`` on its argument, say) runs as plain Python too
(``needs_value`` recognises JAX's errors for that); its Python has then run once already while
it was traced.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tokenize
from collections.abc import Callable
from typing import Any

import jax
from IPython.core.displayhook import DisplayHook

from ..runtime.errors import NeedsValueError, NoValueError
from ..runtime.graph import ComputeNode
from ..runtime.objects import Future
from .cell import ambient_mesh, reads_before_binding
from .scope import leaves as scope_leaves

_CONVERT = {"print", "float", "int", "bool", "complex", "str", "repr", "format", "display"}
_METHODS = {"item", "tolist", "block_until_ready", "copy_to_host_async", "__array__"}
_NUMPY = {"np", "numpy", "onp"}
# methods that store their argument into the object they are called on (a list of losses,
# a dict of metrics): the object would keep a traced value, so the statement runs as Python
_MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault", "appendleft",
             "extendleft", "put", "put_nowait"}
_VALUE_ERRORS = tuple(getattr(jax.errors, n) for n in (
    "ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
    "TracerArrayConversionError") if hasattr(jax.errors, n))

# JAX's AttributeError for an attribute or method only a concrete array has
_CONCRETE_ONLY = re.compile(r"The '\w+' (attribute|method) is not available on traced array")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Top-level statements ``first``..``last`` (1-based lines of the cell body)."""

    program: bool  # True: one program; False: plain Python that needs values
    first: int
    last: int

    def source(self, body: str) -> str:
        """The segment's lines, padded so that its line numbers are the cell's."""
        lines = body.splitlines()
        return "\n" * (self.first - 1) + "\n".join(lines[self.first - 1:self.last]) + "\n"


def _needs_value(stmt: ast.stmt) -> bool:
    """Whether Python reads an array's value in this statement (outside nested functions)."""
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.If | ast.While | ast.Assert | ast.IfExp | ast.JoinedStr):
            return True
        if _stores_into_an_object(node):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in _CONVERT:
                return True
            if isinstance(f, ast.Attribute) and (f.attr in _METHODS or (
                    f.attr in ("asarray", "array") and isinstance(f.value, ast.Name)
                    and f.value.id in _NUMPY) or (
                    f.attr == "device_get" and isinstance(f.value, ast.Name)
                    and f.value.id == "jax")):
                return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def _stores_into_an_object(node: ast.AST) -> bool:
    """``metrics["loss"] = ...``, ``box.w = ...``, ``losses.append(...)`` (a statement of its
    own, unlike ``opt.update(...)`` whose result is used): a value stored into an object, not
    bound to a name, where it would stay a traced value after the trace."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Subscript | ast.Attribute) for target in targets
                   for t in ast.walk(target))
    call = node.value if isinstance(node, ast.Expr) else None  # its result unused
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in _MUTATORS)


def segments(body: str) -> list[Segment]:
    """The cell body's statements grouped: runs of array work, and statements that need
    values (a cell without any is one program segment)."""
    tree = ast.parse(body)
    out: list[Segment] = []
    for stmt in tree.body:
        program = not _needs_value(stmt)
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        last = stmt.end_lineno or stmt.lineno
        if out and out[-1].program and program:
            out[-1] = Segment(True, out[-1].first, last)
        else:
            out.append(Segment(program, first, last))
    return out or [Segment(True, 1, 1)]


def quiet(body: str) -> bool:
    """The cell ends in ``;``: its value is not shown (IPython's rule for a cell)."""
    try:
        return DisplayHook.semicolon_at_end_of_expression(body)
    except (SyntaxError, tokenize.TokenError):
        return False


def needs_value(error: BaseException) -> bool:
    """``error`` (or what it wraps) says the traced Python needed a concrete value (also
    JAX's AttributeError for what only a concrete array has: ``x.sharding``, ``x.device``,
    ``x.format``)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, _VALUE_ERRORS + (NeedsValueError,)) or (
                isinstance(error, AttributeError) and _CONCRETE_ONLY.search(str(error))):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _value(x: Any) -> Any:
    """A future's value; a simulated one (``backend="sim"``) has none and stays the future:
    its shape, dtype and sharding work in the statement, and reading its value raises
    ``pw.NoValueError``, which says so."""
    if not isinstance(x, Future):
        return x
    try:
        return x.result()
    except NoValueError:
        return x


def _values(tree: Any) -> Any:
    return jax.tree_util.tree_map(_value, tree)


def interrupted(e: KeyboardInterrupt, name: str) -> KeyboardInterrupt:
    """A Ctrl-C while a cell's statements ran as plain Python (they read values: a ``while``
    loop, ``float(loss)``), with what it means; before, a bare ``KeyboardInterrupt:``. The
    user's own ``raise KeyboardInterrupt("...")`` keeps its words."""
    if e.args:
        return e
    return KeyboardInterrupt(
        f"{name} interrupted while its Python ran as plain Python (it reads values): what it "
        "bound stays bound, as without the magic; the computations it called run on (see "
        "ctl.status())").with_traceback(e.__traceback__)


def run_plain(source: str, user_ns: dict[str, Any], filename: str, line_offset: int, vs,
              want_value: bool) -> tuple[Any, bool]:
    """Run ``source`` as plain Python under the slice's mesh, the futures it reads lent to it
    as their values; returns its last expression's value if asked, and whether it read any
    array (a future or a ``jax.Array``).

    The notebook's objects stay the notebook's: a name holding a future, or a pytree of them,
    reads as its value during the statement and holds what it held once the statement is over
    (unless the statement rebound it, or changed the stand-in in place, which then stays:
    what it did is the user's). A container the statement changes in place (``losses.append``,
    ``state["step"] = 1``) is not lent at all: its futures give their values on demand."""
    tree = ast.parse(source)
    ast.increment_lineno(tree, line_offset)
    last = None
    if want_value and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    # the names it may read before it binds them (``y = float(x)`` reads x only)
    module = ast.Module(
        body=tree.body + ([ast.Expr(last.body)] if last is not None else []), type_ignores=[])
    changed = _changed_in_place(module)
    lent, arrays = [], False
    for name in reads_before_binding(module):
        value = user_ns.get(name)
        leaves = scope_leaves(value) if value is not None else ()
        if not any(isinstance(x, Future | jax.Array) for x in leaves):
            continue
        arrays = True
        if not any(isinstance(x, Future) for x in leaves) or (
                name in changed and not isinstance(value, Future)):
            continue
        stand_in = _values(value)
        if stand_in is not value:
            user_ns[name] = stand_in
            lent.append((name, value, stand_in, jax.tree_util.tree_flatten(stand_in)))
    try:
        with ambient_mesh(vs):
            exec(compile(tree, filename, "exec"), user_ns)  # noqa: S102 - the user's own cell
            if last is not None:
                return eval(compile(last, filename, "eval"), user_ns), arrays  # noqa: S307
        return None, arrays
    finally:
        for name, value, stand_in, (leaves, treedef) in lent:
            if user_ns.get(name) is stand_in and _same(stand_in, leaves, treedef):
                user_ns[name] = value


def _same(tree: Any, leaves: list, treedef) -> bool:
    """``tree`` still has the structure and leaves (by identity) it had."""
    now, now_def = jax.tree_util.tree_flatten(tree)
    return now_def == treedef and all(a is b for a, b in zip(now, leaves, strict=True))


_CHANGERS = _MUTATORS | {"pop", "popitem", "remove", "discard", "clear", "sort", "reverse",
                         "__setitem__", "__delitem__"}


def _changed_in_place(tree: ast.AST) -> set[str]:
    """Names whose objects ``tree`` changes in place: ``n[k] = v``, ``n.a = v``, ``del n[k]``,
    ``n[k] += v``, ``n.append(v)`` and the other methods that change a list, dict or set."""
    out: set[str] = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _CHANGERS):
            targets = [node.func]
        for t in targets:
            while isinstance(t, ast.Subscript | ast.Attribute):
                t = t.value
                if isinstance(t, ast.Name):
                    out.add(t.id)
    return out


def has_effects(graph) -> bool:
    """A node with effects but no values (a cell or segment whose only work is
    ``jax.debug.print``): it runs as plain Python, where the print happens."""
    return any(isinstance(node, ComputeNode) and getattr(getattr(
        node.exe, "jaxpr", None), "effects", None) for node in graph.nodes)


def printed(ctl, run: Callable[[], Any]) -> Any:
    """``run()`` (a cell or segment whose only work prints, as plain Python), once the
    runs it submitted have ended and their prints happened (``jax.effects_barrier``, which
    alone does not wait for a launch the controller has yet to make): else a compiled
    function's ``jax.debug.print`` landed after the cell ended, in another cell's output."""
    before = ctl.runs()  # (kept alive while their ids are compared)
    seen = set(map(id, before))
    value = run()
    for submitted in ctl.runs():
        if id(submitted) not in seen:
            submitted.wait()
    jax.effects_barrier()
    return value

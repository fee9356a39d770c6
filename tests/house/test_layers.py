"""The house's rules, read from the source with ``ast`` (no import runs):

- each layer imports only the layers below it (CONTRIBUTING.md has the table);
- no import circles between the package's modules (imports inside functions and type-only ones
  under ``if TYPE_CHECKING:`` count too: a late or type-only import only hides a circle, the
  modules still know each other);
- no private name (``_x``) imported from another module, nor read or set on another object
  (``obj._x`` where ``obj`` is not ``self`` or ``cls``: the ``SLF001`` rule of ruff, read here
  with ``ast`` so the test needs no linter);
- no module over ``MAX_LINES`` lines, outside the known list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "pwkernel"
MAX_LINES = 500

# What each layer may import (besides itself and the top-level package's plain names).
ALLOWED = {
    "runtime": set(),
    "backends": {"runtime"},
    "viz": {"runtime"},
    "notebook": {"runtime", "viz"},
    "train": {"runtime"},
    "bench": {"runtime", "backends", "viz", "train"},
    "pool": {"runtime", "backends"},
}
# Rules main breaks today, each with the issue that removes it: (module, layer it imports).
KNOWN: set[tuple[str, str]] = set()
# Private names imported across modules today, each with the issue that removes it.
KNOWN_PRIVATE: set[tuple[str, str]] = set()
# Private attributes reached on another object today, each with the issue that removes it:
# (module, "obj._x").
KNOWN_PRIVATE_ATTRIBUTES: set[tuple[str, str]] = set()
# Private names of the standard library's own types that are their public API.
PUBLIC_PRIVATE = {"_make", "_asdict", "_replace", "_fields", "_field_defaults", "_name_",
                  "_value_"}
# Import circles main has today (type-only imports counted), each with the issue that removes it.
KNOWN_CIRCLES: set[frozenset[str]] = set()
# Modules over MAX_LINES, each to be split.
LONG: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = PACKAGE.parent / name.replace(".", "/")
    return base.with_suffix(".py").exists() or base.is_dir()


def _type_only(tree: ast.AST) -> set[int]:
    """The lines of imports under ``if TYPE_CHECKING:`` (never run, so no circle)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for b in node.body for n in ast.walk(b) if hasattr(n, "lineno")}
    return lines


def imports(path: Path, typing: bool = True) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in ``path``; without
    ``typing``, those under ``if TYPE_CHECKING:`` left out."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing else _type_only(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [a.name for a in node.names]
            # `from . import x` where x is a module imports the module `base.x`
            modules = [n for n in names if _is_module(f"{base}.{n}")]
            out.extend((f"{base}.{n}", [], node.lineno) for n in modules)
            if len(modules) < len(names) or not names:
                out.append((base, [n for n in names if n not in modules], node.lineno))
    return out


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def edges(modules: dict[str, Path] | None = None, typing: bool = True) -> dict[str, set[str]]:
    modules = MODULES if modules is None else modules
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m, _, _ in imports(path, typing) if m in modules and m != name}
    return graph


def layer_violations(modules: dict[str, Path] | None = None) -> list[str]:
    modules = MODULES if modules is None else modules
    out = []
    for name, path in modules.items():
        mine = layer(name)
        if mine is None:
            continue
        for target, _, line in imports(path):
            theirs = layer(target) if target.startswith("pwkernel.") else None
            if theirs is None or theirs == mine or theirs in ALLOWED[mine]:
                continue
            if (name, theirs) not in KNOWN:
                out.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} "
                           f"({mine} may import {sorted(ALLOWED[mine]) or 'nothing'} of pwkernel)")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def private_imports(modules: dict[str, Path] | None = None) -> list[str]:
    modules = MODULES if modules is None else modules
    out = []
    for name, path in modules.items():
        for target, names, line in imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")
                       and (name, n) not in KNOWN_PRIVATE]
            if private and target.startswith("pwkernel") and target != name:
                out.append(f"{path.relative_to(ROOT)}:{line}: imports {private} from {target}")
    return out


def _private_attribute(node: ast.AST) -> str | None:
    """``"obj._x"`` when ``node`` reads or sets a private attribute of another object."""
    if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
        return None
    if node.attr.startswith("__") and node.attr.endswith("__") or node.attr in PUBLIC_PRIVATE:
        return None
    owner = node.value
    if isinstance(owner, ast.Name) and owner.id in ("self", "cls", "mcs"):
        return None
    if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and \
            owner.func.id == "super":
        return None
    return f"{ast.unparse(owner)}.{node.attr}"


def _same_class_objects(tree: ast.AST) -> set[int]:
    """The name nodes, inside a class's methods, of objects annotated with that class
    (``other: Future`` in ``Future``'s own method): its private names are its own, as ruff's
    SLF001 reads them."""
    own: set[int] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            names = {a.arg for a in args if a.annotation is not None
                     and ast.unparse(a.annotation).strip("'\"") == cls.name}
            names |= {n.target.id for n in ast.walk(fn) if isinstance(n, ast.AnnAssign)
                      and isinstance(n.target, ast.Name)
                      and ast.unparse(n.annotation).strip("'\"") == cls.name}
            own |= {id(n) for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in names}
    return own


def private_attributes(modules: dict[str, Path] | None = None,
                       known: set[tuple[str, str]] | None = None) -> list[str]:
    """Each ``obj._x`` on an object other than ``self``/``cls``, outside ``known``."""
    modules = MODULES if modules is None else modules
    known = KNOWN_PRIVATE_ATTRIBUTES if known is None else known
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        own = _same_class_objects(tree)
        for node in ast.walk(tree):
            found = _private_attribute(node)
            if found is not None and id(node.value) not in own and (name, found) not in known:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {found}")
    return sorted(out, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def test_each_layer_imports_only_the_layers_below_it():
    bad = layer_violations()
    assert not bad, ("imports across the layers' rules (see CONTRIBUTING.md, 'The layers'); "
                     "move the code down a layer or pass it in:\n" + "\n".join(bad))


def test_the_known_exceptions_still_exist():
    """An exception listed in KNOWN that no longer happens must be removed from the list."""
    graph = edges()
    gone = [(m, lay) for m, lay in KNOWN
            if not any(layer(t) == lay for t in graph.get(m, set()))]
    assert not gone, f"remove from KNOWN, the import is gone: {gone}"
    used = {(m, n) for m, p in MODULES.items() for _, names, _ in imports(p) for n in names}
    assert KNOWN_PRIVATE <= used, f"remove from KNOWN_PRIVATE: {KNOWN_PRIVATE - used}"


def new_cycles(modules: dict[str, Path] | None = None) -> list[list[str]]:
    """The import circles, type-only imports counted, that ``KNOWN_CIRCLES`` does not list."""
    return [c for c in cycles(edges(modules)) if frozenset(c) not in KNOWN_CIRCLES]


def test_no_import_circles():
    found = new_cycles()
    assert not found, ("modules that import each other (directly or round a circle, imports "
                       "under `if TYPE_CHECKING:` included); move what both need into a module "
                       "below them, or pass it in through a Protocol defined below both: "
                       f"{found}")
    gone = KNOWN_CIRCLES - {frozenset(c) for c in cycles(edges())}
    assert not gone, f"remove from KNOWN_CIRCLES, the circle is gone: {gone}"


def test_no_private_names_across_modules():
    bad = private_imports()
    assert not bad, ("a private name (_x) is for its own module; make it public (and document "
                     "it) or move the code that needs it:\n" + "\n".join(bad))


def test_no_private_attributes_of_other_objects():
    bad = private_attributes()
    assert not bad, ("a private attribute (obj._x) belongs to its own class: give it a public "
                     "name (and document it), or move the code that needs it into that "
                     "class:\n" + "\n".join(bad))


def test_the_known_private_attributes_are_still_used():
    everything = private_attributes(known=set())
    used = {(module_name(ROOT / line.split(":")[0]), line.split(": ", 1)[1])
            for line in everything}
    assert KNOWN_PRIVATE_ATTRIBUTES <= used, ("remove from KNOWN_PRIVATE_ATTRIBUTES, no "
                                              f"longer used: {KNOWN_PRIVATE_ATTRIBUTES - used}")


def test_the_private_attribute_check_catches_one(tmp_path):
    """A module that reaches into another object's private attribute fails the check; one
    that uses its own (``self._x``, ``cls._x``, ``super()._x``) and a named tuple's
    ``_replace`` does not."""
    pkg = tmp_path / "pwkernel" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("def peek(box):\n    return box._hidden\n")
    (pkg / "b.py").write_text(
        "class Box:\n"
        "    def __init__(self):\n        self._hidden = 1\n"
        "    @classmethod\n    def make(cls):\n        return cls._build()\n"
        "    def __repr__(self):\n        return super().__repr__() + str(self._hidden)\n"
        "    def moved(self, point):\n        return point._replace(x=self._hidden)\n")
    mods = {f"pwkernel.runtime.{m}": pkg / f"{m}.py" for m in ("a", "b")}
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = private_attributes(mods, known=set())
        assert found == ["pwkernel/runtime/a.py:2: box._hidden"]
        assert private_attributes(mods, known={("pwkernel.runtime.a", "box._hidden")}) == []
    finally:
        ROOT = saved


def test_modules_stay_small():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    new = {p: n for p, n in long.items() if p not in LONG}
    assert not new, f"modules over {MAX_LINES} lines (split them by what they hold): {new}"
    assert set(long) >= LONG, f"remove from LONG, now short enough: {LONG - set(long)}"


@pytest.mark.parametrize("case", ["layer", "circle", "typed circle", "private"])
def test_the_checks_catch_what_they_forbid(tmp_path, case):
    """Each rule, broken once in a throwaway package laid out like ours."""
    pkg = tmp_path / "pwkernel"
    for sub in ("runtime", "viz"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    body = {"layer": ("from ..viz import b\n", ""),
            "circle": ("from . import b\n", "from . import a\n"),
            "typed circle": ("from . import b\n", "from typing import TYPE_CHECKING\n"
                             "if TYPE_CHECKING:\n    from .a import A\n"),
            "private": ("from .b import _hidden\n", "_hidden = 1\n")}[case]
    where = "viz" if "circle" in case else "runtime"
    (pkg / "runtime" / "a.py").write_text(body[0])
    (pkg / where / "b.py").write_text(body[1])
    global ROOT, PACKAGE
    saved = ROOT, PACKAGE
    ROOT, PACKAGE = tmp_path, pkg
    try:
        mods = {module_name(p): p for p in sorted(pkg.rglob("*.py"))}
        if "circle" in case:
            (pkg / "runtime" / "b.py").write_text(body[1])
            mods = {module_name(p): p for p in sorted(pkg.rglob("*.py"))}
            assert new_cycles(mods) == [["pwkernel.runtime.a", "pwkernel.runtime.b"]]
        elif case == "layer":
            assert layer_violations(mods) and "runtime imports pwkernel.viz" in \
                layer_violations(mods)[0]
        else:
            assert private_imports(mods) and "_hidden" in private_imports(mods)[0]
    finally:
        ROOT, PACKAGE = saved

"""The docs run verbatim: every fenced code block of README.md and of every page of docs/.

How a block is read (the rule for whoever edits these pages):

- A fence must name its language: ``python``, ``bash`` or ``text``.
- ``python`` is code that runs as written. A run of ``python`` fences with nothing but blank
  lines between them is one example. If a line of it is an IPython magic (it starts with
  ``%``), the example is a notebook: each fence is one cell, run in order on a fresh
  ``pwkernel`` kernel, and its first line is ``%load_ext pwkernel``. Otherwise it is a script,
  run by a fresh Python process in an empty directory. Either way it shows its own imports:
  the kernel imports nothing.
- ``bash`` is shell commands, not run: each command is checked to exist (a Makefile target, a
  ``python -m`` module, a program an installed package provides).
- ``text`` is output, layouts, anything illustrative: not run.
- ``<!-- no-test: REASON -->`` on the line before a fence: that example is only compiled
  (it needs what a test cannot have, e.g. a Ray cluster); keep these few.

A failure names the page and line of the fence, and shows the error.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pwkernel.notebook import kernelspec
from tests.helpers import ROOT

PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
LANGUAGES = ("python", "bash", "text")
TIMEOUT = 300  # seconds for one script, or one notebook cell (a busy 2-core machine is slow)

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[^\s`]*)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NO_TEST = re.compile(r"^\s*<!--\s*no-test:\s*(?P<why>.+?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of its opening fence) and what it holds."""

    page: str
    line: int
    lang: str
    source: str
    no_test: str | None  # the reason, from <!-- no-test: ... --> on the line before
    follows: bool  # only blank lines since the previous block closed


@dataclasses.dataclass(frozen=True)
class Example:
    """Adjacent python blocks: one script, or the cells of one notebook."""

    blocks: tuple[Block, ...]

    @property
    def id(self) -> str:
        return f"{self.blocks[0].page}:{self.blocks[0].line}"

    @property
    def notebook(self) -> bool:
        return any(line.lstrip().startswith("%") for b in self.blocks
                   for line in b.source.splitlines())

    @property
    def no_test(self) -> str | None:
        return self.blocks[0].no_test

    def script(self) -> str:
        """The blocks as one file whose line numbers are the page's, for tracebacks."""
        out: list[str] = []
        for b in self.blocks:
            out += [""] * (b.line - len(out))  # the fence line and what came before: blank
            out += b.source.splitlines()
        return "\n".join(out) + "\n"


def blocks(page: str, text: str | None = None) -> list[Block]:
    """Every fenced block of ``page`` (its text read from the repository unless given)."""
    lines = (text if text is not None else (ROOT / page).read_text()).splitlines()
    found: list[Block] = []
    i, last_close = 0, None
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start = len(m["indent"]), m["fence"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence)
                                      and lines[i].strip().strip(fence[0]) == ""):
            line = lines[i]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: a fence that is never closed")
        before = lines[start - 1] if start else ""
        skip = _NO_TEST.match(before)
        gap = lines[last_close + 1:start] if last_close is not None else ["x"]
        found.append(Block(page, start + 1, m["lang"], "\n".join(body) + "\n",
                           skip["why"] if skip else None, all(not s.strip() for s in gap)))
        last_close = i
        i += 1
    return found


def examples(found: list[Block]) -> list[Example]:
    """The python blocks grouped into examples: adjacent fences go together."""
    groups: list[list[Block]] = []
    previous = None
    for b in found:
        if b.lang == "python":
            if previous is not None and previous.lang == "python" and b.follows:
                groups[-1].append(b)
            else:
                groups.append([b])
        previous = b
    return [Example(tuple(g)) for g in groups]


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
EXAMPLES = examples(ALL_BLOCKS)
SCRIPTS = [e for e in EXAMPLES if not e.notebook]
NOTEBOOKS = [e for e in EXAMPLES if e.notebook]
SHELL = [b for b in ALL_BLOCKS if b.lang == "bash"]


def _params(items):
    return [pytest.param(e, id=e.id if isinstance(e, Example) else f"{e.page}:{e.line}",
                         marks=[pytest.mark.skip(reason=e.no_test)] if e.no_test else [])
            for e in items]


# --- the rules themselves ---------------------------------------------------------------------
def test_every_fence_names_a_language_we_know():
    bad = [f"{b.page}:{b.line} ```{b.lang}" for b in ALL_BLOCKS if b.lang not in LANGUAGES]
    assert not bad, (f"fences must be one of {LANGUAGES} (```text for output or anything "
                     f"illustrative): {bad}")


def test_the_pages_have_examples_of_each_kind():
    # A parser that found nothing would make every other test here pass vacuously.
    assert len(SCRIPTS) >= 2 and len(NOTEBOOKS) >= 3 and len(SHELL) >= 2, (
        len(SCRIPTS), len(NOTEBOOKS), len(SHELL))


def test_excluded_examples_are_few_and_still_compile():
    excluded = [e for e in EXAMPLES if e.no_test]
    assert len(excluded) <= 4, [f"{e.id}: {e.no_test}" for e in excluded]
    for e in excluded:
        if not e.notebook:
            compile(e.script(), e.id, "exec")


def test_notebook_examples_load_the_extension_first():
    bad = [e.id for e in NOTEBOOKS
           if e.blocks[0].source.lstrip().splitlines()[0].strip() != "%load_ext pwkernel"]
    assert not bad, f"a notebook example starts with %load_ext pwkernel: {bad}"


def test_the_parser_reads_fences_lists_and_markers():
    page = "\n".join([
        "text", "```python", "import a", "```", "", "```python", "%pathways status", "```",
        "- item", "  ```python", "  x = 1", "    y = 2", "  ```", "  ```python", "  w = 3",
        "  ```", "prose", "<!-- no-test: needs Ray -->", "```python", "z = 1", "```",
        "```text", "out", "```",
    ])
    found = blocks("page.md", page)
    assert [(b.line, b.lang, b.follows, b.no_test) for b in found] == [
        (2, "python", False, None), (6, "python", True, None), (10, "python", False, None),
        (14, "python", True, None), (19, "python", False, "needs Ray"),
        (22, "text", True, None)]
    assert found[2].source == "x = 1\n  y = 2\n"
    ex = examples(found)
    assert [len(e.blocks) for e in ex] == [2, 2, 1]
    assert [e.notebook for e in ex] == [True, False, False] and ex[2].no_test == "needs Ray"
    assert ex[1].script().splitlines()[10:15] == ["x = 1", "  y = 2", "", "", "w = 3"]
    assert ex[2].script().splitlines()[19] == "z = 1"  # line 20 of the page, as in the script


# --- python scripts: a fresh interpreter each ---------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PWKERNEL_ISLANDS", None)  # the documented defaults
    return env


def run_script(example: Example, where: Path) -> subprocess.CompletedProcess:
    path = where / (example.id.replace("/", "_").replace(":", "_") + ".py")
    path.write_text(example.script())
    return subprocess.run([sys.executable, path.name], cwd=where, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("example", _params(SCRIPTS))
def test_python_example_runs(example, tmp_path):
    done = run_script(example, tmp_path)
    assert done.returncode == 0, (
        f"{example.id}: this example failed as written (line numbers are the page's):\n"
        f"{done.stderr[-4000:]}")


# --- notebooks: a fresh pwkernel kernel each ------------------------------------------------
def cell_failures(example: Example, nb) -> list[str]:
    out = []
    for block, cell in zip(example.blocks, nb.cells, strict=True):
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                tb = _ANSI.sub("", "\n".join(o.get("traceback", [])[-8:]))
                out.append(f"{block.page}:{block.line}: {o.ename}: {o.evalue}\n{tb}")
            elif (o.output_type == "stream" and o.name == "stderr"
                  and re.search(r"UsageError|Traceback", o.text)):
                out.append(f"{block.page}:{block.line}: {o.text[-2000:]}")
    return out


def run_notebook(example: Example, where: Path):
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(b.source.rstrip("\n")) for b in example.blocks])
    NotebookClient(nb, kernel_name=kernelspec.NAME, timeout=TIMEOUT, startup_timeout=120,
                   allow_errors=True, resources={"metadata": {"path": str(where)}}).execute()
    return nb


@pytest.mark.parametrize("example", _params(NOTEBOOKS))
def test_notebook_example_runs(example, kernel_env, tmp_path):
    nb = run_notebook(example, tmp_path)
    failures = cell_failures(example, nb)
    assert not failures, "\n\n".join(failures)


# --- shell commands: not run, checked to exist ------------------------------------------------
def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


def _console_script(name: str) -> bool:
    return any(ep.name == name for ep in importlib.metadata.entry_points(group="console_scripts"))


def _module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def command_problems(source: str) -> list[str]:
    """What is wrong with each command of a shell block ([] when every one exists)."""
    problems = []
    for line in source.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.commenters, lexer.whitespace_split = "#", True
        words: list[str] = []
        for token in [*lexer, "&&"]:
            if token not in ("&&", "||", ";", "|"):
                words.append(token)
                continue
            if words:
                problems += _command_problem(words)
            words = []
    return problems


def _command_problem(words: list[str]) -> list[str]:
    prog, args = words[0], words[1:]
    if prog == "export":
        return [] if all("=" in a for a in args) else [f"export of no value: {words}"]
    if prog == "make":
        missing = [a for a in args if "=" not in a and a not in _make_targets()]
        return [f"no Makefile target {t!r}" for t in missing]
    if Path(prog).name.startswith("python"):
        if args[:1] == ["-m"]:
            return [] if _module(args[1]) else [f"no module {args[1]!r} ({' '.join(words)})"]
        return [f"python without -m: {words}"]
    if prog == "cd":
        return [] if (ROOT / args[0]).is_dir() else [f"no directory {args[0]!r} to cd to"]
    if prog == "npm":  # (the extension's: extension/package.json)
        scripts = json.loads((ROOT / "extension" / "package.json").read_text())["scripts"]
        task = args[1] if args[:1] == ["run"] else args[0]
        return [] if task == "ci" or task in scripts else [f"no npm script {task!r}: {words}"]
    if prog.startswith(".venv/bin/"):  # (a program of the environment the tests run in)
        found = (Path(sys.executable).parent / Path(prog).name).exists()
        return [] if found else [f"no {Path(prog).name!r} in the environment: {words}"]
    if _console_script(prog):
        return []
    return [f"unknown program {prog!r}: teach tests/house/test_docs.py how to check it ({words})"]


@pytest.mark.parametrize("block", _params(SHELL))
def test_shell_commands_exist(block):
    assert not command_problems(block.source), (f"{block.page}:{block.line}",
                                                command_problems(block.source))


def test_the_shell_check_can_fail():
    assert command_problems("make lab LAB_ARGS=1\npython -m pwkernel.bench  # ok") == []
    assert len(command_problems("make no-such-target && python -m pwkernel.nope\nfrob x")) == 3
    assert command_problems("cd extension\nnpm ci && npm run build && npm test\n"
                            ".venv/bin/pytest -q") == []
    assert len(command_problems("cd no-such-dir\nnpm run no-such-script\n"
                                ".venv/bin/no-such-program")) == 3


def test_inline_python_m_commands_name_modules_that_exist():
    text = "\n".join((ROOT / p).read_text() for p in PAGES)
    named = set(re.findall(r"`[^`]*?python -m ([\w.]+)[^`]*`", text))
    assert named, "expected `python -m ...` commands in the pages"
    assert not [m for m in named if not _module(m)], sorted(m for m in named if not _module(m))


_TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?|(?<![\w/.])::(\w+)")


def test_the_tests_the_pages_name_exist():
    """Every ``tests/x.py::test_y`` that README.md and docs/*.md give as evidence names a test
    that exists (``::test_z`` alone: another test of the file named last); a renamed test
    otherwise leaves a promise pointing at nothing."""
    missing, named = [], 0
    pages = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
    for page in pages:
        current = None
        for m in _TEST_REF.finditer((ROOT / page).read_text()):
            path, name = (m[1], m[2]) if m[1] else (current, m[3])
            current = path
            if path is None or not (ROOT / path).exists():
                missing.append(f"{page}: {m[0]} (no such file)")
            elif name:
                named += 1
                if not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b",
                                 (ROOT / path).read_text(), re.M):
                    missing.append(f"{page}: {path}::{name}")
    assert named > 50, f"expected the pages to name their tests, found {named}"
    assert not missing, missing


# --- the runner itself can fail --------------------------------------------------------------
def test_a_broken_script_fails(tmp_path):
    broken = Example((Block("page.md", 3, "python", "import numpy as np\nnp.nope()\n", None,
                            False),))
    done = run_script(broken, tmp_path)
    assert done.returncode != 0 and 'page.md_3.py", line 5' in done.stderr, done.stderr


def test_a_broken_notebook_fails(kernel_env, tmp_path):
    cells = ("%load_ext pwkernel\nx = 1", "%pathways slice s 4x4", "%%pathways --slice s\ny = (")
    broken = Example(tuple(Block("page.md", 10 * i, "python", c, None, True)
                           for i, c in enumerate(cells, 1)))
    failures = cell_failures(broken, run_notebook(broken, tmp_path))
    assert [f.split(":")[1] for f in failures] == ["20", "30"], failures

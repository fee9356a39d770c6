"""Cells in a real IPython ``InteractiveShell`` (its ``ip`` fixture: tests/notebook/conftest.py)."""

from __future__ import annotations

import jax

import pwkernel as pw


def run(ip, source: str):
    """Run a cell; return its result, raising the cell's error (UsageError included)."""
    result = ip.run_cell(source)
    if result.error_before_exec is not None:
        raise result.error_before_exec
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result


def forget_futures(shell) -> None:
    """Drop the shell's references to futures, so the next test's controller starts clean:
    the output history (``Out``, ``_``, ``_N``; as ``%reset -f out``) and every user name
    whose value holds one. IPython's own names (``_oh``, ``Out``, ...) stay: its display hook
    needs them."""
    shell.displayhook.flush()
    hidden = shell.user_ns_hidden
    for name in [n for n, v in shell.user_ns.items() if n not in hidden and any(
            isinstance(x, pw.Future) for x in _leaves(v))]:
        del shell.user_ns[name]



def _leaves(value) -> list:
    """``value``'s pytree leaves; a dict JAX cannot flatten (its keys do not sort): its
    values' leaves."""
    try:
        return jax.tree_util.tree_leaves(value)
    except ValueError:
        return jax.tree_util.tree_leaves(list(value.values()) if type(value) is dict else [])

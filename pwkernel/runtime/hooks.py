"""The runtime's hooks on a future (launch hooks, end hooks): ``None``, one callable, or a
list of them, dropped once fired. One hook, the common case, costs no list."""

from __future__ import annotations


def added(hooks, fn):
    """``hooks`` (None, a callable or a list of them) with ``fn`` after them."""
    if hooks is None:
        return fn
    if type(hooks) is list:
        hooks.append(fn)
        return hooks
    return [hooks, fn]


def fire(hooks, fut) -> None:
    """Call each of ``hooks`` with ``fut``, in the order they were added."""
    if type(hooks) is list:
        for fn in hooks:
            fn(fut)
    else:
        hooks(fut)

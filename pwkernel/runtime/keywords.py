"""A misspelt keyword argument to the public API, answered with the word that was meant.

Python's own ``TypeError`` names the keyword that came (``got an unexpected keyword argument
'iland'``) but not the one meant; ``unexpected_keyword`` adds the closest of the keywords the
call takes, and the list of them. ``suggests_keywords`` puts it on a public function, method
or class: the call itself is unchanged (one more frame), and only the ``TypeError`` Python
raises while binding that call's own arguments is rewritten, never one from inside it.

>>> @suggests_keywords("pw.demo")
... def demo(x, *, island=None):
...     return x
>>> demo(1, iland=0)
Traceback (most recent call last):
TypeError: pw.demo() got an unexpected keyword argument 'iland'. Did you mean island=? \
pw.demo() takes: x, island.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(\w+)'")
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)

T = TypeVar("T", bound=Callable)


def keywords_of(fn: Callable) -> list[str]:
    """The names ``fn`` takes by keyword, in order (a method's ``self`` left out)."""
    params = list(inspect.signature(fn).parameters.values())
    return [p.name for p in params if p.kind in _BY_KEYWORD and p.name not in ("self", "cls")]


def unexpected_keyword(name: str, key: str, takes: Iterable[str]) -> TypeError:
    """The ``TypeError`` for ``name(key=...)`` where ``name`` takes only ``takes``: Python's
    words, the closest of ``takes`` (if one is close) and all of them."""
    takes = list(takes)
    near = difflib.get_close_matches(key, takes, n=1)
    meant = f" Did you mean {near[0]}=?" if near else ""
    return TypeError(f"{name}() got an unexpected keyword argument {key!r}.{meant} {name}() "
                     f"takes: {', '.join(takes) or 'no keyword arguments'}.")


def _own_unexpected(error: TypeError, kwargs: dict) -> str | None:
    """The keyword ``error`` refuses when it is the call's own binding error: raised in the
    calling frame itself (a binding error has no frame of the callee in its traceback; an
    error from inside the function has), about a keyword the call was given."""
    tb = error.__traceback__
    if tb is None or tb.tb_next is not None:
        return None
    found = _UNEXPECTED.search(str(error))
    return found[1] if found and found[1] in kwargs else None


def suggests_keywords(name: str) -> Callable[[T], T]:
    """Decorator: a call of the function (or class: its ``__init__``) given a keyword it does
    not take raises ``unexpected_keyword(name, ...)``; any other error passes unchanged."""
    def wrap(target: T) -> T:
        if isinstance(target, type):
            target.__init__ = wrap(target.__init__)
            return target
        fn = target

        @functools.wraps(fn)
        def call(*args, **kwargs):
            __tracebackhide__ = True  # (IPython and pytest show the function's frames only)
            try:
                return fn(*args, **kwargs)
            except TypeError as error:
                key = _own_unexpected(error, kwargs)
                if key is None:
                    raise
                raise unexpected_keyword(name, key, keywords_of(fn)) from None
        return call  # type: ignore[return-value]
    return wrap

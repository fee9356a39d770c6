"""Batches done in C: how the runtime reads and writes many futures, slots or store entries
with no Python work per item (a training state of a hundred leaves is a hundred of each).

The idiom is ``map`` (with ``operator``'s functions, ``attrgetter``, bound methods such as
``list.__setitem__``) over columns, ``itertools.compress`` to pick items by a column of
flags, and ``exhaust`` to run an iterator of calls to its end: each step is a C call, none is
a Python bytecode. A batch has a fixed cost of its own, so fewer than ``MANY`` items go one
by one in plain Python, which costs less for them.
"""

from __future__ import annotations

import functools
import operator
from collections import deque

#: from how many items on a batch costs less than a Python loop over them
MANY = 4

#: runs an iterator (of calls made by ``map``) to its end, keeping nothing
exhaust = deque(maxlen=0).extend

#: ``not_none(x)``: ``x is not None``, as a C callable (a future's ``__bool__`` would wait
#: for its value, so ``filter(None, ...)`` never picks futures)
not_none = functools.partial(operator.is_not, None)

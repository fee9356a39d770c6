"""A ``send`` that a later ``run`` donates its buffer after: the send still gets the value.

An island issues a ``send`` in message order, but reads its buffer (to the host, for the
destination) only when its completion thread gets to it, after the work issued before it has
ended. A ``run`` that donates that buffer, issued next (the next training step, after an eval
on another island was given the parameters), would consume it first, and the send failed
with "Array has been deleted". Under ``jax.jit`` the transfer, dispatched first, holds the
buffer. So a send keeps its array in a ``Sending``, and a run about to donate an array a
send has not read yet first gives that send a copy of it (made on the devices before the
donation, so in order; only then is memory spent), or, if the send is reading it already,
waits until it has read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


class Sending:
    """One issued ``send``'s value, until its completion thread has read it."""

    __slots__ = ("array", "key", "reading", "done")

    def __init__(self, array):
        self.array = array
        self.key = id(array)  # (the pending list it is in, while it is)
        self.reading = False
        self.done = False


class Sends:
    """An island's sends not read yet, by their arrays (a pool's tenants' buffer ids are
    their own: the array is what a donation consumes)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[int, list[Sending]] = {}  # id(array) -> its unread sends

    def issued(self, array) -> Sending:
        """A send of ``array`` (None: its producer failed) was issued."""
        sending = Sending(array)
        if array is not None:
            with self._cv:
                self._pending.setdefault(sending.key, []).append(sending)
        return sending

    def read(self, sending: Sending, how: Callable[[Any], Any]):
        """``how(array)``, the send's value read (by its completion thread)."""
        with self._cv:
            sending.reading = True
            array = sending.array
        try:
            return how(array)
        finally:
            with self._cv:
                sending.done, sending.array = True, None
                self._forget(sending)
                self._cv.notify_all()

    def before_donating(self, arrays: Iterable, copy: Callable[[Any], Any]) -> None:
        """A run is about to donate ``arrays``: the sends of them not read yet get a copy
        (``copy(array)``), or are waited for if they are reading it."""
        if not self._pending:  # (the usual case: no send of this island unread)
            return
        with self._cv:
            for array in arrays:
                for sending in list(self._pending.get(id(array), ())):
                    if sending.array is not array:
                        continue
                    if sending.reading:
                        self._cv.wait_for(lambda s=sending: s.done)
                        continue
                    try:
                        sending.array = copy(array)
                    except Exception:  # noqa: BLE001 - the send then fails as it would have
                        continue
                    self._forget(sending)  # (its copy is its own: no donation reaches it)

    def _forget(self, sending: Sending) -> None:
        waiting = self._pending.get(sending.key)
        if waiting is not None and sending in waiting:
            waiting.remove(sending)
            if not waiting:
                del self._pending[sending.key]

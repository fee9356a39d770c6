"""What a future lends a JAX operation before its value (``Future.array``): the array its
computation launched, still being computed, as JAX computes on an array not ready yet.

Two things make that array the value's own, as ``jax.jit``'s output would be:

- ``trusted``: it is lent only where its failure would show in it, as XLA's errors do. A
  computation that calls back into Python fails only at its end, with zeros given to XLA in
  place of the callback's result (``callbacks``), so neither its launched array nor any
  computed from it (a consumer launched behind it, on any island) carries the error: an
  operation on those waits for the value and raises the error, where computing on the zeros
  would give silent garbage (``total + loss`` after a failed data-loading callback).
- ``Future.array`` marks the buffer lent (``lent``): the user's from then on, as ``result()``
  makes it (``ObjectStore.fetch``), and ``set_result(s)`` marks its store entry so: an
  operation may return it as it is (``jnp.asarray(fut)``,
  ``fut.astype(fut.dtype)``, ``fut[...]``), and the store must not delete it when the future
  goes or its controller closes, as it would an unread buffer.
"""

from __future__ import annotations

#: the most unended computations an operation looks through before it waits for the value
#: instead (a loop far ahead of its devices: each look would grow with the distance)
LOOKED_AT = 256


def trusted(task) -> bool:
    """Whether ``task``'s launched outputs may be computed on before its end: neither it nor
    any computation it reads from (directly, through copies, or through computations still
    running, of any run) calls back into Python and is still running or ended with an error
    not yet recorded, and none of them failed. False too past ``LOOKED_AT`` of them."""
    todo, seen = [task], {id(task)}
    while todo:
        if len(seen) > LOOKED_AT:
            return False
        t = todo.pop()
        if t.has_ended:  # (its outputs' errors are recorded once their ends are)
            run, outs = t.run, t.node.outputs
            if run.slots_ended(outs) is None or run.slot_error(outs) is not None:
                return False
            continue
        if not t.node.asynchronous or t.input_error() is not None:
            return False
        for p in t.producers(running=False):
            if id(p) not in seen:
                seen.add(id(p))
                todo.append(p)
    return True


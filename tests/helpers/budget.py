"""The memory budget's fan-in that cannot fit, for the local and the Ray islands alike."""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw

MiB = 1 << 20


def reserved(ctl) -> dict[int, int]:
    """What the islands' schedulers count against the budget, per device."""
    out: dict[int, int] = {}
    for island in ctl.status()["islands"]:
        out |= island["memory_reserved"]
    return out


def assert_all_memory_returned(ctl) -> None:
    assert ctl.wait(60)
    gc.collect()
    assert not any(ctl.memory().values()), ctl.store.records()
    assert not any(reserved(ctl).values()), reserved(ctl)


def fan_in(s0):
    """The issue's reproduction: five 1 MiB-per-device values on ``s0`` (2 devices) feed one
    consumer, so under a 4 MiB budget they can never all be alive at once."""
    make = pw.function(lambda x: jnp.broadcast_to(x[:, None], (512, 1024)) * 2.0,
                       slice=s0, in_specs=pw.BATCH, name="make")
    add5 = pw.function(lambda a, b, c, d, e: a + b + c + d + e, slice=s0, name="add5")

    @pw.program
    def fanin(x):
        return add5(*[make(x) for _ in range(5)])

    return fanin


def check_fan_in_fails_and_says_who_holds_the_memory(ctl) -> None:
    out = fan_in(ctl.slice(2, island=0))(np.ones(512, np.float32))
    with pytest.raises(pw.MemoryBudgetError) as info:
        out.result(timeout=60)
    text = str(info.value)
    assert "program 'fanin'" in text and "4.0 MiB per device" in text
    assert "'make'" in text and "needs 1.0 MiB" in text and "island 0" in text
    assert "held for its computations that have not run" in text
    assert "Maybe you want a larger memory_budget" in text
    assert out.state is pw.FutureState.FAILED and isinstance(out.exception(), MemoryError)
    del out
    assert_all_memory_returned(ctl)

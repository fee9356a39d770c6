"""What a training loop holds step after step: the bytes ``ctl.memory()`` counts after each
of ``steps`` steps (everything ended), above what was held before the first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pwkernel as pw


def held_over_steps(ctl, trainer, batch: Callable[[int], Any], steps: int = 20
                    ) -> tuple[list[int], Any, Any]:
    """``trainer.step`` ``steps`` times from ``trainer.init(0)``, on ``batch(i)``: the bytes
    held after each step above the start, the last state and the last loss."""
    ctl.wait()
    base = sum(ctl.memory().values())
    state, held, loss = trainer.init(0), [], None
    for i in range(steps):
        state, loss = trainer.step(state, batch(i))
        pw.train.wait((state, loss))
        ctl.wait()
        held.append(sum(ctl.memory().values()) - base)
    return held, state, loss

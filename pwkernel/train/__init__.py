"""Training on pwkernel: pipelined and data-parallel, built on ``pw.function`` and
``@pw.program`` only (``pw.train``; see docs/training.md).

- ``Stage(init, apply)``: a group of layers; ``transformer.split(cfg, n)`` makes a small
  decoder-only Transformer's.
- ``Pipeline(stages, slices, loss=, optimizer=, schedule="1f1b"|"gpipe", microbatches=M)``:
  each stage on its own slice (any island), one training step as ONE program.
- ``SPMD(stages, slice, loss=, optimizer=)``: the same model data-parallel on one slice
  (``packed=True``: its state as a ``PackedState``, a few flat arrays).
- Both: ``state = t.init(key)``, ``state, loss = t.step(state, (x, y))`` (futures at once).
  ``t.evaluate(state, (x, y))``: the loss without an update (an eval step).
- Measured from the trace: ``bubble(events)``, ``peak_residuals(events, bytes)``; sampled:
  ``MemorySampler(ctl)``.

>>> import optax, pwkernel as pw
>>> from pwkernel.train import transformer
>>> ctl = pw.Controller(islands=(4, 4))
>>> cfg = transformer.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
>>> pipe = pw.train.Pipeline(transformer.split(cfg, 2),
...                          [ctl.slice(1, island=0), ctl.slice(1, island=1)],
...                          loss=transformer.cross_entropy, optimizer=optax.adam(1e-2),
...                          schedule="1f1b", microbatches=2)
>>> state = pipe.init(0)
>>> batch = transformer.batch(cfg, 4)
>>> losses = []
>>> for _ in range(3):
...     state, loss = pipe.step(state, batch)
...     losses.append(float(loss))
>>> losses[2] < losses[0]
True
>>> ctl.close()
"""

from . import transformer
from .coupling import clip_by_global_norm
from .measure import MemorySampler, bubble, peak_residuals, stage_order_seen
from .pipeline import Microbatches, Pipeline
from .schedule import Call, Kind, Schedule, order, stage_order
from .spmd import SPMD, init_state, train_step
from .stage import Stage, backward, forward, model_loss
from .state import PackedState, TrainState, fetch, wait

__all__ = [
    "SPMD", "Call", "Kind", "MemorySampler", "Microbatches", "PackedState", "Pipeline",
    "Schedule", "Stage", "TrainState", "backward", "bubble", "clip_by_global_norm", "fetch",
    "forward", "init_state", "model_loss", "order", "peak_residuals", "stage_order",
    "stage_order_seen", "train_step", "transformer", "wait",
]

"""``pw.train`` on simulated slices pays for the all-reduces XLA would run.

On a real slice XLA's SPMD partitioner inserts the all-reduce of a data-parallel step's
gradients (``SPMD``'s step, each multi-chip ``Pipeline`` stage's backward) and of a loss's
mean (an eval step, the last stage's forward); the simulator sees only collectives written
with ``shard_map``, so on simulated slices these are written out. XLA's ``AllReduceCombiner``
then runs a step's all-reduces of one dtype as one, up to 30 MiB (``COMBINE_BYTES``), and so
does the simulator. The expected times are worked out by hand from the
cost model's inputs (docs/simulator.md, "Collectives"): the chips compute instantly, so a
step's time is its all-reduces alone, each ``2 * ((n-1)/n * bytes / bandwidth + steps *
latency)``, over a ring in each torus dimension the group spans."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw

WIDTH = 1024                    # two stages, one WIDTH x WIDTH f32 weight each
LINK, LATENCY = 45e9, 1e-6      # bytes/s one way per torus link; seconds per ring step
TORUS = (4, 4, 4)


def layer():
    return pw.train.Stage(init=lambda key: {"w": jnp.zeros((WIDTH, WIDTH), jnp.float32)},
                          apply=lambda p, x: jnp.tanh(x @ p["w"]))


@pytest.fixture(scope="module")
def instant_ctl():
    """A 4 x 4 x 4 torus of chips with no compute or memory time: only collectives take
    time (and the host side, which is not part of a computation's span)."""
    base = pw.sim.Cluster.preset("tpu-v4", chips=64)
    cluster = dataclasses.replace(
        base, chip=pw.sim.Chip("instant", 1e30, 32 * 2**30, 1e30, launch_overhead=0.0),
        ici=pw.sim.Interconnect(LINK, LATENCY, torus=TORUS))
    ctl = pw.Controller(backend="sim", cluster=cluster)
    try:
        yield ctl
    finally:
        ctl.close()


def all_reduce(nbytes: int, n: int, spans: list[int]) -> float:
    """One all-reduce over ``n`` chips spanning ``spans`` chips of the torus's dimensions:
    a bidirectional ring in each at once (2 links each), ``span - 1`` steps each."""
    bandwidth, steps = 2 * LINK * len(spans), sum(s - 1 for s in spans)
    return 2 * ((n - 1) / n * nbytes / bandwidth + steps * LATENCY)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(("n", "spans"), [(4, [4]), (8, [4, 2]), (16, [4, 4])])
def test_a_simulated_spmd_step_includes_its_gradient_all_reduce(instant_ctl, n, spans, packed):
    spmd = pw.train.SPMD([layer(), layer()], instant_ctl.slice(n),
                         loss=lambda o, y: jnp.mean((o - y) ** 2), optimizer=optax.sgd(0.1),
                         packed=packed, name=f"ar{n}{int(packed)}")
    state = spmd.init(0)
    batch = spmd.place((np.zeros((64, WIDTH), np.float32), np.zeros((64, WIDTH), np.float32)))
    instant_ctl.wait()
    k = instant_ctl.trace.next_index
    pw.train.wait(spmd.step(state, batch))
    instant_ctl.wait()
    [e] = [e for e in instant_ctl.trace.events(since=k) if e.name == f"{spmd.name}.step"]
    # one all-reduce, combined as XLA combines them: both gradient leaves and the loss (f32)
    expected = all_reduce(2 * WIDTH * WIDTH * 4 + 4, n, spans)
    assert e.t_end - e.t_start == pytest.approx(expected, rel=1e-9)
    # by hand: 2 x 4 MiB of gradients and a 4-byte loss over 4, 8 and 16 chips (one
    # all-reduce per leaf, as before XLA's combining was modelled: 157.8 / 105.6 / 123.4 us)
    assert round(expected * 1e6, 1) == {4: 145.8, 8: 89.6, 16: 99.4}[n]


def step_time(ctl, trainer, batch_rows: int, width: int) -> float:
    state = trainer.init(0)
    batch = (np.zeros((batch_rows, width), np.float32), np.zeros((batch_rows, width), np.float32))
    ctl.wait()
    k = ctl.trace.next_index
    pw.train.wait(trainer.step(state, batch))
    ctl.wait()
    [e] = [e for e in ctl.trace.events(since=k) if e.name == f"{trainer.name}.step"]
    return e.t_end - e.t_start


def many_leaves(leaves: int, width: int):
    return pw.train.Stage(
        init=lambda key: {f"w{i}": jnp.zeros((width, width), jnp.float32)
                          for i in range(leaves)},
        apply=lambda p, x: sum(jnp.tanh(x @ w) for w in p.values()))


def test_many_gradient_leaves_are_one_combined_all_reduce(instant_ctl):
    """48 leaves of 64 KiB: one all-reduce of 3 MiB and the loss, one latency term in all."""
    spmd = pw.train.SPMD([many_leaves(48, 128)], instant_ctl.slice(4),
                         loss=lambda o, y: jnp.mean((o - y) ** 2), optimizer=optax.sgd(0.1),
                         name="leaves48")
    expected = all_reduce(48 * 128 * 128 * 4 + 4, 4, [4])
    assert step_time(instant_ctl, spmd, 16, 128) == pytest.approx(expected, rel=1e-9)
    # by hand: 3 MiB + 4 bytes over a ring of 4, one 6 us latency term (one all-reduce per
    # leaf, before: 346.4 us)
    assert round(expected * 1e6, 1) == 58.4


def test_gradients_beyond_the_combine_threshold_are_split(instant_ctl):
    """Two 16 MiB leaves exceed XLA's 30 MiB threshold: two all-reduces, the loss (f32) in
    the second."""
    spmd = pw.train.SPMD([many_leaves(2, 2048)], instant_ctl.slice(4),
                         loss=lambda o, y: jnp.mean((o - y) ** 2), optimizer=optax.sgd(0.1),
                         name="leaves2")
    leaf = 2048 * 2048 * 4
    expected = all_reduce(leaf, 4, [4]) + all_reduce(leaf + 4, 4, [4])
    assert step_time(instant_ctl, spmd, 16, 2048) == pytest.approx(expected, rel=1e-9)
    assert round(expected * 1e6, 1) == 571.2


"""``pw.train.SPMD`` on simulated slices pays for its gradient all-reduce.

On a real slice XLA's SPMD partitioner inserts the all-reduce of a data-parallel step's
gradients; the simulator sees only collectives written with ``shard_map``, so a simulated
SPMD step writes its gradient sum out. The expected times are worked out by hand from the
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
    grads = 2 * all_reduce(WIDTH * WIDTH * 4, n, spans)   # one per gradient leaf (f32)
    loss = all_reduce(4, n, spans)                         # the mean loss, one f32
    assert e.t_end - e.t_start == pytest.approx(grads + loss, rel=1e-9)
    # by hand: 2 x 4 MiB of gradients over 4, 8 and 16 chips
    assert round((grads + loss) * 1e6, 1) == {4: 157.8, 8: 105.6, 16: 123.4}[n]


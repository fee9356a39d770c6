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

import jax
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



def mse(o, y):
    return jnp.mean((o - y) ** 2)


def durations(ctl, since: int) -> dict[str, float]:
    return {e.name: e.t_end - e.t_start for e in ctl.trace.events(since=since)}


def pipeline_step_and_eval(ctl, chips: int, rows: int) -> dict[str, float]:
    """The durations of one step and one eval of a 2-stage pipeline, ``chips`` per stage."""
    pipe = pw.train.Pipeline([layer(), layer()], [ctl.slice(chips), ctl.slice(chips)],
                             loss=mse, optimizer=optax.sgd(0.1), microbatches=2,
                             name=f"pipe{chips}")
    state = pipe.init(0)
    batch = (np.zeros((rows, WIDTH), np.float32), np.zeros((rows, WIDTH), np.float32))
    ctl.wait()
    k = ctl.trace.next_index
    state, _ = pipe.step(state, batch)
    pw.train.wait(pipe.evaluate(state, batch))
    ctl.wait()
    return durations(ctl, k)


def test_one_chip_per_stage_has_no_all_reduce(instant_ctl):
    took = pipeline_step_and_eval(instant_ctl, chips=1, rows=4)
    assert took["s0.bwd[m0]"] == took["s1.bwd[m1]"] == took["s1.fwd[m0]"] == 0.0
    assert took["s1.eval"] == 0.0


@pytest.mark.parametrize(("n", "spans"), [(4, [4]), (8, [4, 2])])
def test_a_simulated_pipeline_stage_sums_its_gradients_over_its_chips(instant_ctl, n, spans):
    """Each backward of a stage on n chips all-reduces that microbatch's 4 MiB of gradients
    (XLA's partitioner's sum over the sharded batch); the last stage's forwards all-reduce
    their loss; the eval step its loss. One chip per stage has none of them."""
    took = pipeline_step_and_eval(instant_ctl, chips=n, rows=16)
    grads, loss = all_reduce(WIDTH * WIDTH * 4, n, spans), all_reduce(4, n, spans)
    for m in range(2):
        assert took[f"s0.bwd[m{m}]"] == pytest.approx(grads, rel=1e-9)
        assert took[f"s1.bwd[m{m}]"] == pytest.approx(grads, rel=1e-9)
        assert took[f"s1.fwd[m{m}]"] == pytest.approx(loss, rel=1e-9)
        assert took[f"s0.fwd[m{m}]"] == 0.0
    assert took["s1.eval"] == pytest.approx(loss, rel=1e-9)
    # by hand: 4 MiB over 4 chips, 2 x (3/4 x 4 MiB / 90 GB/s + 3 us) = 75.9 us
    assert round(grads * 1e6, 1) == {4: 75.9, 8: 48.8}[n]


def test_a_simulated_pipeline_eval_step_all_reduces_its_loss(instant_ctl):
    pipe = pw.train.Pipeline([layer(), layer()], [instant_ctl.slice(4), instant_ctl.slice(8)],
                             loss=mse, optimizer=optax.sgd(0.1), name="pipe-eval")
    state = pipe.init(0)
    instant_ctl.wait()
    k = instant_ctl.trace.next_index
    pw.train.wait(pipe.evaluate(state, (np.zeros((16, WIDTH), np.float32),
                                        np.zeros((16, WIDTH), np.float32))))
    instant_ctl.wait()
    took = durations(instant_ctl, k)
    assert took["s0.eval"] == 0.0   # activations stay sharded: no all-reduce
    assert took["s1.eval"] == pytest.approx(all_reduce(4, 8, [4, 2]), rel=1e-9)


@pytest.mark.parametrize("packed", [False, True])
def test_a_simulated_spmd_eval_step_all_reduces_its_loss(instant_ctl, packed):
    spmd = pw.train.SPMD([layer(), layer()], instant_ctl.slice(8), loss=mse,
                         optimizer=optax.sgd(0.1), packed=packed, name=f"ev{int(packed)}")
    state = spmd.init(0)
    batch = (np.zeros((16, WIDTH), np.float32), np.zeros((16, WIDTH), np.float32))
    instant_ctl.wait()
    k = instant_ctl.trace.next_index
    pw.train.wait(spmd.evaluate(state, batch))
    instant_ctl.wait()
    expected = all_reduce(4, 8, [4, 2])
    assert durations(instant_ctl, k)[f"{spmd.name}.eval"] == pytest.approx(expected, rel=1e-9)
    assert round(expected * 1e6, 2) == 8.0   # by hand: 4 bytes, 3 + 1 ring steps of 1 us, x2


def test_the_sharded_stage_functions_compute_the_plain_ones(ctl):
    """On real devices (4 of them), what a simulated multi-chip stage runs gives the values of
    the plain forward and backward: the loss, the gradients (summed over the chips, added to
    the running sum) and the cotangent of the stage's input."""
    from pwkernel.train import sharded, stage
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"w": jax.random.normal(keys[0], (8, 8)), "b": jax.random.normal(keys[1], (8,))}
    x, y = jax.random.normal(keys[2], (12, 8)), jax.random.normal(keys[3], (12, 8))
    acc = jax.tree.map(jnp.ones_like, params)

    def apply(p, h):
        return jnp.tanh(h @ p["w"] + p["b"]) * p["b"]

    def both(fwd, bwd, head):
        out, res, tok = fwd(params, x, y if head else None, jnp.int32(0))
        dout = None if head else jnp.ones_like(out)
        g, dx, _ = bwd(params, x, y if head else None, res, dout, acc, tok, jnp.bool_(False))
        return out, g, dx
    for head in (mse, None):
        plain = jax.jit(lambda h=head: both(stage.forward(apply, h, True),
                                            stage.backward(apply, h, True, 0.5), h))()
        with jax.set_mesh(mesh):
            chips = jax.jit(lambda h=head: both(
                sharded.forward(apply, h, True, ("a", "b"), 4),
                sharded.backward(apply, h, True, 0.5, ("a", "b"), 4), h))()
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(chips), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

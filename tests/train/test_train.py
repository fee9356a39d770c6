"""pw.train: pipelined and SPMD training on pw.function / @pw.program, against plain JAX.

Every comparison is with a training loop written here in plain JAX and optax (``jax.jit``,
the whole batch at once), from the same initial parameters. Orders and memory are read back
from the trace; nothing waits on time, only on futures.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pwkernel as pw
from pwkernel.train import schedule as sched
from pwkernel.train import transformer as T
from pwkernel.train.measure import steps
from tests.helpers.budget import assert_all_memory_returned, reserved
from tests.helpers.programs import gate

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
BATCH = 8
M = 4
STEPS = 5
RTOL = 1e-4  # float32: microbatch sums and XLA's fusion change the rounding, not the math
LR = 1e-2


def optimizer():
    # SGD with momentum, not Adam: Adam's steps do not change when every gradient is scaled
    # by the same factor, so it would hide a gradient off by a factor (1/M missing).
    return optax.sgd(0.3, momentum=0.9)


def batches(n: int = STEPS):
    return [T.batch(CFG, BATCH, seed=i) for i in range(n)]


def plain_jax_losses(stages, params, data, opt=None, loss=T.cross_entropy):
    """The reference: full-batch training in plain JAX + optax, one optimizer over all
    stages' parameters."""
    full = pw.train.model_loss(stages, loss)
    opt = optimizer() if opt is None else opt

    @jax.jit
    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(full)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, out = opt.init(params), []
    for x, y in data:
        params, opt_state, value = step(params, opt_state, x, y)
        out.append(float(value))
    return out, params


@pytest.fixture(scope="module")
def stages():
    return T.split(CFG, 2)


@pytest.fixture(scope="module")
def pipe(tctl, stages):
    """Two stages, one device each, on two islands (activations cross the DCN)."""
    return pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=T.cross_entropy, optimizer=optimizer(), microbatches=M)


@pytest.fixture(scope="module")
def reference(pipe, stages):
    params = jax.device_get(pw.train.fetch(pipe.init(0).params))
    return plain_jax_losses(stages, params, batches())


def run_steps(trainer, data, **kw):
    state, out = trainer.init(0), []
    for batch in data:
        state, loss = trainer.step(state, batch, **kw)
        out.append(float(loss))
    return out, pw.train.wait(state)  # nothing of these steps left running for the next test


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_training_equals_plain_jax_step_by_step(pipe, reference, schedule):
    losses, state = run_steps(pipe, batches(), schedule=schedule)
    want, want_params = reference
    np.testing.assert_allclose(losses, want, rtol=RTOL)
    assert losses[-1] < losses[0]  # it trains
    got = jax.device_get(pw.train.fetch(state.params))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5),
                 got, want_params)


def test_spmd_training_equals_plain_jax_step_by_step(tctl, stages, reference):
    spmd = pw.train.SPMD(stages, tctl.slice(4, island=0), loss=T.cross_entropy,
                         optimizer=optimizer())
    losses, _ = run_steps(spmd, batches())
    np.testing.assert_allclose(losses, reference[0], rtol=RTOL)
    tctl.wait()
    k = tctl.trace.next_index
    old = pw.train.wait(spmd.init(0))
    state, loss = spmd.step(old, batches(1)[0])
    pw.train.wait((state, loss))
    [event] = [e for e in tctl.trace.events(since=k) if e.name == "spmd.step"]
    assert len(event.devices) == 4  # one computation on the whole slice
    assert all(leaf.result().is_deleted() for leaf in jax.tree_util.tree_leaves(old))  # donated


def spmd_under(budget, stages, packed: bool):
    """Losses of SPMD steps submitted back to back (each donating the state the one before
    is still computing) on a controller with ``budget``, the per-device bytes of the state
    after ``init``, and of what is left after the steps."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a second controller over the test's devices)
        ctl = pw.Controller(islands=(4, 4), memory_budget=budget)
    with ctl:
        spmd = pw.train.SPMD(stages, ctl.slice(2, island=0), loss=T.cross_entropy,
                             optimizer=optimizer(), packed=packed)
        state = pw.train.wait(spmd.init(0))
        assert ctl.wait(60)
        size = max(ctl.memory().values())
        losses = []
        for batch in batches():
            state, loss = spmd.step(state, batch)
            losses.append(loss)
        losses = [float(loss) for loss in losses]
        assert ctl.wait(60)
        gc.collect()
        after = max(ctl.memory().values())
        if budget is not None:  # what the budget counts is what is held
            assert max(reserved(ctl).values()) == after
        del state, loss
        assert_all_memory_returned(ctl)
        return losses, size, after


@pytest.mark.parametrize("packed", [False, True])
def test_spmd_steps_under_a_budget_of_one_state_and_a_half_train_as_without(stages, packed):
    """Each step donates its state, and XLA reuses its buffers for the new state: under a
    memory budget with room for one state and a half per device (not two) the steps train
    to the same losses as without a budget, and one state (and the last loss) is held after
    them, as between steps."""
    free, size, held = spmd_under(None, stages, packed)
    tight, _, held_tight = spmd_under(size * 3 // 2, stages, packed)
    np.testing.assert_array_equal(tight, free)
    assert held == held_tight == size + 4  # the state, and the last loss (a float32)


def test_data_parallel_stages_equal_plain_jax(tctl, stages):
    """Each stage on two devices (microbatches sharded over them), the stages on two islands,
    on default (explicit-axis) slices."""
    slices = [tctl.slice(2, island=0), tctl.slice(2, island=1)]
    dp = pw.train.Pipeline(stages, slices, loss=T.cross_entropy, optimizer=optimizer(),
                           microbatches=2, name="dp")
    params = jax.device_get(pw.train.fetch(dp.init(0).params))
    want, _ = plain_jax_losses(stages, params, batches(3))
    tctl.wait()
    k = tctl.trace.next_index
    losses, _ = run_steps(dp, batches(3))
    np.testing.assert_allclose(losses, want, rtol=RTOL)
    fwd = [e for e in tctl.trace.events(since=k) if e.name.startswith("s1.fwd")]
    assert fwd and all(e.devices == slices[1].device_ids for e in fwd)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_runs_its_schedule_order(tctl, pipe, schedule):
    """Read back from the trace: each stage's devices ran exactly the schedule's order (the
    tokens make it so; by readiness alone, 1F1B's stage 0 would run its forwards first)."""
    state = pw.train.wait(pipe.init(0))
    tctl.wait()  # the trace from k on holds this step's calls only
    k = tctl.trace.next_index
    pw.train.wait(pipe.step(state, batches(1)[0], schedule=schedule))
    tctl.wait()
    events = tctl.trace.events(since=k)
    seen = pw.train.stage_order_seen(events)
    assert seen == {s: sched.stage_order(schedule, s, 2, M) for s in range(2)}, [
        (e.name, e.devices, e.t_start, e.t_end) for e in events]


def test_1f1b_holds_fewer_residuals_than_gpipe(tctl, pipe):
    state = pw.train.wait(pipe.init(0))
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        tctl.wait()
        k = tctl.trace.next_index
        state, loss = pw.train.wait(pipe.step(state, batches(1)[0], schedule=schedule))
        tctl.wait()
        peaks[schedule] = pw.train.peak_residuals(tctl.trace.events(since=k),
                                                  pipe.residual_bytes)
    r0, r1 = pipe.residual_bytes
    assert r0 > 0 and r1 > 0
    assert peaks["gpipe"] == [M * r0, M * r1]  # every microbatch's, until the backwards
    assert peaks["1f1b"] == [2 * r0, 1 * r1]   # stage s holds S - s microbatches' at most


def test_residual_bytes_follow_the_batch_shape(tctl, pipe):
    """A step on a bigger batch has bigger microbatches: the figure is for the last step's."""
    state, _ = pw.train.wait(pipe.step(pipe.init(0), batches(1)[0]))
    small = list(pipe.residual_bytes)
    state, _ = pw.train.wait(pipe.step(state, T.batch(CFG, 2 * BATCH, seed=9)))
    big = list(pipe.residual_bytes)
    assert all(b > s for b, s in zip(big, small, strict=True)), (small, big)
    pw.train.wait(pipe.step(state, batches(1)[0]))
    assert pipe.residual_bytes == small


def test_trace_names_tell_forward_backward_and_update_apart(tctl, pipe):
    tctl.wait()
    k = tctl.trace.next_index
    pw.train.wait(pipe.step(pipe.init(0), batches(1)[0]))
    tctl.wait()
    [run] = steps(tctl.trace.events(since=k), program="pipeline.1f1b")
    names = {e.name for e in run}
    assert {f"s{s}.{kind}[m{m}]" for s in range(2) for kind in ("fwd", "bwd")
            for m in range(M)} | {"s0.update", "s1.update", "loss"} == names
    assert 0.0 < pw.train.bubble(run) < 1.0


def test_bubble_is_the_idle_share_of_device_time():
    from pwkernel.runtime.trace import Event

    def ev(i, name, device, t0, t1):
        return Event(i, "compute", name, "p", 1, "c", 0, (device,), 0.0, t0, t1)

    # two devices over [0, 4]: device 0 busy [0,1] and [1,3] (3 s), device 1 busy [1,2] (1 s)
    events = [ev(0, "a", 0, 0, 1), ev(1, "b", 0, 1, 3), ev(2, "c", 1, 1, 2),
              ev(3, "d", 1, 3.5, 4), Event(4, "transfer", "t", "p", 1, "c", 0, (1,), 0, 0, 4)]
    assert pw.train.bubble(events) == pytest.approx(1 - (3 + 1.5) / 8)
    with pytest.raises(ValueError, match="at least one computation"):
        pw.train.bubble([])


def test_peak_residuals_breaks_ties_in_the_order_the_devices_ran():
    """Calls on one device set are reported (and so indexed) in the order they ran there, and
    a call whose end was seen late makes the calls behind it start and end at that instant
    (spans are clamped after the previous end there). At equal times, an end comes before a
    start only if its call ran first."""
    from pwkernel.runtime.trace import Event

    def run(*calls):  # (name, t_start, t_end) in the order one device ran them
        return [Event(i, "compute", n, "p", 1, "c", 1, (4,), 0.0, a, b)
                for i, (n, a, b) in enumerate(calls)]

    # GPipe's last stage (s1) as a loaded run traced it: the forward of m3 and the backward of
    # m0 both at 10.731 (zero-length, behind a late end), the forward first
    late = run(("s1.fwd[m0]", 5.652, 10.393), ("s1.fwd[m1]", 10.393, 10.507),
               ("s1.fwd[m2]", 10.507, 10.577), ("s1.fwd[m3]", 10.731, 10.731),
               ("s1.bwd[m0]", 10.731, 10.731), ("s1.bwd[m1]", 11.406, 11.916),
               ("s1.bwd[m2]", 13.521, 13.956), ("s1.bwd[m3]", 16.081, 16.537))
    assert pw.train.peak_residuals(late, [5, 7]) == [0, 4 * 7]
    # 1F1B's last stage: each backward ends as the next forward starts, the backward first
    assert pw.train.peak_residuals(run(("s1.fwd[m0]", 0, 1), ("s1.bwd[m0]", 1, 2),
                                       ("s1.fwd[m1]", 2, 3), ("s1.bwd[m1]", 3, 4)),
                                   [5, 7]) == [0, 7]


def test_peak_residuals_before_the_first_step_says_when_the_bytes_are_known():
    """A Pipeline's residual_bytes is None until its first step: peak_residuals given it says
    so and what to pass (it failed with "object of type 'NoneType' has no len()")."""
    from pwkernel.runtime.trace import Event

    events = [Event(0, "compute", "s0.fwd[m0]", "p", 1, "c", 1, (0,), 0.0, 0.0, 1.0)]
    with pytest.raises(TypeError, match=r"residual_bytes.*None.*after the pipeline's first step"):
        pw.train.peak_residuals(events, None)
    assert pw.train.peak_residuals(events, [3]) == [3]


def test_memory_stays_flat_and_the_state_is_donated(tctl, pipe):
    state = pw.train.wait(pipe.init(0))
    data, held = batches(2), []
    for i in range(20):
        old = state
        state, loss = pipe.step(old, data[i % 2])
        pw.train.wait((state, loss))
        tctl.wait()
        if i == 0:  # donated: the previous state's buffers now belong to the new state
            assert all(leaf.result().is_deleted() for leaf in jax.tree_util.tree_leaves(old))
        del old
        held.append(sum(tctl.memory().values()))
    assert len(set(held)) == 1, held
    kept = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves((state, loss)))
    assert held[0] == kept  # parameters, momenta and the loss: nothing else is left behind


def mlp_stages():
    def layer(n_in, n_out):
        return pw.train.Stage(
            init=lambda key: {"w": jax.random.normal(key, (n_in, n_out)) / np.sqrt(n_in)},
            apply=lambda p, x: jnp.tanh(x @ p["w"]))
    return [layer(4, 8), layer(8, 1)]


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def test_steps_issued_back_to_back_donate_safely(tctl):
    """Steps long enough to be still running when the next is submitted: each donates the
    state the one before is still computing (the runtime launches it behind its producer)."""
    def layer(n):
        return pw.train.Stage(init=lambda key: {"w": jax.random.normal(key, (n, n)) / n},
                              apply=lambda p, x: jnp.tanh(x @ p["w"]))
    spmd = pw.train.SPMD([layer(384), layer(384)], tctl.slice(1, island=1), loss=mse,
                         optimizer=optax.sgd(0.1), name="chain")
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((384, 384), np.float32),
             rng.standard_normal((384, 384), np.float32))
    state, losses = spmd.init(0), []
    for _ in range(6):
        state, loss = spmd.step(state, batch)
        losses.append(loss)
    assert all(np.isfinite(float(loss)) for loss in losses)


def test_a_failed_step_fails_its_futures_and_the_next_step_runs(tctl):
    stages = mlp_stages()
    pipe = pw.train.Pipeline(stages, [tctl.slice(1, island=0), tctl.slice(1, island=1)],
                             loss=mse, optimizer=optax.adam(LR), microbatches=2,
                             check_finite=True, name="nan")
    rng = np.random.default_rng(0)
    good = [(rng.standard_normal((4, 4), np.float32), rng.standard_normal((4, 1), np.float32))
            for _ in range(2)]
    bad = (good[0][0].copy(), good[0][1])
    bad[0][3, 0] = np.nan  # one example of the second microbatch
    state0 = pw.train.wait(pipe.init(0))
    params0 = jax.device_get(pw.train.fetch(state0.params))
    state1, loss1 = pipe.step(state0, good[0])
    pw.train.wait((state1, loss1))
    failed, loss_bad = pipe.step(state1, bad)
    with pytest.raises(FloatingPointError, match="not finite"):
        loss_bad.result(timeout=60)
    assert all(isinstance(f.exception(timeout=60), FloatingPointError)
               for f in jax.tree_util.tree_leaves(failed))
    with pytest.raises(ValueError, match="comes from a step that failed"):
        pipe.step(failed, good[1])
    state2, loss2 = pipe.step(state1, good[1])  # nothing of state1 was consumed
    want, _ = plain_jax_losses(stages, params0, good, optax.adam(LR), loss=mse)
    np.testing.assert_allclose([float(loss1), float(loss2)], want, rtol=RTOL)


@pytest.mark.parametrize("packed", [False, True])
def test_a_checked_spmd_step_that_fails_leaves_the_state_it_was_given(tctl, packed):
    """SPMD(check_finite=True): a NaN loss fails the step before its update consumes the
    state (the check and the update are two computations), so the same state steps again."""
    stages = mlp_stages()
    spmd = pw.train.SPMD(stages, tctl.slice(2, island=0), loss=mse, optimizer=optax.adam(LR),
                         check_finite=True, packed=packed, name=f"nanspmd{int(packed)}")
    rng = np.random.default_rng(1)
    good = [(rng.standard_normal((4, 4), np.float32), rng.standard_normal((4, 1), np.float32))
            for _ in range(2)]
    bad = (good[0][0].copy(), good[0][1])
    bad[0][1, 2] = np.nan
    state0 = pw.train.wait(spmd.init(0))
    params0 = jax.device_get(pw.train.fetch(state0).params)
    state1, loss1 = spmd.step(state0, good[0])
    _, loss_bad = spmd.step(pw.train.wait(state1), bad)
    with pytest.raises(FloatingPointError, match="not finite"):
        loss_bad.result(timeout=60)
    pw.train.wait(state1)  # not consumed
    state2, loss2 = spmd.step(state1, good[1])
    want, _ = plain_jax_losses(stages, params0, good, optax.adam(LR), loss=mse)
    np.testing.assert_allclose([float(loss1), float(loss2)], want, rtol=RTOL)


def test_the_backward_does_not_compute_the_forward_again(stages):
    """The backward re-traces the vjp for its structure only: XLA drops that forward."""
    st = stages[1]
    p = st.init(jax.random.PRNGKey(0))
    h = jnp.ones((2, CFG.seq, CFG.width))
    y = jnp.zeros((2, CFG.seq), jnp.int32)
    fwd = pw.train.forward(st.apply, T.cross_entropy, wrt_input=True)
    bwd = pw.train.backward(st.apply, T.cross_entropy, wrt_input=True)
    _, res, _ = fwd(p, h, y, jnp.int32(0))

    def flops(f, *args):
        return jax.jit(f).lower(*args).compile().cost_analysis()["flops"]

    def from_scratch(p, h, y):
        return jax.grad(lambda p, h: T.cross_entropy(st.apply(p, h), y), argnums=(0, 1))(p, h)

    f_fwd, f_bwd = flops(fwd, p, h, y, jnp.int32(0)), flops(
        bwd, p, h, y, res, None, None, jnp.int32(0))
    f_both = flops(from_scratch, p, h, y)
    assert f_bwd < f_both - 0.8 * f_fwd, (f_fwd, f_bwd, f_both)
    grads, dh, _ = bwd(p, h, y, res, None, None, jnp.int32(0))
    want = from_scratch(p, h, y)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 (grads, dh), want)


def test_schedules_as_data():
    g = sched.stage_order("gpipe", 0, 3, 4)
    assert [c.kind.value for c in g] == ["fwd"] * 4 + ["bwd"] * 4
    one = [sched.stage_order("1f1b", s, 3, 4) for s in range(3)]
    assert [sched.in_flight(c) for c in one] == [3, 2, 1]
    assert [c.name for c in one[2]] == ["s2.fwd[m0]", "s2.bwd[m0]", "s2.fwd[m1]",
                                        "s2.bwd[m1]", "s2.fwd[m2]", "s2.bwd[m2]",
                                        "s2.fwd[m3]", "s2.bwd[m3]"]
    for schedule in ("gpipe", "1f1b"):
        calls = sched.order(schedule, 3, 4)
        assert sorted(calls) == sorted(c for s in range(3)
                                       for c in sched.stage_order(schedule, s, 3, 4))
        for s in range(3):  # the merged order keeps each stage's order
            assert [c for c in calls if c.stage == s] == sched.stage_order(schedule, s, 3, 4)
    assert sched.parse_name("s1.bwd[m2]") == sched.Call(1, sched.Kind.BWD, 2)
    assert sched.parse_name("ici:0->0") is None
    with pytest.raises(ValueError, match="schedule must be one of"):
        sched.Schedule.parse("pipedream")
    for typo, meant in (("gpip", "gpipe"), ("GPipe", "gpipe"), ("1fb1", "1f1b")):  # (all "1f1b")
        with pytest.raises(ValueError, match=f"Maybe you want schedule='{meant}'"):
            sched.Schedule.parse(typo)


def test_pw_train_loads_on_first_use_in_a_fresh_process():
    code = "import pwkernel as pw; print(pw.train.Pipeline.__name__, pw.train.Schedule('1f1b'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["Pipeline", "1f1b"], proc.stderr


def test_bad_input_gets_errors_that_name_the_fix(tctl, stages):
    s = [tctl.slice(1, island=0)]
    with pytest.raises(ValueError, match="one slice per stage"):
        pw.train.Pipeline(stages, s, loss=T.cross_entropy, optimizer=optax.sgd(0.1))
    with pytest.raises(TypeError, match="pw.train.Stage"):
        pw.train.SPMD([lambda p, x: x], s[0], loss=T.cross_entropy, optimizer=optax.sgd(0.1))
    pipe = pw.train.Pipeline(stages, s * 2, loss=T.cross_entropy, optimizer=optax.sgd(0.1),
                             microbatches=3, name="bad")
    with pytest.raises(ValueError, match="divisible by microbatches=3"):
        pipe.step(pw.train.TrainState([], []), T.batch(CFG, 8))
    two = pw.train.Pipeline(stages, [tctl.slice(2, island=0), tctl.slice(2, island=1)],
                            loss=T.cross_entropy, optimizer=optax.sgd(0.1), microbatches=2,
                            name="bad2")  # a microbatch is sharded over a stage's 2 devices
    with pytest.raises(ValueError, match="2 x 2 devices per stage slice = 4.*a batch of 4 "):
        two.step(pw.train.TrainState([], []), T.batch(CFG, 6))
    with pytest.raises(ValueError, match="do not split into 3 equal stages"):
        T.split(CFG, 3)
    spmd = pw.train.SPMD(stages, tctl.slice(2, island=0), loss=T.cross_entropy,
                         optimizer=optax.sgd(0.1), name="dp")
    x, y = T.batch(CFG, 8)
    for batch, error, match in [
            (x, TypeError, r"a batch is \(inputs, targets\), got a ndarray.*dp.step"),
            ((x, y, y), TypeError, "got a tuple of 3"),
            ((x[:7], y[:7]), ValueError, "divisible by the slice's 2 devices"),
            ((x, y[:4]), ValueError, r"one leading \(batch\) axis.*\(8,\), \(4,\)\]\. "
                                     r"Maybe inputs and targets come from different batches")]:
        with pytest.raises(error, match=match):
            spmd.step(spmd.init(0), batch)
    per_example = pw.train.Pipeline(  # a loss per example: the gradient of what, jax.grad asks
        stages, s * 2, loss=lambda logits, y: T.cross_entropy(logits, y) * jnp.ones(2),
        optimizer=optax.sgd(0.1), microbatches=2, name="vector")
    with pytest.raises(TypeError, match=r"loss must be a scalar .* got shape \(2,\)"):
        per_example.step(per_example.init(0), T.batch(CFG, 8))


@pytest.fixture(scope="module")
def sim_ctl():
    """A simulated TPU v4 pod of 2 islands x 16 chips (backend="sim": a virtual clock)."""
    ctl = pw.Controller(backend="sim",
                        cluster=pw.sim.Cluster.preset("tpu-v4", chips=32, islands=2))
    try:
        yield ctl
    finally:
        ctl.close()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_steps_on_a_simulated_pod(sim_ctl, schedule):
    """The same Pipeline on simulated slices (4 stages of 4 chips over 2 islands): the step
    completes on the virtual clock, each stage runs its schedule's order and then its update,
    and the trace gives the bubble and the residuals alive (deterministic: virtual time)."""
    S, M2 = 4, 8
    cfg = T.Config(vocab=256, width=512, heads=8, layers=S, seq=128)
    pipe = pw.train.Pipeline(T.split(cfg, S), [sim_ctl.slice(4, island=i) for i in (0, 0, 1, 1)],
                             loss=T.cross_entropy, optimizer=optax.adam(LR), schedule=schedule,
                             microbatches=M2, check_finite=True, name=f"sim{schedule}")
    placed = pipe.place(T.batch(cfg, 4 * M2))     # futures on the simulated slices
    state = pipe.init(0)
    sim_ctl.wait()
    k, t0 = sim_ctl.trace.next_index, sim_ctl.executor.now()
    state, loss = pw.train.wait(pipe.step(state, placed))
    sim_ctl.wait()
    assert sim_ctl.executor.now() > t0 and loss.shape == () and loss.t_done > t0
    with pytest.raises(pw.NoValueError, match="simulated"):
        loss.result()                              # a simulation computes no values
    [run] = steps(sim_ctl.trace.events(since=k), program=f"sim{schedule}.{schedule}")
    assert pw.train.stage_order_seen(run) == {
        s: sched.stage_order(schedule, s, S, M2) for s in range(S)}
    for s in range(S):                             # each update after every call of the step
        update = [e for e in run if e.name == f"s{s}.update"]
        assert len(update) == 1
        assert update[0].t_start >= max(e.t_end for e in run if e.name.startswith("s")
                                        and not e.name.endswith("update"))
    assert 0.0 < pw.train.bubble(run) < 1.0
    live = pw.train.peak_residuals(run, [1] * S)   # microbatches' residuals alive per stage
    assert live == ([M2] * S if schedule == "gpipe" else [S - s for s in range(S)])
    assert pipe.step(state, placed)[1].wait(60)    # the next step takes the returned state


@pytest.mark.parametrize("packed", [False, True])
def test_spmd_steps_on_a_simulated_slice(sim_ctl, packed):
    spmd = pw.train.SPMD(T.split(CFG, 2), sim_ctl.slice(8, island=1), loss=T.cross_entropy,
                         optimizer=optax.adam(LR), check_finite=True, packed=packed,
                         name=f"simspmd{int(packed)}")
    state, loss = pw.train.wait(spmd.step(spmd.init(0), spmd.place(T.batch(CFG, 16))))
    assert loss.shape == () and [e.name for e in sim_ctl.trace.events()
                                 if e.program == spmd.name + ".step"] == [spmd.name + ".step"]


def test_a_state_whose_controller_closed_says_so(stages):
    """A step given a state whose futures the controller's close cancelled names the closed
    controller (not a failed step to go back from) and how to train on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a second controller over the test's devices)
        ctl = pw.Controller(islands=(2, 2), dispatch="sequential")
    entered, release = threading.Event(), threading.Event()
    s = ctl.slice(1)
    spmd = pw.train.SPMD(stages, s, loss=T.cross_entropy, optimizer=optax.sgd(0.1))
    pw.train.wait(spmd.step(spmd.init(0), T.batch(CFG, 8)))  # trained on it: compiled
    held = pw.function(gate(entered, release), slice=s)(np.ones(2, np.float32))
    pending = pw.function(lambda v: v + 1, slice=s)(held)
    assert entered.wait(60)
    pending.add_done_callback(lambda _: release.set())  # close cancels it; the gate opens
    ctl.close()
    with pytest.raises(pw.ControllerClosedError, match="closed controller.*device_get"):
        spmd.step(pw.train.TrainState([pending], [pending]), T.batch(CFG, 8))
    with pytest.raises(pw.ControllerClosedError, match="closed controller"):
        pw.train.wait(held)  # it ended before the close, and its value went with it

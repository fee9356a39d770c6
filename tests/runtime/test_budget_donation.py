"""The memory budget and donation: a launch that donates (consumes) buffers the budget counts
is credited with them, since XLA reuses them for its outputs, so a state donated from step to
step needs room for one state per device, not two. The credit is given back once, only for
what was really donated, and holds when a donating launch fails. Waits are bounded; nothing
sleeps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pwkernel as pw
from tests.helpers.budget import assert_all_memory_returned, reserved

N = 4096                # a state of N float32 on one device: 16 KiB
STATE = N * 4
BUDGET = STATE * 3 // 2  # room for one state and a half, not two
STEPS = 6


def functions(s):
    """A state made on ``s`` (no upload: an upload would be a second state's worth), and a
    step that donates it, as a training step donates its state."""
    make = pw.function(lambda: jnp.arange(N, dtype=jnp.float32), slice=s, name="make")
    bump = pw.function(lambda v: v * 0.5 + 1.0, slice=s, donate_argnums=0, name="bump")
    return make, bump


def expected(steps: int) -> np.ndarray:
    v = np.arange(N, dtype=np.float32)
    for _ in range(steps):
        v = v * np.float32(0.5) + np.float32(1.0)
    return v


def one_state_held(ctl, device: int) -> None:
    """After the steps: one state counted by the store and by the budget, nothing else."""
    assert ctl.wait(60)
    assert ctl.memory()[ctl.devices[device]] == STATE
    assert reserved(ctl)[device] == STATE


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donated_state_steps_under_a_budget_of_one_state_and_a_half(dispatch):
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET, dispatch=dispatch) as ctl:
        s = ctl.slice(1, island=0)
        make, bump = functions(s)
        state = make()
        for _ in range(STEPS):  # each step is submitted while the one before still runs
            state = bump(state)
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(STEPS))
        one_state_held(ctl, s.device_ids[0])
        del state
        assert_all_memory_returned(ctl)


def test_values_a_program_makes_and_donates_inside_itself_are_credited():
    """``make``'s output and the first ``bump``'s are values of the run no future shows:
    each ``bump`` consumes the one before, so the program needs one state at a time."""
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        make, bump = functions(s)
        out = pw.program(lambda: bump(bump(bump(make()))))()
        np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), expected(3))
        one_state_held(ctl, s.device_ids[0])
        state = bump(out)  # and a program's output donated into the next program
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(4))
        one_state_held(ctl, s.device_ids[0])
        del out, state
        assert_all_memory_returned(ctl)


def test_an_array_of_the_users_is_not_credited():
    """A ``jax.Array`` the user passes is no buffer the budget counts: donating it credits
    nothing, so a step that would fit only with that credit waits for the user's frees."""
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        make, bump = functions(s)
        held = make()  # a state the budget counts, kept by the user
        held.result(timeout=60)
        mine = jax.device_put(np.arange(N, dtype=np.float32), s.mesh.devices.flat[0])
        out = bump(mine)  # its output needs a state's room: 2 states > 1.5, it waits
        assert not out.wait(0.2)
        del held
        np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), expected(1))
        del out
        assert_all_memory_returned(ctl)


def test_a_donating_launch_refused_after_its_credit_leaves_the_state_counted():
    """A step that donates the state and also reads it is refused by the executor after the
    scheduler let it in on the state's credit: nothing was consumed, so the state stays
    valid and counted (its bytes are given back once, when it goes), and the next step runs
    under the same budget."""
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        make, bump = functions(s)
        both = pw.function(lambda v, w: v + w, slice=s, donate_argnums=0, name="both")
        state = make()
        bad = both(state, state)
        with pytest.raises(pw.ProgramError, match="donates input 0 and also reads"):
            bad.result(timeout=60)
        del bad
        one_state_held(ctl, s.device_ids[0])
        for _ in range(2):
            state = bump(state)
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(2))
        one_state_held(ctl, s.device_ids[0])
        del state
        assert_all_memory_returned(ctl)


def test_a_donating_step_that_fails_while_it_runs_gives_everything_back_once():
    """A step whose host callback raises has consumed the state it was given: its outputs
    fail, the state's bytes and the outputs' are given back once each (a value the user
    keeps beside it stays counted: a second give-back would show as too little reserved),
    and a fresh state then steps under the same budget."""
    def boom(v):
        raise ValueError("boom in the step")

    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        d = s.device_ids[0]
        make, bump = functions(s)
        small = pw.function(lambda: jnp.ones(N // 4, jnp.float32), slice=s, name="small")
        fails = pw.function(
            lambda v: jax.pure_callback(boom, jax.ShapeDtypeStruct(v.shape, v.dtype), v) + v,
            slice=s, donate_argnums=0, name="fails")
        kept = small()  # a quarter state, kept throughout
        state = make()
        broken = fails(state)
        with pytest.raises(ValueError, match="boom in the step"):
            broken.result(timeout=60)
        del broken, state  # (the state's buffer was consumed by the failed step)
        assert ctl.wait(60)
        assert reserved(ctl)[d] == ctl.memory()[ctl.devices[d]] == STATE // 4
        state = make()
        for _ in range(STEPS):
            state = bump(state)
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(STEPS))
        assert ctl.wait(60)
        assert reserved(ctl)[d] == ctl.memory()[ctl.devices[d]] == STATE + STATE // 4
        del state, kept
        assert_all_memory_returned(ctl)


def test_a_cancelled_donating_step_credits_nothing():
    """A donating step that grows the state waits, even with its credit, for a value only the
    user holds; cancelled then, it never launched: the state it would have consumed stays
    counted and usable, and steps once the user's value goes."""
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        d = s.device_ids[0]
        make, bump = functions(s)
        half = pw.function(lambda: jnp.ones(N // 2, jnp.float32), slice=s, name="half")
        grow = pw.function(lambda v: (v * 2.0, v[: N // 2]), slice=s, donate_argnums=0,
                           name="grow")
        state, hog = make(), half()  # one state and a half: the budget is full
        hog.result(timeout=60)
        waiting, _ = grow(state)  # 1.5 states out, 1 given back: it needs half a state more
        assert not waiting.wait(0.2)
        assert waiting.run.cancel() == 1
        with pytest.raises(pw.CancelledError):
            waiting.result(timeout=60)
        del waiting
        assert ctl.wait(60)
        assert reserved(ctl)[d] == ctl.memory()[ctl.devices[d]] == BUDGET
        del hog
        state = bump(state)
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(1))
        one_state_held(ctl, s.device_ids[0])
        del state
        assert_all_memory_returned(ctl)


def test_a_donation_xla_cannot_use_consumes_and_credits_nothing():
    """No output of ``shrink`` can take its donated input (``jax.jit`` warns so): JAX leaves
    the input valid, so it stays counted and usable, and nothing is given back for it."""
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET) as ctl:
        s = ctl.slice(1, island=0)
        d = s.device_ids[0]
        make, bump = functions(s)
        with pytest.warns(UserWarning, match="donated buffers were not usable"):
            shrink = pw.function(lambda v: v[: N // 2] * 2.0, slice=s, donate_argnums=0,
                                 name="shrink")
            state = make()
            small = shrink(state)
            small.result(timeout=60)
        assert ctl.wait(60)
        assert reserved(ctl)[d] == ctl.memory()[ctl.devices[d]] == STATE + STATE // 2
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(0))
        del small
        state = bump(state)  # still the caller's: it steps
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(1))
        one_state_held(ctl, d)
        del state
        assert_all_memory_returned(ctl)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_the_reserved_count_never_reads_above_the_budget(monkeypatch, dispatch):
    """Each step is let in on its credit (the state it donates) before its launch consumes
    the state: the schedulers' count (``memory_reserved``), read after every decision they
    take, stays within the budget all along, not only once the steps are done."""
    from pwkernel.runtime.scheduler import GangScheduler

    highest = [0]
    handle = GangScheduler.handle

    def watched(scheduler, *events):
        out = handle(scheduler, *events)  # (under its island's lock: the count is settled)
        highest[0] = max(highest[0], *scheduler.memory_in_use().values())
        return out

    monkeypatch.setattr(GangScheduler, "handle", watched)
    with pw.Controller(islands=(2, 2), memory_budget=BUDGET, dispatch=dispatch) as ctl:
        s = ctl.slice(1, island=0)
        make, bump = functions(s)
        state = make()
        for _ in range(STEPS):
            state = bump(state)
        np.testing.assert_array_equal(np.asarray(state.result(timeout=60)), expected(STEPS))
        one_state_held(ctl, s.device_ids[0])
        del state
        assert_all_memory_returned(ctl)
    assert 0 < highest[0] <= BUDGET

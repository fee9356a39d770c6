"""The Ray backend behaves as the local backend does where JAX's semantics show: the
controller's JAX settings (x64, NaN checks) hold on the islands, a computation's error keeps
its type, and donated inputs are consumed. Each check runs the same code on both backends.

One local Ray cluster and one controller for the module; the islands are real actor processes.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import ray

import pwkernel as pw
from tests.helpers.ray_session import cluster_processes, session_dir

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def rctl():
    ctl = pw.Controller(backend="ray", islands=(2, 2))
    try:
        yield ctl
    finally:
        ctl.close()


@pytest.fixture(scope="module")
def lctl():
    with pw.Controller(islands=(2, 2)) as ctl:
        yield ctl


@contextlib.contextmanager
def jax_config(**values):
    """Set JAX options process-wide (as a notebook cell does), restored afterwards."""
    old = {name: getattr(jax.config, name) for name in values}
    try:
        for name, value in values.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in old.items():
            jax.config.update(name, value)


@pytest.fixture(params=["local", "ray"])
def ctl(request, rctl, lctl):
    return lctl if request.param == "local" else rctl


def test_x64_set_in_the_notebook_holds_on_the_islands(ctl):
    with jax_config(jax_enable_x64=True):
        s0, s1 = ctl.slice(2, island=0), ctl.slice(2, island=1)
        f = pw.function(lambda x: x * 2 + 1e-12, slice=s0, name="f64")
        g = pw.function(lambda x: x.astype(jnp.int64) + 2**40, slice=s1, name="i64")

        @pw.program
        def prog(x):
            y = f(x)
            return y, g(y)  # (y travels to island 1: placed there as float64)

        y, z = prog(np.ones(2, np.float64))
        got_y, got_z = y.result(TIMEOUT), z.result(TIMEOUT)
        assert got_y.dtype == np.float64 and got_z.dtype == np.int64
        assert np.asarray(got_y).tolist() == [2.0 + 1e-12] * 2
        assert np.asarray(got_z).tolist() == [2 + 2**40] * 2


def test_debug_nans_set_in_the_notebook_holds_on_the_islands(ctl):
    s = ctl.slice(2, island=0)
    log = pw.function(lambda x: jnp.log(x), slice=s, name="log")
    with jax_config(jax_debug_nans=True):
        with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in log"):
            log(-np.ones(2, np.float32)).result(TIMEOUT)
    # off again: a NaN is a value
    assert np.isnan(np.asarray(log(-np.ones(2, np.float32)).result(TIMEOUT))).all()


def test_an_error_while_running_keeps_its_type(ctl):
    """XLA's out-of-memory while the computation runs (a temporary buffer larger than any
    address space) is a ``jax.errors.JaxRuntimeError`` on both backends."""
    s = ctl.slice(1, island=1)
    too_big = pw.function(lambda x: jnp.cumsum(jnp.full((2**45,), x[0]))[-1:] + x, slice=s,
                          name="too_big")
    fut = too_big(np.ones(1, np.float32))
    assert fut.wait(TIMEOUT)
    assert type(fut.exception()) is jax.errors.JaxRuntimeError
    with pytest.raises(jax.errors.JaxRuntimeError, match="^RESOURCE_EXHAUSTED: Out of memory"):
        fut.result()
    ok = pw.function(lambda x: x + 1, slice=s)
    assert ok(np.ones(2, np.float32)).result(TIMEOUT).tolist() == [2.0, 2.0]


def test_donated_inputs_are_consumed(ctl):
    s = ctl.slice(2, island=0)
    make = pw.function(lambda x: x * 1, slice=s, name="make")
    step = pw.function(lambda x: x + 1, slice=s, name="step", donate_argnums=0)
    add = pw.function(lambda x, y: x + y, slice=s, name="add", donate_argnums=0)
    x = make(np.ones(4, np.float32))
    y = step(x)
    assert np.asarray(y.result(TIMEOUT)).tolist() == [2.0] * 4
    assert step(y).result(TIMEOUT).tolist() == [3.0] * 4  # donating a result works again
    # x was consumed: a computation given it again fails with what to do, nothing runs
    again = step(x)
    with pytest.raises(RuntimeError, match="Array has been deleted with shape=float32.4.: "
                       "input 0 of step was given to an earlier call that donates it") as info:
        again.result(TIMEOUT)
    assert isinstance(info.value, pw.ProgramError) and "jnp.copy(x)" in str(info.value)
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        np.asarray(x.result(TIMEOUT))  # (locally: the deleted array; on Ray: refused)
    # one call both donating and reading the same array is refused, and donates nothing
    w = make(np.ones(4, np.float32))
    with pytest.raises(RuntimeError, match="add donates input 0 and also reads the same"):
        add(w, w).result(TIMEOUT)
    assert np.asarray(w.result(TIMEOUT)).tolist() == [1.0] * 4


def _jit_keeps_after_nan(compile_under_flag: bool) -> bool:
    """Whether plain ``jax.jit(..., donate_argnums=0)``, first called with the flag
    ``compile_under_flag``, keeps its argument when a later call under ``jax_debug_nans``
    turns NaN (JAX decides donation when it compiles; the call's flag does not change it)."""
    f = jax.jit(lambda x, y: x + y, donate_argnums=0)
    with jax_config(jax_debug_nans=compile_under_flag):
        jax.block_until_ready(f(jnp.ones(4), np.ones(4, np.float32)))
    x = jnp.ones(4)
    with jax_config(jax_debug_nans=True), contextlib.suppress(FloatingPointError, RuntimeError):
        f(x, np.full(4, np.nan, np.float32))
    return not x.is_deleted()


@pytest.mark.parametrize("compile_under_flag", [False, True])
def test_a_nan_under_debug_nans_consumes_a_donated_input_as_jax_jit_does(ctl,
                                                                        compile_under_flag):
    """Under ``jax_debug_nans`` a donating call whose output turns NaN fails with
    ``FloatingPointError``; it keeps its donated input if it was compiled under the flag (JAX
    does not donate then) and consumes it if it was compiled before, as ``jax.jit`` does, on
    Ray islands as locally (before, Ray's controller took every donated input as consumed)."""
    want_kept = _jit_keeps_after_nan(compile_under_flag)
    s = ctl.slice(2, island=0)
    make = pw.function(lambda x: x * 1, slice=s, name="make")
    add = pw.function(lambda x, y: x + y, slice=s, name="nanstep", donate_argnums=0)
    with jax_config(jax_debug_nans=compile_under_flag):
        assert add(make(np.ones(4, np.float32)), np.ones(4, np.float32)).result(
            TIMEOUT).tolist() == [2.0] * 4
    x = make(np.ones(4, np.float32))
    with jax_config(jax_debug_nans=True):
        with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in "
                           "nanstep"):
            add(x, np.full(4, np.nan, np.float32)).result(TIMEOUT)
        again = add(x, np.ones(4, np.float32))
        if want_kept:
            assert again.result(TIMEOUT).tolist() == [2.0] * 4
        else:
            with pytest.raises(RuntimeError, match="given to an earlier call that donates"):
                again.result(TIMEOUT)


def test_a_host_value_under_in_shardings_is_placed_as_jax_jit_places_it(ctl):
    """Placed as in_shardings say, typed by itself (replicated): ``-v`` keeps the placement."""
    s = ctl.slice(2, island=0)
    x = np.arange(8.0, dtype=np.float32)
    y = pw.function(lambda v: -v, slice=s, in_shardings=jax.sharding.PartitionSpec("x"))(x)
    assert str(jax.typeof(y.result(TIMEOUT))) == "float32[8@x]"
    assert np.asarray(y.result(TIMEOUT)).tolist() == (-x).tolist()


def test_ray_islands_really_donate(rctl):
    """On the island the donated buffer is gone (the island's XLA consumed it)."""
    s = rctl.slice(2, island=0)
    make = pw.function(lambda x: x * 1, slice=s, name="make")
    step = pw.function(lambda x: x + 1, slice=s, name="step", donate_argnums=0)
    x = make(np.ones(4, np.float32))
    assert x.wait(TIMEOUT)
    handle = x._buffer.value
    step(x).result(TIMEOUT)
    with pytest.raises(ray.exceptions.RayTaskError, match="deleted"):
        ray.get(rctl.islands[0].actor.fetch.remote(handle.bid))


def test_sub_byte_integers_run_on_ray_islands(rctl):
    """int4/uint4 values (held unpacked by JAX once placed) are uploaded, computed on, sent
    between islands and fetched. (The local backend refuses them yet: docs/ray.md.)"""
    f = pw.function(lambda x: x + 1, slice=rctl.slice(2, island=0), name="inc")
    g = pw.function(lambda x: x * 2, slice=rctl.slice(2, island=1), name="dbl")

    @pw.program
    def prog(x):
        y = f(x)
        return y, g(y)

    for dtype in (jnp.int4, jnp.uint4):
        y, z = prog(np.arange(3).astype(dtype))
        got_y, got_z = y.result(TIMEOUT), z.result(TIMEOUT)
        assert got_y.dtype == dtype and got_z.dtype == dtype
        assert np.asarray(got_y).tolist() == [1, 2, 3]
        assert np.asarray(got_z).tolist() == [2, 4, 6]


def test_training_gives_the_same_losses_on_both_backends(rctl, lctl):
    """pw.train on Ray islands: a pipeline over both islands (activations and gradients
    copied between actor processes) and SPMD with a packed state, step by step as local."""
    from pwkernel.train import transformer as T

    cfg = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
    data = [T.batch(cfg, 8, seed=i) for i in range(3)]

    def losses(ctl):
        pipe = pw.train.Pipeline(T.split(cfg, 2), [ctl.slice(1, island=0),
                                                   ctl.slice(1, island=1)],
                                 loss=T.cross_entropy, optimizer=optax.sgd(1e-2, momentum=0.9),
                                 microbatches=4, schedule="1f1b")
        spmd = pw.train.SPMD(T.split(cfg, 2), ctl.slice(2, island=1), loss=T.cross_entropy,
                             optimizer=optax.adam(1e-2), packed=True)
        out = []
        for trainer in (pipe, spmd):
            state = trainer.init(0)
            for batch in data:
                state, loss = trainer.step(state, batch)
                out.append(float(loss.result(TIMEOUT)))
        return out

    local = losses(lctl)
    assert len(set(local)) > 3  # (the steps learn: losses differ)
    np.testing.assert_allclose(losses(rctl), local, rtol=1e-6)


def test_check_finite_is_refused_on_ray_islands_with_what_to_do(rctl):
    """check_finite's NaN check is a host callback, which Ray islands cannot run: refused when
    the trainer is made, saying so (before, the first step failed with "loss calls host
    callbacks", a callback the user never wrote)."""
    from pwkernel.train import transformer as T

    stages = T.split(T.Config(vocab=8, width=8, heads=2, layers=2, seq=4), 2)
    makes = {"SPMD": lambda: pw.train.SPMD(stages, rctl.slice(2, island=0), loss=T.cross_entropy,
                                          optimizer=optax.sgd(0.1), check_finite=True),
             "Pipeline": lambda: pw.train.Pipeline(
                 stages, [rctl.slice(1, island=0), rctl.slice(1, island=1)],
                 loss=T.cross_entropy, optimizer=optax.sgd(0.1), check_finite=True)}
    for trainer, make in makes.items():
        with pytest.raises(ValueError, match=rf"^{trainer}\(check_finite=True\) checks each "
                           r"step's loss with a host callback .* island 0 \(a Ray island\)"):
            make()


def test_close_removes_the_session_directory_of_the_cluster_it_started(rctl):
    """(Last: closes the module's Ray controller.) Ray keeps each local cluster's session
    directory; a controller's close removes the one of the cluster it started, no island of
    which died, so controllers opened and closed in a loop leave none behind."""
    before = cluster_processes()
    session = session_dir(before)
    rctl.close()
    assert not ray.is_initialized()
    assert not session.exists(), f"{session} was left"

"""Host callbacks that raise fail their computation, not the process (runtime/callbacks.py).

Without the guard, every test here that raises in a callback on a multi-device mesh aborts the
whole pytest process about a minute later (XLA's rendezvous, exit 134) instead of failing.
"""

from __future__ import annotations

import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime import callbacks

TIMEOUT = 60.0


def check(v):
    """The user's host function: fails on negative input."""
    v = np.asarray(v)
    if (v < 0).any():
        raise ValueError(f"negative input {v.min()}")
    return v


def pure(x):
    return jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@jax.custom_jvp
def with_jvp(x):
    return pure(x)


with_jvp.defjvp(lambda p, t: (with_jvp(p[0]), t[0]))


@jax.custom_vjp
def with_vjp(x):
    return pure(x)


with_vjp.defvjp(lambda x: (with_vjp(x), None), lambda _, g: (g,))


def _mesh():
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    return jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])


# Each body calls the host function where the rewrite has to find it, then needs every device
# (a sum over the slice, or a value sharded from the callback's one device): a raising call
# leaves the other devices waiting.
BODIES = {
    "pure_callback": lambda x, m: x * pure(x).sum(),
    "jit": lambda x, m: x * jax.jit(pure)(x).sum(),
    "scan": lambda x, m: x * jax.lax.scan(lambda c, _: (pure(c), None), x, length=3)[0].sum(),
    "while": lambda x, m: x * jax.lax.while_loop(
        lambda c: c[1] < 2, lambda c: (pure(c[0]), c[1] + 1), (x, 0))[0].sum(),
    "while (cond)": lambda x, m: x * jax.lax.while_loop(  # (a loop-invariant cond's
        lambda c: (pure(c[0]).sum() > -1e9) & (c[1] < 2),  # callback is dropped by XLA)
        lambda c: (c[0] * 2, c[1] + 1), (x, 0))[0].sum() / 4,
    "cond": lambda x, m: x * jax.lax.cond(x.sum() < 100, pure, lambda z: z, x).sum(),
    "shard_map": lambda x, m: jax.shard_map(pure, mesh=m, in_specs=P("x"),
                                            out_specs=P("x"))(x).sum() * x,
    "checkpoint": lambda x, m: x * jax.checkpoint(pure)(x).sum(),
    "custom_jvp": lambda x, m: x * with_jvp(x).sum(),
    "custom_vjp": lambda x, m: x * with_vjp(x).sum(),
    "io_callback": lambda x, m: x * io_callback(
        check, jax.ShapeDtypeStruct(x.shape, x.dtype), x).sum(),
    "debug.callback": lambda x, m: (jax.debug.callback(check, x), x * x.sum())[1],
}


def compile_body(body, mesh, name="body"):
    sh = NamedSharding(mesh, P("x"))
    struct = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sh)
    with jax.set_mesh(mesh):
        return callbacks.compile_guarded(lambda x: (body(x, mesh),), [struct], [sh], [sh], mesh,
                                         name)


def launch(call, mesh, value):
    x = jax.device_put(jnp.full((8,), value, jnp.float32), NamedSharding(mesh, P("x")))
    outs = call(x)
    jax.block_until_ready(outs)
    return outs, callbacks.failure(outs)


@pytest.mark.parametrize("where", list(BODIES))
def test_a_raising_callback_fails_its_launch_not_the_process(where):
    mesh = _mesh()
    _, call = compile_body(BODIES[where], mesh, "fn")
    assert isinstance(call, callbacks.GuardedCall)
    _, error = launch(call, mesh, -1.0)
    assert isinstance(error, ValueError) and "negative input -1.0" in str(error)
    frames = [f.name for f in traceback.extract_tb(error.__traceback__)]
    assert "check" in frames, frames  # the user's traceback, down to their function
    assert any("fn" in n and "zeros" in n for n in error.__notes__), error.__notes__
    outs, error = launch(call, mesh, 1.0)  # the next launch of the same executable is fine
    assert error is None
    assert np.asarray(outs[0]).tolist() == [8.0] * 8


def test_errors_belong_to_the_launch_that_raised():
    """Launches of one executable in flight together, from several threads, with a callback
    on every device (shard_map): each launch gets exactly its own errors."""
    mesh = _mesh()
    _, call = compile_body(BODIES["shard_map"], mesh)
    values = [(-1.0) ** k * (k + 1) for k in range(16)]  # 1, -2, 3, -4, ...
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda v: launch(call, mesh, v), values))
    for value, (outs, error) in zip(values, results, strict=True):
        if value < 0:
            assert isinstance(error, ValueError) and f"negative input {value}" in str(error)
            assert outs.launch.failures == 4  # once per device
        else:
            assert error is None and np.asarray(outs[0]).tolist() == [8 * value * value] * 8


def test_a_result_of_the_wrong_shape_fails_the_launch_with_the_fix():
    mesh = _mesh()

    def body(x, m):
        return x * jax.pure_callback(lambda v: np.zeros(3, np.float32),
                                     jax.ShapeDtypeStruct(x.shape, x.dtype), x).sum()

    _, call = compile_body(body, mesh)
    _, error = launch(call, mesh, 1.0)
    assert isinstance(error, pw.ProgramError)
    assert "returned float32[3] as result 0 where its result_shape_dtypes declare " \
           "float32[8]" in str(error)


def test_bodies_without_callbacks_compile_as_before():
    mesh = _mesh()
    compiled, call = compile_body(lambda x, m: x * x.sum(), mesh)
    assert type(call).__name__ == "FencedCall" and call.compiled is compiled  # no token
    outs, error = launch(call, mesh, 1.0)
    assert error is None and np.asarray(outs[0]).tolist() == [8.0] * 8
    assert len(outs) == 1 and outs.launch is None  # the fence is not among the outputs
    assert outs.fence.shape == () and outs.fence.is_ready()


def test_host_callbacks_are_named_for_backends_that_export():
    def body(x):
        jax.debug.print("{}", x)
        return jax.lax.scan(lambda c, _: (pure(c), None), x, length=2)[0]

    jitted = jax.jit(body)
    struct = jax.ShapeDtypeStruct((4,), jnp.float32)
    with pytest.raises(Exception):  # noqa: B017 - JAX's error, which the Ray backend replaces
        jax.export.export(jitted, platforms=["cpu"])(struct)
    found = callbacks.found(jitted.trace(struct).jaxpr)
    assert found == ["debug_print", "pure_callback"]
    error = callbacks.not_exportable("body", found)
    assert isinstance(error, pw.ProgramError)
    assert "(jax.debug.print, jax.pure_callback), which cannot be exported to Ray islands" \
        in str(error) and "backend='local'" in str(error)


# --- through the controller ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pure_callback", "io_callback", "debug.callback"])
def test_a_failing_callback_fails_its_futures_and_the_controller_carries_on(ctl, kind):
    s = ctl.slice(4, island=0)
    f = pw.function(lambda x: BODIES[kind](x, s.mesh), slice=s, in_specs=P("x"),
                    out_specs=P("x"), name="scaled")
    g = pw.function(lambda y: y + 1, slice=s, in_specs=P("x"), out_specs=P("x"))
    bad = f(-np.ones(8, np.float32))
    with pytest.raises(ValueError, match="negative input -1.0") as info:
        bad.result(TIMEOUT)
    assert "check" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert any("scaled" in n for n in info.value.__notes__)
    chained = pw.program(lambda v: g(f(v)))(-np.ones(8, np.float32))
    with pytest.raises(ValueError, match="negative input"):  # its consumer fails with it
        chained.result(TIMEOUT)
    good = pw.program(lambda v: g(f(v)))(np.ones(8, np.float32))
    assert good.result(TIMEOUT).tolist() == [9.0] * 8
    assert ctl.wait(TIMEOUT)


def test_close_from_a_host_callback_is_refused_and_the_controller_carries_on(ctl):
    """A host callback runs on XLA's threads, inside the computation that ``close()`` waits
    for: close from there used to wait for itself (and on four devices XLA's rendezvous then
    aborted the process). It refuses, failing that computation's futures; the controller
    stays open and works, and closes from the user's thread."""
    s = ctl.slice(4, island=0)

    def closing(v):
        ctl.close()
        return v

    def body(x):
        y = jax.pure_callback(closing, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return x * y.sum()  # (needs every device)

    f = pw.function(body, slice=s, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(RuntimeError, match="from a host callback, inside the computation"):
        f(np.ones(8, np.float32)).result(TIMEOUT)
    assert not ctl.closed
    g = pw.function(lambda x: x * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
    assert g(np.ones(8, np.float32)).result(TIMEOUT).tolist() == [2.0] * 8


# --- in a real kernel ------------------------------------------------------------------------
CELLS = (
    "import jax, numpy as np, pwkernel as pw\nfrom jax.sharding import PartitionSpec as P\n"
    "ctl = pw.controller(); s0 = ctl.slice(4, island=0)\n"
    "def check(v):\n    if (np.asarray(v) < 0).any():\n"
    "        raise ValueError('negative input')\n    return v\n"
    "def body(x):\n    y = jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x)\n"
    "    return x * y.sum()\n"
    "f = pw.function(body, slice=s0, in_specs=P('x'), out_specs=P('x'))\n"
    "bad, good = -np.ones(8, np.float32), np.ones(8, np.float32)",
    "y = f(bad)\ntry:\n    y.result(60)\nexcept ValueError as e:\n    print('failed:', e)",
    "%%pathways --slice s0\nz = body(bad)\nz",
    "print('alive', f(good).result(60).tolist())",
    "%%pathways --slice s0\nw = body(good) + 1",
    "print('next cell', w.result(60).tolist())",
)


def test_a_raising_callback_in_a_cell_leaves_the_kernel_running(kernel_env):
    from tests.helpers.kernel import execute, notebook, text

    c = execute(notebook(*CELLS)).cells
    assert "failed: negative input" in text(c[1]), text(c[1])
    assert "ValueError: negative input" in text(c[2]), text(c[2])
    assert "alive [8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]" in text(c[3]), text(c[3])
    assert "Error" not in text(c[4]), text(c[4])
    assert "next cell [9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0]" in text(c[5]), text(c[5])


def test_jax_debug_nans_fails_the_futures_with_jax_jits_floating_point_error(ctl):
    """Under jax_debug_nans a NaN fails the call's futures (and what reads them) with the
    FloatingPointError jax.jit raises, not JAX's internal error type; the next call runs."""
    s = ctl.slice(2)
    log = pw.function(jnp.log, slice=s)
    with jax.debug_nans(True):
        with pytest.raises(FloatingPointError, match="invalid value"):
            jax.jit(jnp.log)(-np.ones(4, np.float32))
        y = log(-np.ones(4, np.float32))
        z = pw.function(lambda a: a + 1, slice=s)(y)
        for fut in (y, z):
            with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) .* log"):
                fut.result(60)
    assert log(np.ones(4, np.float32)).result(60).tolist() == [0.0] * 4


def test_a_done_callback_that_is_not_callable_is_refused_when_added():
    # (it was accepted, then failed on the callbacks' thread as a logged "'int' object is
    # not callable", far from the line that gave it)
    ctl = pw.Controller(islands=(2,))
    try:
        fut = pw.function(lambda x: x + 1, slice=ctl.slice(1))(np.ones(2))
        with pytest.raises(TypeError, match=r"add_done_callback needs a callable.*got int 3.*"
                                            r"fut.add_done_callback\(lambda f: "):
            fut.add_done_callback(3)
        fut.result(TIMEOUT)
        with pytest.raises(TypeError, match="needs a callable"):
            fut.add_done_callback(None)  # a done future too (it would be called at once)
    finally:
        ctl.close()


def _held_until_set(s):
    """A function on ``s`` whose (float32 scalar) result waits until ``gate`` is set."""
    gate = threading.Event()

    def held(v):
        assert gate.wait(TIMEOUT)
        return v

    return pw.function(lambda v: io_callback(held, jax.ShapeDtypeStruct((), jnp.float32), v),
                       slice=s), gate


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_ordered_callbacks_run_in_call_order_when_an_earlier_call_waits(mode):
    """``io_callback(..., ordered=True)`` runs in call order under ``jax.jit`` across calls,
    even when the first call waits for its input; here the second call, ready at once, was
    launched first and its callback ran first (``runtime/effects_order.py``)."""
    ctl = pw.Controller(islands=(2, 2), dispatch=mode)
    try:
        s0, s1 = ctl.slice(1, island=0), ctl.slice(1, island=1)
        log, (slow, gate) = [], _held_until_set(s1)

        def logged(x, i):
            io_callback(log.append, None, i, ordered=True)
            return x + 1

        f = pw.function(logged, slice=s0)
        two = pw.program(lambda v, w: (f(v, np.int32(3)), f(w, np.int32(4))))
        first = f(slow(np.float32(1)), np.int32(1))  # waits for island 1
        second = f(np.float32(0), np.int32(2))       # ready at once
        third, fourth = two(slow(np.float32(1)), np.float32(0))  # in one program, the same
        gate.set()
        for fut in (first, second, third, fourth):
            fut.result(TIMEOUT)
        assert [int(i) for i in log] == [1, 2, 3, 4]
    finally:
        ctl.close()


def test_an_ordered_callback_reading_only_its_own_islands_work_waits_for_an_earlier_call():
    """The second call's ordered computation reads only a computation of its own program on
    its island (no argument, no constant): its island's scheduler launched it once that one
    had, not waiting for the dispatcher's word that the earlier call's ordered callback
    launched (``effects_order.py``), so its callback ran first (parallel dispatch)."""
    ctl = pw.Controller(islands=(2, 2))
    try:
        s0, s1 = ctl.slice(1, island=0), ctl.slice(1, island=1)
        log, (slow, gate) = [], _held_until_set(s1)

        def logs(i):
            def logged(x):
                io_callback(log.append, None, np.int32(i), ordered=True)
                return x + 1
            return pw.function(logged, slice=s0, name=f"logged{i}")

        first_f, second_f, double = logs(1), logs(2), pw.function(lambda v: v * 2, slice=s0)
        second_p = pw.program(lambda v: second_f(double(v)))
        first = first_f(slow(np.float32(1)))  # waits for island 1
        second = second_p(np.float32(0))      # ready at once
        gate.set()
        assert float(first.result(TIMEOUT)) == 2.0 and float(second.result(TIMEOUT)) == 1.0
        assert [int(i) for i in log] == [1, 2]  # (was [2, 1])
    finally:
        ctl.close()

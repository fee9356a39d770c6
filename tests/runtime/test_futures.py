"""Futures and the object store: a node's outputs counted and resolved at once, the runtime's
hooks on a run's arguments, and ``running()`` (true from a computation's launch to its end),
on real arrays and a real controller."""

from __future__ import annotations

import gc
import sys
import threading
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime import done_callbacks
from pwkernel.runtime.objects import Future, FutureState, ObjectStore
from tests.helpers.programs import gate


@pytest.fixture
def sharded():
    """Two arrays on a 2-device mesh: ``a`` split over both (16 bytes each), ``b`` on both."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    split, both = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    a = jax.device_put(np.arange(8, dtype=np.float32), split)
    b = jax.device_put(np.ones(2, np.float32), both)
    return (a, split), (b, both)


def made(store, sharded, nbytes=(None, None)):
    """Two pending futures of ``store`` and what ``set_results`` takes for them: the futures,
    their values and their sizes, side by side."""
    futs = [Future(v.shape, v.dtype, s, island=0, store=store) for v, s in sharded]
    return futs, (futs, [v for v, _ in sharded], list(nbytes))


def test_a_nodes_outputs_are_counted_at_once_per_device_and_freed_one_by_one(sharded):
    freed = []
    store = ObjectStore(on_free=freed.append)
    (a, _), (b, _) = sharded
    futs, outs = made(store, sharded, (None, {0: 100}))  # b's bytes as the plan gives them
    store.add_many(*outs, reserved=True)
    assert store.memory() == {0: 16 + 100, 1: 16}
    assert [(r.program, r.client, r.island, r.reserved) for r in store.records()] == \
        [("", "default", 0, True)] * 2
    assert [f for _, f in store.live()] == futs
    del outs
    futs.pop(0)  # the last reference to a's future: a is freed, b is not
    assert a.is_deleted() and not b.is_deleted()
    assert [r.nbytes for r in freed] == [{0: 16, 1: 16}] and store.memory() == {0: 100}
    futs.clear()
    assert b.is_deleted() and store.memory() == {} and not store.records()


def test_set_results_resolves_each_future_in_order_with_its_value(sharded):
    store = ObjectStore()
    futs, outs = made(store, sharded)
    order = []
    for k, f in enumerate(futs):
        f.add_done_callback(lambda _f, k=k: order.append(k))
    Future.set_results(*outs, t_done=2.5, reserved=False)
    assert done_callbacks.runner.wait_idle(60) and order == [0, 1]
    assert [f.state for f in futs] == [FutureState.DONE] * 2 and [f.t_done for f in futs] == \
        [2.5, 2.5]
    assert futs[0].result().tolist() == list(range(8)) and futs[1].result().tolist() == [1, 1]
    assert store.memory() == {0: 16 + 8, 1: 16 + 8}  # nbytes None: from each sharding


def test_a_value_the_user_took_is_never_deleted_by_the_store(sharded):
    store = ObjectStore()
    (a, _), (b, _) = sharded
    futs, outs = made(store, sharded)
    Future.set_results(*outs)
    del outs
    assert futs[0].result() is a  # handed out: the user's now
    futs.clear()
    assert not a.is_deleted() and b.is_deleted() and store.memory() == {}


@pytest.mark.parametrize("told", [False, True], ids=["no_budget", "budget"])
def test_a_future_donated_before_it_resolved_costs_the_store_nothing(sharded, told):
    """A later launch consumed (donated) a's buffer before a's computation ended, as a
    training step consumes the step before it: the store makes no entry for it and counts
    nothing; a's value is the consumed array, as jax.jit leaves it. Under a budget (someone
    told of frees) the bytes reserved for a are given back as it resolves, once: the
    consumer reuses them (the free of a's future later gives nothing back twice)."""
    freed = []
    store = ObjectStore(on_free=freed.append if told else None)
    (a, _), (b, _) = sharded
    futs, outs = made(store, sharded)
    Future.consumed_many([futs[0], None])
    Future.set_results(*outs, t_done=1.0, reserved=told)
    assert [f.state for f in futs] == [FutureState.DONE] * 2
    assert futs[0].result() is a and futs[0].peek() is a
    assert store.memory() == {0: 8, 1: 8}
    assert [f for _, f in store.live()] == futs[1:]
    assert [(r.nbytes, r.reserved) for r in freed] == ([({0: 16, 1: 16}, True)] if told else [])
    del outs
    futs.clear()
    assert store.memory() == {} and not a.is_deleted()  # (a donated buffer is not deleted)
    assert [r.nbytes for r in freed] == ([{0: 16, 1: 16}, {0: 8, 1: 8}] if told else [])


@pytest.mark.parametrize("when", ["resolved", "pending"])
def test_a_donated_future_gives_its_reserved_bytes_back_once(sharded, when):
    """Under a budget a launch that consumes (donates) a counted buffer gives its bytes back
    when it consumes it, or when the buffer's own computation ends if that is later; the
    buffer's free later gives back nothing (its record says so), and neither does a second
    consumption. A backend's handle, still entered, is treated alike."""
    class Handle:
        def delete(self):
            pass

    freed = []
    store = ObjectStore(on_free=freed.append)
    (a, sa), _ = sharded
    handle = Handle()
    futs = [Future(a.shape, a.dtype, sa, island=0, store=store) for _ in range(2)]
    if when == "resolved":
        Future.set_results(futs, [a, handle], t_done=1.0, reserved=True)
        assert not freed and store.memory() == {0: 32, 1: 32}
    Future.consumed_many(futs)
    if when == "pending":
        assert not freed  # (nothing is counted yet: it goes as they resolve)
        Future.set_results(futs, [a, handle], t_done=1.0, reserved=True)
    assert [(r.nbytes, r.reserved) for r in freed] == [({0: 16, 1: 16}, True)] * 2
    Future.consumed_many(futs)  # (a second consumption gives nothing back twice)
    assert len(freed) == 2
    live = [r.reserved for r, _ in store.live()]  # what the budget's analysis reads
    assert live == ([False, False] if when == "resolved" else [False])
    futs.clear()
    gc.collect()
    assert store.memory() == {} and not any(r.reserved for r in freed[2:])


def test_a_donated_backend_handle_is_still_entered_and_deleted():
    """Only a ``jax.Array`` consumed before it resolved is left out of the store: a backend's
    handle (a Ray island's buffer id) is entered all the same, since deleting it is what
    frees the island's own copy. It holds no memory (``memory()``): the launch consumed it."""
    deleted = []

    class Handle:
        def delete(self):
            deleted.append(self)

    store, handle = ObjectStore(), Handle()
    fut = Future((2,), np.float32, None, island=0, store=store)
    Future.consumed_many([fut])
    Future.set_results([fut], [handle], [{0: 8}])
    assert [r.nbytes for r in store.records()] == [{0: 8}] and store.memory() == {}
    del fut
    assert deleted == [handle] and store.memory() == {}


def test_set_results_takes_futures_of_one_store_only(sharded):
    one, other = ObjectStore(), ObjectStore()
    (a, s), (b, t) = sharded
    futs = [Future(a.shape, a.dtype, s, store=one), Future(b.shape, b.dtype, t, store=other)]
    with pytest.raises(ValueError, match="one object store"):
        Future.set_results(futs, [a, b])
    assert one.memory() == other.memory() == {} and not any(f.done() for f in futs)


def test_set_results_without_a_store_keeps_the_values_as_given(sharded):
    (a, s), (b, t) = sharded
    futs = [Future(a.shape, a.dtype, s), Future(b.shape, b.dtype, t)]
    Future.set_results(futs, [a, b])
    assert futs[0].result() is a and futs[1].result() is b
    futs.clear()
    assert not a.is_deleted() and not b.is_deleted()


@pytest.mark.parametrize("before", ["pending", "launched", "resolved"])
def test_watch_calls_the_launch_hook_then_the_end_hook_once_each(before):
    fut, seen = Future((2,), np.float32), []
    value = np.ones(2, np.float32)
    if before in ("launched", "resolved"):
        fut.set_launched(value)
    if before == "resolved":
        fut.set_result(value, 1.0)
    fut.watch(lambda f: seen.append(("launch", f)), lambda f: seen.append(("end", f)))
    fut.set_launched(value)
    fut.set_result(value, 1.0)
    assert seen == [("launch", fut), ("end", fut)]


def test_several_runtime_hooks_fire_in_the_order_they_were_added():
    fut, seen = Future((), np.float32), []
    fut.hook(lambda f: seen.append("end 1"))
    fut.on_launch(lambda f: seen.append("launch 1"))
    fut.watch(lambda f: seen.append("launch 2"), lambda f: seen.append("end 2"))
    fut.hook(lambda f: seen.append("end 3"))
    fut.set_launched(1.0)
    assert seen == ["launch 1", "launch 2"]
    fut.set_exception(ValueError("failed"), 1.0)
    assert seen == ["launch 1", "launch 2", "end 1", "end 2", "end 3"]
    assert fut.state is FutureState.FAILED and not fut.running()


def hold_until(entered: threading.Event, release: threading.Event):
    """A computation that says when it runs, then keeps its device until released."""
    def hold(x):
        entered.set()
        if not release.wait(60):
            raise TimeoutError("never released")
        return x
    return lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_running_is_true_from_launch_to_end_only(ctl):
    one = ctl.slice(1, island=0)
    entered, release = threading.Event(), threading.Event()
    held = pw.function(hold_until(entered, release), slice=one, name="held")(np.ones(2))
    try:
        assert entered.wait(60)
        # on the same device, queued until the held computation ends
        queued = pw.function(lambda x: x + 1, slice=one, name="queued")(np.ones(2))
        assert held.running() and not held.done()
        assert not queued.running() and not queued.done()
    finally:
        release.set()
    assert queued.result(timeout=60).tolist() == [2.0, 2.0]
    assert held.done() and not held.running() and not queued.running()


def test_what_waits_on_a_nodes_outputs_runs_once_all_of_them_are_set(sharded):
    # A node's outputs resolve (and launch) together: a callback or hook of one of them sees
    # the others resolved (launched) already, whichever it is.
    store = ObjectStore()
    futs, outs = made(store, sharded)
    seen = []
    futs[0].on_launch(lambda f: seen.append(("launch", futs[1].peek() is not None)))
    futs[0].add_done_callback(lambda f: seen.append(("done", futs[1].done())))
    Future.set_launched_many(futs, outs[1])
    Future.set_results(*outs, t_done=1.0)
    assert done_callbacks.runner.wait_idle(60) and seen == [("launch", True), ("done", True)]


def test_a_callback_may_wait_on_and_hook_a_sibling_output(ctl):
    # The outputs of one computation share one lock: a callback on one that waits on another
    # or hooks it must not find that lock held.
    s = ctl.slice(2, island=0)
    both = pw.function(lambda x: (x + 1, x * 2), slice=s)
    got, hooked = [], threading.Event()
    a, b = both(np.arange(4, dtype=np.float32))
    b.add_done_callback(lambda f: got.append(a.result().tolist()))
    b.add_done_callback(lambda f: a.add_done_callback(lambda g: hooked.set()))
    assert b.result(timeout=60).tolist() == [0, 2, 4, 6]
    assert hooked.wait(60) and got == [[1, 2, 3, 4]]


def test_a_future_does_arithmetic_as_the_array_it_holds(ctl):
    """Operators, indexing and iteration on the value once it is there, as after jax.jit: the
    same values, a jax.Array where JAX's operation puts it; a failed future raises its error."""
    s = ctl.slice(2)
    f, jf = pw.function(lambda a: a * 2 - 3, slice=s), jax.jit(lambda a: a * 2 - 3)
    x = np.arange(1, 9, dtype=np.int32).reshape(4, 2)
    y, v, eye = f(x), jf(x), np.eye(2, dtype=np.int32)
    pairs = [(y + 1, v + 1), (1 + y, 1 + v), (y - v, v - v), (10 - y, 10 - v), (y * y, v * v),
             (y / 2, v / 2), (2 / y, 2 / v), (y // 2, v // 2), (7 % y, 7 % v), (y ** 2, v ** 2),
             (y @ eye, v @ eye), (-y, -v), (abs(y), abs(v)), (~y, ~v), (y & 6, v & 6),
             (3 | y, 3 | v), (y ^ 1, v ^ 1), (y << 1, v << 1), (y >> 1, v >> 1),
             (y[1], v[1]), (y[:, 0], v[:, 0]), (list(y)[2], list(v)[2])]
    for got, want in pairs:
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    assert (y + 1).sharding.device_set == y.sharding.device_set  # where the value is
    assert y == y and y != f(x) and len({y, y}) == 1  # futures compare (and hash) as futures
    bad = pw.function(lambda a: jax.pure_callback(_fail, jax.ShapeDtypeStruct((2,), np.float32),
                                                  a), slice=s)(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="no value here"):
        bad + 1


def test_a_future_compared_with_a_number_or_numpy_value_compares_its_value(ctl):
    """``loss == 0.5``, ``step != 3``, ``y == np_array``: what the jax.Array gives (before, a
    number or a NumPy value fell back to identity: ``loss == 0.5`` was False whatever the loss,
    ``step != 3`` True); two futures still compare as futures (keys of dicts and sets)."""
    s = ctl.slice(2)
    f, jf = pw.function(lambda a: a / 2, slice=s), jax.jit(lambda a: a / 2)
    x = np.arange(4, dtype=np.float32)
    y, v = f(x), jf(x)
    half, step = f(np.float32(1)), pw.function(lambda a: a.sum(), slice=s)(np.int32([1, 2]))
    assert bool(half == 0.5) and not bool(half != 0.5) and bool(step == 3)
    assert bool(np.float32(0.5) == half) and not bool(3 != step)
    for got, want in [(y == v.tolist()[2], v == v.tolist()[2]), (y != 1.0, v != 1.0),
                      (y == np.asarray(v), v == np.asarray(v)), (y != np.float32(0), v != 0)]:
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(got, want)
    assert y == y and y != f(x) and len({y, y, half}) == 2


def test_jax_functions_transformations_and_array_methods_take_a_future(ctl):
    """Where JAX takes a jax.Array it takes a future, as the value it holds: jnp functions and
    jax.jit (which no longer call __jax_array__), jax.grad, jax.Array's methods, pickling;
    jax.block_until_ready waits for it. Same values, dtypes and shardings as on the value."""
    import copy
    import pickle

    s = ctl.slice(2)
    f = pw.function(lambda a: a * 2 - 3, slice=s, in_specs=P("x"))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y, z = f(x), pw.function(lambda a: a - 1, slice=s)(x)  # sharded on "x"; replicated
    v, w = y.result(), z.result()
    assert y.devices() == v.devices()
    pairs = [(jnp.sum(y), jnp.sum(v)), (jnp.where(y > 0, y, 0), jnp.where(v > 0, v, 0)),
             (jax.jit(lambda a: jnp.tanh(a) + 1)(y), jax.jit(lambda a: jnp.tanh(a) + 1)(v)),
             (jnp.concatenate([y, y]), jnp.concatenate([v, v])), (jnp.exp(y), jnp.exp(v)),
             (y.sum(axis=0), v.sum(axis=0)), (y.mean(), v.mean()), (y.T, v.T),
             (y.astype(jnp.int32), v.astype(jnp.int32)), (z.reshape(2, 4), w.reshape(2, 4)),
             (y.max(), v.max()), (pickle.loads(pickle.dumps(y)), pickle.loads(pickle.dumps(v))),
             (copy.copy(y), copy.copy(v)), (copy.deepcopy([y])[0], copy.deepcopy([v])[0])]
    with jax.set_mesh(s.mesh):  # (explicit mesh axes: JAX asks for the mesh around these)
        grad = jax.grad(lambda a: (a ** 2).mean())
        pairs += [(grad(y), grad(v)), (z.at[0, 0].set(9.0), w.at[0, 0].set(9.0))]
    for got, want in pairs:
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.sharding == want.sharding
    # str, print and f-strings show the value, as a jax.Array's do (checkify's messages
    # format their payloads so); repr stays the future's own
    assert str(y) == str(v) and f"{y}" == f"{v}" and f"{y.sum():.2f}" == f"{v.sum():.2f}"
    assert format(z) == str(w) and repr(y).startswith("Future(")
    # a 0-d value (a step's loss in a log line) too: f"{loss}" gives the float's digits
    # (3.4000000953674316 under jax.jit), not str's (it gave 3.4)
    loss = pw.function(lambda a: a.mean() * 0.1, slice=s)(x)
    value = loss.result()
    assert f"{loss}" == f"{value}" and f"{loss!s}" == f"{value!s}"
    # jax.block_until_ready waits for the futures in a tree (it returned at once before)
    gate = threading.Event()
    slow = pw.function(lambda a: jax.pure_callback(lambda b: (gate.wait(), b)[1],
                                                   jax.ShapeDtypeStruct((2,), np.float32), a),
                       slice=s)(np.ones(2, np.float32))
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(
        (jax.block_until_ready({"w": slow}), slow.done())))
    waiter.start()
    gate.set()
    waiter.join()
    assert seen == [({"w": slow}, True)] and slow.block_until_ready() is slow
    bad = pw.function(lambda a: jax.pure_callback(_fail, jax.ShapeDtypeStruct((2,), np.float32),
                                                  a), slice=s)(np.ones(2, np.float32))
    for use in (jnp.sum, jax.jit(lambda a: a + 1), lambda a: a.block_until_ready()):
        with pytest.raises(ValueError, match="no value here"):
            use(bad)



def test_numpy_on_the_left_of_a_future_gives_what_it_gives_with_the_array(ctl):
    """``np.float32(2) * fut`` and ``np.ones(4) + fut`` are JAX's operations, as with the
    jax.Array the future holds (NumPy defers to either): a jax.Array, typed by JAX's rules
    (a NumPy float64 scalar does not make it float64); not a NumPy array computed on the host.
    ``divmod(2.0, fut)``, ``fut.tobytes()`` and ``fut.argpartition(k)`` answer as the array's;
    ``==`` with NumPy on either side compares the value, as the array's."""
    s = ctl.slice(2)
    x = np.arange(1, 5, dtype=np.float32)
    y = pw.function(lambda a: a * 2, slice=s)(x)
    v = y.result()
    pairs = [(np.float32(2) * y, np.float32(2) * v), (np.float64(2) * y, np.float64(2) * v),
             (np.int8(3) + y, np.int8(3) + v), (np.ones(4, np.float32) - y,
                                                np.ones(4, np.float32) - v),
             (np.ones(4, np.float32) < y, np.ones(4, np.float32) < v),
             (np.eye(4, dtype=np.float32) @ y, np.eye(4, dtype=np.float32) @ v),
             (divmod(7.0, y)[1], divmod(7.0, v)[1]), (y.argpartition(1), v.argpartition(1))]
    for got, want in pairs:
        assert isinstance(got, jax.Array), type(got)
        assert jax.typeof(got) == jax.typeof(want)
        np.testing.assert_array_equal(got, want)
    assert y.tobytes() == v.tobytes() == np.asarray(x * 2).tobytes()
    for got, want in [(np.ones(4) == y, np.ones(4) == v), (y == np.ones(4), v == np.ones(4))]:
        assert isinstance(got, jax.Array)  # == against NumPy: the value's, as the array's
        np.testing.assert_array_equal(got, want)

def _fail(a):
    raise ValueError("no value here")


def test_a_done_callback_may_wait_for_more_work_on_the_same_devices(ctl):
    """A callback runs on a thread of its own, not on the thread that saw the end: one that
    calls the same slice's function and waits for its result (or blocks) holds up no island,
    and a callback added once the future is done runs at once, its error logged, as
    concurrent.futures has it."""
    s = ctl.slice(2, island=0)
    inc = pw.function(lambda x: x + 1, slice=s)
    got, waited, release = [], threading.Event(), threading.Event()

    def chain(fut):
        got.append(inc(fut).result(timeout=60).tolist())
        waited.set()

    first = inc(np.zeros(2, np.float32))
    first.add_done_callback(chain)
    first.add_done_callback(lambda _: release.wait(60))  # blocks the callbacks after it only
    assert waited.wait(60) and got == [[2.0, 2.0]]
    assert inc(inc(first)).result(timeout=60).tolist() == [3.0, 3.0]  # the island runs on
    release.set()
    assert done_callbacks.runner.wait_idle(60)

    def boom(_):
        raise RuntimeError("callback bug")

    first.add_done_callback(boom)  # done already: called here, the error logged, not raised


def test_close_from_a_done_callback_closes_everything():
    before = {t.name for t in threading.enumerate() if t.name.startswith("pw-island")}
    ctl = pw.Controller(islands=(2, 2))
    entered, release = threading.Event(), threading.Event()
    f = pw.function(gate(entered, release), slice=ctl.slice(1))
    fut, closed = f(np.zeros(2, np.float32)), threading.Event()
    fut.add_done_callback(lambda _: (ctl.close(), closed.set()))  # before it resolves
    release.set()
    assert closed.wait(60) and ctl.closed
    with pytest.raises(pw.ControllerClosedError):
        fut.result()
    assert {t.name for t in threading.enumerate() if t.name.startswith("pw-island")} <= before


def test_item_assignment_on_a_future_says_what_to_do_as_jax_arrays_do(ctl):
    """A future is immutable, as the jax.Array it holds: ``fut[i] = v`` raises a TypeError
    that says to use ``.at``; flax.nnx updates a Variable that holds one that way (BatchNorm's
    statistics, Dropout's rng count, when a module a pw.function returned is called in train
    mode outside one), so the error also says how to take the values first, and that works."""
    from flax import nnx

    s = ctl.slice(2)
    with pytest.raises(TypeError, match="immutable") as plain:
        jnp.ones(2)[0] = 1
    fut = pw.function(lambda a: a + 1, slice=s)(np.ones(2, np.float32))
    with pytest.raises(TypeError, match=r"immutable.*x\.at\[idx\]\.set\(y\)"):
        fut[0] = 1
    assert "x = x.at[idx].set(y)" in str(plain.value)

    class Net(nnx.Module):
        def __init__(self):
            self.bn = nnx.BatchNorm(4, rngs=nnx.Rngs(0))
            self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1))

        def __call__(self, x):
            return self.drop(self.bn(x))

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with jax.set_mesh(s.mesh):
        want = jax.jit(lambda m: m)(Net())
        want_y = want(x)
    net = pw.function(lambda m: m, slice=s)(Net())
    with pytest.raises(TypeError, match=r"jax\.tree\.map\(lambda v: v\.result\(\), model\)"):
        net(x)
    net = jax.tree.map(lambda v: v.result(), net)
    with jax.set_mesh(s.mesh):
        np.testing.assert_array_equal(net(x), want_y)
    np.testing.assert_array_equal(net.bn.mean[...], want.bn.mean[...])


def test_a_futures_shape_dtype_and_sharding_are_read_only_as_a_jax_arrays(ctl):
    """NumPy's ``a.shape = (2, 4)`` reshapes in place; on a future it was taken silently and
    changed only what the future said (its value kept the old shape). It is refused as
    ``jax.Array`` refuses it, an AttributeError, naming the operation meant."""
    fut = pw.function(lambda a: a + 1, slice=ctl.slice(2))(np.ones(8, np.float32))
    sharding = fut.sharding
    for name, value, fix in (("shape", (2, 4), r"fut\.reshape\(2, 4\)"),
                             ("dtype", np.int32, r"fut\.astype\(jnp\.int32\)"),
                             ("sharding", None, r"jax\.device_put\(fut\.result\(\), sharding\)")):
        with pytest.raises(AttributeError, match="no setter"):
            setattr(jnp.ones(8), name, value)
        with pytest.raises(AttributeError, match=rf"a pw.Future's {name} is read-only, as a "
                                                 rf"jax.Array's.*Maybe you want {fix}"):
            setattr(fut, name, value)
    assert (fut.shape, fut.dtype, fut.sharding) == ((8,), np.float32, sharding)
    np.testing.assert_array_equal(fut.reshape(2, 4), np.full((2, 4), 2, np.float32))


def test_a_done_callback_that_raises_system_exit_stops_no_later_callback():
    """``sys.exit()`` (a ``BaseException``) in a callback on the runner's thread is logged as
    any error is; before, it ended the thread for good while the runner still counted it as
    running: no later callback ever ran (``await fut`` hung) and ``ctl.close()``, which waits
    for the callbacks, never returned. (A fresh runner: the process's one stays sound.)"""
    runner = done_callbacks.CallbackRunner("pw-test-callbacks")
    ran, later = threading.Event(), threading.Event()

    def leave(_):
        raise SystemExit(3)

    runner.submit([leave, lambda _: ran.set()], None)
    runner.submit([lambda _: later.set()], None)
    assert ran.wait(60) and later.wait(60)
    assert runner.wait_idle(60)
    again = threading.Event()
    runner.submit([lambda _: again.set()], None)  # the runner starts a thread again
    assert again.wait(60) and runner.wait_idle(60)


def test_asking_a_failed_future_again_does_not_grow_the_errors_traceback(ctl):
    """The error is one object, shared by the future and its dependents; each ``raise`` of it
    used to add the asking frames to its traceback for good: after 100 asks it printed some
    200 frames more, for the dependents too, and kept those frames alive. It is raised with
    the traceback it came with (down to the user's function), plus the asking frames only."""
    s = ctl.slice(1, island=0)

    def failing(v):
        raise RuntimeError("planted")

    bad = pw.function(lambda x: jax.pure_callback(
        failing, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s)(np.ones(2, np.float32))
    dependent = pw.function(lambda x: x + 1, slice=s)(bad)

    def frames(fut, how):
        with pytest.raises(RuntimeError, match="planted") as info:
            how(fut)
        return [f.name for f in traceback.extract_tb(info.value.__traceback__)]

    first = frames(bad, lambda f: f.result(timeout=60))
    assert "failing" in first
    for _ in range(100):
        frames(bad, lambda f: f.result(timeout=60))
        frames(bad, lambda f: f.block_until_ready())
    assert frames(bad, lambda f: f.result(timeout=60)) == first
    again = frames(dependent, lambda f: f.result(timeout=60))
    assert again == first  # (not the frames of the asks before it)


@pytest.mark.parametrize("done", [False, True], ids=["pending", "done"])
@pytest.mark.parametrize("call", ["result", "wait", "exception"])
def test_a_timeout_that_is_no_number_is_refused_at_the_call(ctl, call, done):
    """``timeout`` is a number of seconds or None; anything else is a TypeError that says so,
    whether or not the future has resolved (not a bare one from deep inside the wait)."""
    fut = pw.Future((2,), np.float32)
    if done:
        fut.set_result(np.zeros(2, np.float32))
    with pytest.raises(TypeError, match=r"timeout must be a number of seconds or None .*got "
                       r"str '5'"):
        getattr(fut, call)(timeout="5")
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        ctl.wait(timeout="5")
    if done:  # numbers of every kind still do
        assert fut.wait(np.float64(1.0)) and fut.wait(1) and fut.result(timeout=np.int64(1)) \
            is not None and fut.exception(0.5) is None



class _ReleasedOnWait:
    """Open ``release`` when the main thread starts to block in ``threading.Event.wait``."""

    def __init__(self, release: threading.Event):
        self.release = release

    def __enter__(self):
        def profile(frame, event, _arg):
            if event == "call" and frame.f_code is threading.Event.wait.__code__:
                self.release.set()
        sys.setprofile(profile)

    def __exit__(self, *exc):
        sys.setprofile(None)


@pytest.mark.parametrize("call", ["result", "wait", "exception", "ctl.wait", "run.wait"])
def test_a_timeout_of_nan_true_or_infinity_means_what_it_says(ctl, call):
    """``timeout=True`` (``queue.get(True)``'s "block") was taken as one second, NaN as 0
    ("not ready after nan s"), and ``float('inf')`` or 1e300 failed with "OverflowError:
    timestamp out of range" while the value was pending. Now True and NaN are refused, and
    infinity waits without a limit; a negative timeout stays 0 (``concurrent.futures``)."""
    s = ctl.slice(1)
    for endless in (float("inf"), 1e300):
        entered, release = threading.Event(), threading.Event()
        fut = pw.function(gate(entered, release), slice=s)(np.zeros(2, np.float32))
        wait = {"ctl.wait": ctl.wait, "run.wait": fut.run.wait}.get(call) or getattr(fut, call)
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None .*"
                           "bool True"):
            wait(timeout=True)
        with pytest.raises(ValueError, match="timeout is NaN"):
            wait(timeout=float("nan"))
        assert not fut.done()
        with _ReleasedOnWait(release):
            wait(timeout=endless)
        assert fut.done() and fut.result(timeout=-1).tolist() == [0.0, 0.0]

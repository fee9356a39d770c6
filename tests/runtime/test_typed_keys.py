"""Typed PRNG keys (``jax.random.key``: dtype ``key<fry>``, a ``jax.Array`` NumPy cannot
hold) go through ``pw.function`` and ``@pw.program`` as ``jax.jit`` takes them: as arguments,
as outputs (futures of dtype ``key<fry>``), chained from call to call, donated, across
islands, and counted by the object store at their key data's size."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pwkernel as pw


def key_data(key) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


def test_a_chain_of_typed_keys_draws_what_jax_draws(ctl):
    s = ctl.slice(2)
    split = pw.function(lambda k: tuple(jax.random.split(k)), slice=s)
    draw = pw.function(lambda k: jax.random.normal(k, (4,)), slice=s)
    key, want_key = jax.random.key(1), jax.random.key(1)
    draws = []
    for _ in range(3):  # the key travels as a future from one call to the next
        key, sub = split(key)
        draws.append(draw(sub))
        want_key, want_sub = jax.random.split(want_key)
        np.testing.assert_array_equal(np.asarray(draws[-1].result()),
                                      np.asarray(jax.random.normal(want_sub, (4,))))
    assert key.dtype == jax.random.key(0).dtype and key.shape == ()
    got = key.result()
    assert got.dtype == key.dtype and {d.id for d in got.sharding.device_set} == set(s.device_ids)
    np.testing.assert_array_equal(key_data(got), key_data(want_key))


def test_typed_keys_of_every_implementation(ctl):
    def uniform(k):
        return jax.random.uniform(k, (3,))

    draw = pw.function(uniform, slice=ctl.slice(1))
    for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
        key = jax.random.key(7, impl=impl)
        np.testing.assert_array_equal(np.asarray(draw(key).result()),
                                      np.asarray(jax.jit(uniform)(key)))


def test_a_typed_key_crosses_islands_in_a_program(ctl):
    split = pw.function(lambda k: tuple(jax.random.split(k)), slice=ctl.slice(2, island=0))
    draw = pw.function(lambda k: jax.random.normal(k, (4,)), slice=ctl.slice(2, island=1))

    @pw.program
    def two_islands(k):
        a, b = split(k)
        return draw(a), b  # ``a`` goes to island 1 (a DCN transfer), ``b`` stays

    x, b = two_islands(jax.random.key(5))
    want_a, want_b = jax.random.split(jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(x.result()),
                                  np.asarray(jax.random.normal(want_a, (4,))))
    np.testing.assert_array_equal(key_data(b.result()), key_data(want_b))
    # (the argument, made on device 0, is copied onto island 0's slice first: ici)
    assert [e.link for e in ctl.trace.events() if e.kind == "transfer"] == ["ici", "dcn"]


def test_a_donated_key_state_is_consumed_and_a_kept_one_is_not(ctl):
    s = ctl.slice(2)
    step = pw.function(lambda st: {"w": st["w"] * 2, "rng": jax.random.split(st["rng"], 1)[0]},
                       slice=s, donate_argnums=0)
    mine = {"w": np.ones(4, np.float32), "rng": jax.random.key(4)}
    want = {"w": mine["w"], "rng": jax.random.key(4)}
    # the user's own key, uncommitted on device 0: moved onto the slice (the move reuses its
    # buffer on device 0), and the donation consumes it, as jax.jit's does (test_jit_donation)
    state = step(mine)
    for _ in range(3):
        state = step(state)
    for _ in range(4):
        want = {"w": want["w"] * 2, "rng": jax.random.split(want["rng"], 1)[0]}
    np.testing.assert_array_equal(np.asarray(state["w"].result()), want["w"])
    np.testing.assert_array_equal(key_data(state["rng"].result()), key_data(want["rng"]))
    assert mine["rng"].is_deleted()
    with jax.set_mesh(s.mesh):
        theirs = {"w": np.ones(4, np.float32), "rng": jax.random.key(4)}
        jax.jit(step.fn, donate_argnums=0)(theirs)
    assert theirs["rng"].is_deleted()


def test_a_typed_key_is_counted_at_its_key_datas_size(ctl):
    s = ctl.slice(2)
    keys = pw.function(lambda k: jax.random.split(k, 16), slice=s)(jax.random.key(0))
    keys.result()
    ctl.wait()
    per_device = {d.id: n for d, n in ctl.memory().items() if n}
    # 16 keys of 2 x uint32 (8 bytes each), replicated on both devices
    assert per_device == {d: 16 * 8 for d in s.device_ids}
    del keys
    assert not any(ctl.memory().values())


@pytest.mark.parametrize("dtype", ["float32", np.float32, np.dtype("int8")])
def test_numpy_dtypes_are_kept_as_numpy_dtypes(dtype):
    from pwkernel.runtime.dtypes import as_dtype, itemsize

    assert as_dtype(dtype) == np.dtype(dtype) and isinstance(as_dtype(dtype), np.dtype)
    assert itemsize(dtype) == np.dtype(dtype).itemsize


def test_jax_random_outside_a_function_names_the_fix_for_a_key_future(ctl):
    """``jax.random`` takes a typed key only as a ``jax.Array`` (a future is not one): given a
    key future outside a function, it says so and what to pass, instead of JAX's "invalid PRNG
    key data: expected key_data.ndim >= 1"; the two fixes it names give what JAX gives."""
    key = pw.function(jax.random.key, slice=ctl.slice(2))(3)
    for use in (jax.random.split, lambda k: jax.random.normal(k, (2,)),
                lambda k: jax.random.fold_in(k, 1), jax.random.key_data):
        with pytest.raises(TypeError, match=r"pw.Future.*key\.result\(\).*jax\.jit"):
            use(key)
    want = jax.random.split(jax.random.key(3))
    np.testing.assert_array_equal(key_data(jax.random.split(key.result())), key_data(want))
    np.testing.assert_array_equal(key_data(jax.jit(jax.random.split)(key)), key_data(want))
    assert key.ndim == 0 and np.ndim(key) == 0  # read elsewhere, ndim is the key's own


def test_device_get_copies_a_key_future_to_the_host_as_it_copies_the_key(ctl):
    """``jax.device_get(tree)`` (the host copy the README names for a tree of futures) takes a
    typed key future, alone or in a tree, as it takes the key: a key on the host."""
    s = ctl.slice(2)
    state = pw.function(lambda k: {"key": jax.random.key(k), "w": jax.numpy.ones(2)}, slice=s)(5)
    got, want = jax.device_get(state), jax.device_get({"key": jax.random.key(5)})
    assert type(got["key"]) is type(want["key"]) and got["key"].dtype == want["key"].dtype
    np.testing.assert_array_equal(key_data(got["key"]), key_data(want["key"]))
    assert isinstance(got["w"], np.ndarray)
    alone = jax.device_get(state["key"])
    np.testing.assert_array_equal(key_data(alone), key_data(want["key"]))
    with pytest.raises(TypeError, match="PRNGKey dtype cannot be converted"):
        np.asarray(state["key"])  # as np.asarray(key) raises for the jax.Array

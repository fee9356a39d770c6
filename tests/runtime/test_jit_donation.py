"""Donation as ``jax.jit`` does it, where the call has to move the donated array first."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw


def _jit_deletes(fn, mesh, make) -> bool:
    """Whether plain jax.jit(fn, donate_argnums=0) under ``mesh`` deletes its argument."""
    x = make()
    with warnings.catch_warnings(), jax.set_mesh(mesh):
        warnings.simplefilter("ignore")  # (JAX warns of donations no output can take)
        jax.block_until_ready(jax.jit(fn, donate_argnums=0)(x))
    return x.is_deleted()


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_donated_array_the_call_moves_is_consumed_as_jax_jit_consumes_it(ctl, dispatch):
    """An uncommitted array (``jnp.arange``, on the default device) donated to a call on a
    slice of several devices is moved there first; jax.jit's move reuses its buffer where a
    slice device holds the same block, and the donation then consumes it: the caller's array
    is deleted, as under jax.jit. Where no block is reused (a slice on other devices, a
    sharded layout), or no output can take the buffer, or nothing is donated, it stays."""
    fns = {"kept": lambda a: a + 1, "unusable": lambda a: a.sum()}
    cases = [(ctl.slice(n, island=i), name, spec)
             for n, i in ((2, 0), (4, 0), (2, 1)) for name in fns for spec in (None, P("x"))]
    for s, name, spec in cases:
        fn = fns[name]
        want = _jit_deletes(fn, s.mesh, lambda: jnp.arange(8.0)) if spec is None else False
        x = jnp.arange(8.0)
        assert not x.committed
        f = pw.function(fn, slice=s, donate_argnums=0, in_specs=spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = f(x, dispatch=dispatch).result(60)
        assert np.asarray(got).tolist() == np.asarray(fn(np.arange(8.0))).tolist()
        assert x.is_deleted() == want, (s, name, spec, want)
        if x.is_deleted():
            with pytest.raises(RuntimeError, match="deleted"):
                f(x, dispatch=dispatch).result(60)
        y = jnp.arange(8.0)
        pw.function(fn, slice=s)(y, dispatch=dispatch).result(60)
        assert not y.is_deleted()  # not donated: never the runtime's to free
    # the cases above include both outcomes
    s2 = ctl.slice(2, island=0)
    assert _jit_deletes(fns["kept"], s2.mesh, lambda: jnp.arange(8.0))
    assert not _jit_deletes(fns["kept"], ctl.slice(2, island=1).mesh, lambda: jnp.arange(8.0))


def test_a_moved_argument_another_call_of_the_program_reads_is_left(ctl):
    """In a program that also reads the argument elsewhere, the donating call consumes its
    own copy only: the caller's array stays (another node may still need it)."""
    s = ctl.slice(2, island=0)
    eat = pw.function(lambda a: a + 1, slice=s, donate_argnums=0)
    read = pw.function(lambda a: a * 2, slice=ctl.slice(1, island=0))

    @pw.program
    def both(v):
        return eat(v), read(v)

    x = jnp.arange(8.0)
    a, b = both(x)
    assert a.result(60).tolist() == list(range(1, 9)) and b.result(60)[1] == 2.0
    assert not x.is_deleted()
    z = jax.device_put(jnp.arange(8.0), NamedSharding(s.mesh, P()))  # on the slice: no move
    eat(z).result(60)
    assert z.is_deleted()


def test_a_donated_tree_that_holds_one_array_twice_names_both_places(ctl):
    """optax.lookahead's ``LookaheadParams.init_synced`` puts the same arrays in ``fast`` and
    ``slow``: a step donating them would hand XLA one buffer twice (plain jax.jit crashes the
    process on CPU). The call is refused with both places in the arguments and the fix, and
    the fix trains as a plain loop on copies does."""
    import optax
    s = ctl.slice(2, island=0)
    opt = optax.lookahead(optax.adam(1e-2), sync_period=2, slow_step_size=0.5)

    def step(params, opt_state):
        grads = jax.tree.map(lambda w: 2 * w, params.fast)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def fresh():
        with jax.set_mesh(s.mesh):
            w = jax.device_put({"w": jnp.arange(4.0)}, NamedSharding(s.mesh, P()))
        return optax.LookaheadParams.init_synced(w)

    f = pw.function(step, slice=s, donate_argnums=(0, 1))
    params = fresh()
    with pytest.raises(RuntimeError, match=r"step donates input 0 and also reads the same "
                       r"array as input 1 \(one array at params\.fast\['w'\] and at "
                       r"params\.slow\['w'\]: .*jax\.tree\.map\(jnp\.copy, tree\)\)") as info:
        f(params, opt.init(params))[0].fast["w"].result(60)
    assert isinstance(info.value, pw.ProgramError)
    assert not params.fast["w"].is_deleted()  # refused before anything was consumed
    copied = jax.tree.map(jnp.copy, params)  # as the error says
    state = (copied, opt.init(copied))
    plain = jax.tree.map(np.copy, (params, opt.init(params)))
    for _ in range(3):
        state = f(*state)
        plain = jax.jit(step)(*plain)
    np.testing.assert_allclose(np.asarray(state[0].slow["w"].result(60)),
                               np.asarray(plain[0].slow["w"]), rtol=1e-6)

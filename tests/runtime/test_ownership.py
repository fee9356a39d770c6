"""What the user gave the runtime stays the user's: no array or future anyone can still read is
ever freed by a program (JAX's ``device_put`` hands back the source's own buffer where a device
holds the same block in both layouts, even with ``may_alias=False``: the runtime copies there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw


@pytest.fixture(scope="module")
def shared_ctl():
    """One controller for the property test's examples (a fresh one each would dominate)."""
    controller = pw.Controller(islands=(4, 4))
    try:
        yield controller
    finally:
        controller.close()


def _alive(*arrays) -> None:
    for a in arrays:
        value = a.result(60) if isinstance(a, pw.Future) else a
        np.asarray(value)  # raises "Array has been deleted" if a program freed it


def test_users_single_device_array_survives_a_replicated_input(ctl):
    s = ctl.slice(4, island=0)
    double = pw.function(lambda x: x * 2, slice=s, in_specs=P(), out_specs=P())
    x = jax.device_put(jnp.arange(8.0), ctl.islands[0].devices[0])
    y = double(x)
    np.testing.assert_allclose(np.asarray(y.result(60)), np.arange(8.0) * 2)
    _alive(x)
    np.testing.assert_allclose(np.asarray(x), np.arange(8.0))


def _one_then_two(ctl):
    """``make`` on device 0 alone, ``use`` replicated on devices 0 and 3."""
    devices = ctl.islands[0].devices
    one = ctl.slice(1, devices=[devices[0].id])
    both = ctl.slice(2, devices=[devices[0].id, devices[3].id])
    return (pw.function(lambda x: x + 1, slice=one, in_specs=P(), out_specs=P()),
            pw.function(lambda x: x * 3, slice=both, in_specs=P(), out_specs=P()))


def test_future_on_one_device_read_replicated_later(ctl):
    make, use = _one_then_two(ctl)
    y = make(np.ones(4, np.float32))
    z = use(y)
    z.result(60)
    _alive(y, z)
    np.testing.assert_allclose(np.asarray(y.result()), 2.0)


def test_programs_own_output_read_replicated_by_another_node(ctl):
    make, use = _one_then_two(ctl)

    @pw.program
    def f(v):
        y = make(v)
        return y, use(y)

    y, z = f(np.ones(4, np.float32))
    z.result(60)
    _alive(y, z)


_SLICES = [(0,), (3,), (0, 3), (0, 1), (0, 1, 2, 3), (1, 2), (2, 3)]
_SPECS = [P(), P("x")]


@settings(max_examples=25, deadline=None)
@given(src=st.sampled_from(_SLICES), dst=st.sampled_from(_SLICES),
       sspec=st.sampled_from(_SPECS), dspec=st.sampled_from(_SPECS),
       user=st.booleans())
def test_no_readable_buffer_is_freed(shared_ctl, src, dst, sspec, dspec, user):
    """Random slice pairs, specs and placements: the source (a future or the user's own array)
    is still readable after a program read it in another layout, and so is the result."""
    ctl = shared_ctl
    ids = [d.id for d in ctl.islands[0].devices]
    s_src = ctl.slice(len(src), devices=[ids[i] for i in src])
    s_dst = ctl.slice(len(dst), devices=[ids[i] for i in dst])
    host = np.arange(8.0, dtype=np.float32)
    if user:
        source = jax.device_put(host, NamedSharding(s_src.mesh, sspec))
    else:
        source = pw.function(lambda x: x + 0, slice=s_src, in_specs=sspec,
                             out_specs=sspec)(host)
    out = pw.function(lambda x: x * 2, slice=s_dst, in_specs=dspec, out_specs=dspec)(source)
    np.testing.assert_allclose(np.asarray(out.result(60)), host * 2)
    _alive(source)
    np.testing.assert_allclose(np.asarray(source if user else source.result()), host)
    s_src.release()
    s_dst.release()


def test_a_program_that_returns_its_argument_returns_a_new_array(ctl):
    """``jax.jit(lambda x: (f(x), x))`` returns a new array for ``x``: donating it later leaves
    the caller's array (or future) alone. A program returns its argument the same way: the
    user's array, and a future given to it, survive a donating call on what it returned."""
    s = ctl.slice(2)
    double = pw.function(lambda x: x * 2, slice=s)
    eat = pw.function(lambda x: x + 1, slice=s, donate_argnums=0)

    @pw.program
    def also_returns_its_argument(v):
        return double(v), v

    mine = jax.device_put(np.ones(4, np.float32), NamedSharding(s.mesh, P()))
    made = double(np.ones(4, np.float32))
    for arg in (mine, made):
        _, back = also_returns_its_argument(arg)
        assert back is not arg
        assert (back.shape, back.dtype) == (arg.shape, arg.dtype)
        assert back.sharding.is_equivalent_to(arg.sharding, 1)
        assert eat(back).result(60).tolist() == [3.0 if arg is made else 2.0] * 4
        _alive(arg)
    assert np.asarray(mine).tolist() == [1.0] * 4 and made.result(60).tolist() == [2.0] * 4

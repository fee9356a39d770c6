"""``transfer.copy_onto``: a copy between two layouts never waits for its source.

JAX's ``device_put`` from replicated to sharded on the same devices reads the value first, so
a copy the runtime started behind a running computation held the thread that started it
until that computation ended. ``copy_onto`` queues such a copy behind its source instead.
The source here is a computation held by a host callback until the test releases it; a
timer releases it after a minute at the latest, so the old behaviour fails rather than hangs.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pwkernel.runtime.transfer import copy_onto


@pytest.fixture
def mesh():
    return jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])


def held_replicated(mesh, release: threading.Event):
    """A replicated value on ``mesh`` that is computed only once ``release`` is set."""
    def hold(v):
        release.wait(60)
        return v

    return jax.jit(lambda x: jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                   out_shardings=NamedSharding(mesh, P()))


@pytest.mark.parametrize("spec", [P("x"), P(None, "x")])
def test_a_copy_onto_another_layout_of_the_same_devices_does_not_wait_for_its_source(
        mesh, spec):
    release = threading.Event()
    make = held_replicated(mesh, release)
    host = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    release.set()
    jax.block_until_ready(copy_onto(make(host), NamedSharding(mesh, spec)))  # compiled
    release.clear()
    valve = threading.Timer(60, release.set)  # (bounds the old behaviour's wait)
    valve.start()
    try:
        source = make(host)
        out = copy_onto(source, NamedSharding(mesh, spec))
        assert not release.is_set() and not source.is_ready()  # returned before its source
        release.set()
        np.testing.assert_array_equal(np.asarray(out), host)
        assert out.sharding == NamedSharding(mesh, spec)
        assert not source.is_deleted()  # a new buffer: the source stays its owner's
        theirs = {s.data.unsafe_buffer_pointer() for s in source.addressable_shards}
        assert not theirs & {s.data.unsafe_buffer_pointer() for s in out.addressable_shards}
    finally:
        release.set()
        valve.cancel()


def test_other_copies_are_jax_device_put(mesh):
    host = np.arange(8.0, dtype=np.float32)
    ready = jax.device_put(host, NamedSharding(mesh, P()))
    for target in (NamedSharding(mesh, P("x")), NamedSharding(jax.make_mesh(
            (2,), ("x",), devices=jax.devices()[2:4]), P("x"))):
        out = copy_onto(ready, target)
        np.testing.assert_array_equal(np.asarray(out), host)
        assert out.sharding == target and not ready.is_deleted()


def test_a_copy_from_the_same_devices_in_another_order_is_made(mesh):
    # (the compiled identity has one device assignment: a source meshed over the devices in
    # another order cannot be its argument, and JAX refused it as "incompatible devices")
    host = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    flipped = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2][::-1])
    source = jax.device_put(host, NamedSharding(flipped, P("x")))
    for spec in (P(), P("x"), P(None, "x")):
        out = copy_onto(source, NamedSharding(mesh, spec))
        np.testing.assert_array_equal(np.asarray(out), host)
        assert out.sharding == NamedSharding(mesh, spec) and not source.is_deleted()

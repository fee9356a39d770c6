"""``runtime.objects.ObjectStore``: the bytes each live buffer holds per device and who owns it,
freed when the last reference to its future goes (or at ``close()``), and a value handed to
the user never deleted. Through the store's public methods only (``add``, ``fetch``,
``memory``, ``records``, ``live``, ``close``), on real ``jax.Array``s of the virtual CPU
devices."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime.objects import BufferRecord, ObjectStore


def on_two_devices(spec: P, first: int = 0) -> NamedSharding:
    devices = jax.devices()[first:first + 2]
    return NamedSharding(Mesh(np.array(devices), ("x",)), spec)


def placed(sharding: NamedSharding, n: int = 8, fill: float = 1.0):
    """A float32 vector of ``n`` on ``sharding``, with the Future that stands for it."""
    value = jax.device_put(np.full(n, fill, np.float32), sharding)
    return pw.Future((n,), np.float32, sharding), value


def test_bytes_per_device_follow_the_sharding():
    store = ObjectStore()
    sharded, value_s = placed(on_two_devices(P("x")))      # (8,) f32 split over 2: 16 B each
    replicated, value_r = placed(on_two_devices(P()))       # a whole copy on each: 32 B
    other, value_o = placed(on_two_devices(P("x"), first=4))
    for fut, value in ((sharded, value_s), (replicated, value_r), (other, value_o)):
        store.add(fut, value)
    assert [r.nbytes for r in store.records()] == [{0: 16, 1: 16}, {0: 32, 1: 32},
                                                   {4: 16, 5: 16}]
    assert store.memory() == {0: 48, 1: 48, 4: 16, 5: 16}  # devices holding nothing: omitted
    # bytes the caller already knows are taken as given; no sharding, no bytes
    given = pw.Future((8,), np.float32, on_two_devices(P("x")))
    store.add(given, value_s, nbytes={0: 100})
    bare = pw.Future((8,), np.float32)
    store.add(bare, np.ones(8, np.float32))
    assert [r.nbytes for r in store.records()][-2:] == [{0: 100}, {}]
    assert store.memory() == {0: 148, 1: 48, 4: 16, 5: 16}


def test_a_buffer_is_freed_when_the_last_reference_to_its_future_goes():
    freed: list[BufferRecord] = []
    store = ObjectStore(freed.append)
    kept, value_k = placed(on_two_devices(P("x")), fill=2.0)
    gone, value_g = placed(on_two_devices(P()))
    store.add(kept, value_k)
    store.add(gone, value_g)
    also = gone  # a second reference (a consumer not yet run) keeps it alive
    del gone
    gc.collect()
    assert not freed and store.memory() == {0: 48, 1: 48}
    del also
    gc.collect()
    assert [r.nbytes for r in freed] == [{0: 32, 1: 32}] and value_g.is_deleted()
    assert store.memory() == {0: 16, 1: 16} and len(store.records()) == 1
    assert not value_k.is_deleted() and np.asarray(value_k).tolist() == [2.0] * 8
    assert [fut for _, fut in store.live()] == [kept]


def test_a_buffer_counts_until_on_free_has_returned():
    # The schedulers get their memory back in on_free: until then memory() still counts it,
    # so memory() == 0 means every scheduler has been told.
    seen: list[dict[int, int]] = []
    store = ObjectStore(lambda record: seen.append(store.memory()))
    fut, value = placed(on_two_devices(P("x")))
    store.add(fut, value, reserved=True)
    del fut  # the store holds only a weak reference
    gc.collect()
    assert seen == [{0: 16, 1: 16}] and store.memory() == {} and store.records() == []


def test_a_value_handed_to_the_user_is_never_deleted():
    store = ObjectStore()
    fut, value = placed(on_two_devices(P("x")), fill=3.0)
    buf = store.add(fut, value)
    assert store.fetch(fut, buf) is value  # no fetch hook: the stored array itself
    del fut  # the store holds only a weak reference
    gc.collect()
    assert store.memory() == {} and not value.is_deleted()
    assert np.asarray(value).tolist() == [3.0] * 8


def test_a_fetch_that_copies_leaves_the_original_to_the_store():
    copies = []

    def fetch(value, sharding):
        out = jnp.array(value, copy=True)
        copies.append(out)
        return out

    store = ObjectStore(fetch=fetch)
    fut, value = placed(on_two_devices(P("x")), fill=4.0)
    buf = store.add(fut, value)
    got = store.fetch(fut, buf)
    assert got is copies[0] and got is not value
    del fut  # the store holds only a weak reference
    gc.collect()
    assert value.is_deleted() and np.asarray(got).tolist() == [4.0] * 8
    # a hook that hands back the value itself (already local) exports it: never deleted
    same = ObjectStore(fetch=lambda value, sharding: value)
    fut, value = placed(on_two_devices(P()))
    assert same.fetch(fut, same.add(fut, value)) is value
    del fut  # the store holds only a weak reference
    gc.collect()
    assert not value.is_deleted()


def test_ownership_labels_come_from_the_program_run(ctl):
    s = ctl.slice(2, island=1)
    f = pw.function(lambda x: x * 2, slice=s, name="f")
    with ctl.client("alice"):
        out = pw.program(lambda v: f(v), name="double")(np.ones(4, np.float32))
    out.result(timeout=60)
    store = ObjectStore()
    sharding = on_two_devices(P("x"), first=4)
    owned = pw.Future((8,), np.float32, sharding, island=1, run=out.run)
    store.add(owned, jax.device_put(np.ones(8, np.float32), sharding), reserved=True)
    orphan, value = placed(on_two_devices(P("x")))
    store.add(orphan, value)
    assert store.records() == [
        BufferRecord({4: 16, 5: 16}, "double", out.run.id, "alice", 1, True),
        BufferRecord({0: 16, 1: 16}, "", -1, "default", None, False)]
    assert [(r.program, fut) for r, fut in store.live()] == [("double", owned), ("", orphan)]
    # the controller's own store labels the program's output the same way
    (record,) = [r for r in ctl.store.records() if r.program == "double"]
    assert (record.client, record.island, record.nbytes) == ("alice", 1, {4: 16, 5: 16})


def test_close_frees_every_buffer_once_and_the_users_values_stay():
    freed: list[BufferRecord] = []
    store = ObjectStore(freed.append)
    held, value_h = placed(on_two_devices(P("x")))
    taken, value_t = placed(on_two_devices(P()), fill=5.0)
    store.add(held, value_h)
    store.fetch(taken, store.add(taken, value_t))
    store.close()
    assert store.closed and len(freed) == 2 and store.memory() == {} and store.records() == []
    assert value_h.is_deleted() and not value_t.is_deleted()
    assert np.asarray(value_t).tolist() == [5.0] * 8
    del held, taken
    gc.collect()
    assert len(freed) == 2  # the futures going later frees nothing twice

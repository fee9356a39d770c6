"""Checkpointing with orbax (``orbax-checkpoint``): a training state saved as
``pw.train.fetch(state)`` (its ``jax.Array``s, shard by shard, with their shardings),
restored with a target onto the slices or without one (a dict), and training resumed with the
losses of going on; an async ``CheckpointManager`` saving while the next step donates."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.train import transformer as T

ocp = pytest.importorskip("orbax.checkpoint")

CFG = T.Config(vocab=32, width=16, heads=2, layers=2, seq=8)
BATCHES = [T.batch(CFG, 8, seed=i) for i in range(4)]


def abstract(tree):
    """The restore target: each future's shape, dtype and sharding (known without waiting)."""
    return jax.tree.map(lambda f: jax.ShapeDtypeStruct(f.shape, f.dtype, sharding=f.sharding),
                        tree)


def make(tctl, kind):
    opt = optax.adam(1e-2)
    if kind == "pipeline":
        return pw.train.Pipeline(T.split(CFG, 2), [tctl.slice(2, island=0),
                                                   tctl.slice(2, island=1)],
                                 loss=T.cross_entropy, optimizer=opt, microbatches=2,
                                 name="orbaxpipe")
    return pw.train.SPMD(T.split(CFG, 2), tctl.slice(4, island=0), loss=T.cross_entropy,
                         optimizer=opt, packed=kind == "packed", name=f"orbax{kind}")


def losses_from(trainer, state, batches):
    out = []
    for batch in batches:
        state, loss = trainer.step(state, batch)
        out.append(float(loss))
    return out


@pytest.mark.parametrize("target", [True, False])
@pytest.mark.parametrize("kind", ["spmd", "packed", "pipeline"])
def test_a_state_saved_with_orbax_resumes_with_the_losses_of_going_on(tctl, tmp_path, kind,
                                                                      target):
    """``StandardCheckpointer().save(path, pw.train.fetch(state))``, then ``restore`` with a
    target (the live state's shapes and shardings: a ``TrainState`` back, each leaf on its
    stage's slice) or without one (orbax's dict: ``params``, ``opt_state``, optax's states as
    dicts) resumes with the losses of training on. Before, ``step`` refused orbax's dict
    ("got dict"), and ``TrainState(**restored)`` as another model's state."""
    trainer = make(tctl, kind)
    state, _ = trainer.step(trainer.init(0), BATCHES[0])
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", pw.train.fetch(state))
        going_on = losses_from(trainer, state, BATCHES[1:])  # (donates the saved buffers)
        ckptr.wait_until_finished()
        like = trainer.init(0)
        restored = ckptr.restore(tmp_path / "ckpt", abstract(pw.train.fetch(like)) if target
                                 else None)
    if target:
        assert isinstance(restored, pw.train.TrainState)
        for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(pw.train.fetch(like)),
                             strict=True):
            assert got.sharding == want.sharding
    else:
        assert isinstance(restored, dict) and set(restored) == {"params", "opt_state"}
    assert losses_from(trainer, restored, BATCHES[1:]) == going_on


def test_a_state_restored_as_dicts_and_wrapped_says_to_pass_the_dict(tctl, tmp_path):
    """``TrainState(**restored)`` of orbax's dict holds init's leaves in dicts where optax has
    named tuples: the step's check refuses it, now saying so and what to pass (before, it
    named the same leaves twice, as another model's state)."""
    trainer = make(tctl, "spmd")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", pw.train.fetch(trainer.init(0)))
        ckptr.wait_until_finished()
        restored = ckptr.restore(tmp_path / "ckpt")
    with pytest.raises(Exception, match="pass the restored dict to step"):
        trainer.step(pw.train.TrainState(**restored), BATCHES[0])


def test_an_async_manager_saves_a_sharded_state_while_the_next_step_donates_it(tctl,
                                                                               tmp_path):
    """A hand-written state of ``pw.function`` futures, sharded ``P('x')`` on 4 devices,
    saved every step by an async ``CheckpointManager`` (``max_to_keep=2``) while the next
    step donates it: orbax copies the shards to the host before ``save`` returns, so every
    checkpoint holds its step's values (none read a deleted buffer); the latest restores onto
    the slice's mesh with the saved shardings, and steps on with the values of going on; no
    thread is left once the manager is closed."""
    s = tctl.slice(4, island=0)
    specs = {"w": P("x"), "step": P()}
    init = pw.function(lambda: {"w": jnp.ones((4096,), jnp.float32),
                                "step": jnp.zeros((), jnp.int32)}, slice=s, out_specs=specs)
    step = pw.function(lambda st: {"w": st["w"] * 2.0 + 1.0, "step": st["step"] + 1},
                       slice=s, in_specs=(specs,), out_specs=specs, donate_argnums=0)
    threads = set(threading.enumerate())
    state = init()
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path, options=options) as mgr:
        for i in range(4):
            state = step(state)
            mgr.save(i, args=ocp.args.StandardSave(pw.train.fetch(state)))
        going_on = jax.device_get(pw.train.fetch(step(state)))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2, 3]
        target = abstract(init())
        saved = {n: mgr.restore(n, args=ocp.args.StandardRestore(target)) for n in (2, 3)}
        latest = mgr.latest_step()
    # (orbax keeps event-loop threads of its own, asyncio_N, for the process once it has
    # made them: which test makes them first depends on the order tests run in)
    left = {t for t in set(threading.enumerate()) - threads if not t.name.startswith("asyncio_")}
    assert not left, left
    for n, value in saved.items():  # w: 1 -> 3 -> 7 -> 15 -> 31 after steps 0..3
        np.testing.assert_array_equal(np.asarray(value["w"]), np.full(4096, 2.0 ** (n + 2) - 1))
        assert int(value["step"]) == n + 1
        assert value["w"].sharding == target["w"].sharding
    resumed = jax.device_get(pw.train.fetch(step(saved[latest])))
    np.testing.assert_array_equal(resumed["w"], going_on["w"])
    assert resumed["step"] == going_on["step"]

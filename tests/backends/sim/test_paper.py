"""The paper's dispatch micro-benchmark on the simulator: small cases checked by hand.

Fixed control-plane costs (the order of the fit's, not the fit itself, so each case can be
worked out on paper): the client's per program 1310 us and 69.4 us per host it reaches; the
assumed costs of ``paper_dispatch.ASSUMED`` (nothing per node on the client, 1 us per host
and computation on the island's scheduler, JAX's dispatch 30 us per call and host).
"""

from __future__ import annotations

import pytest

from pwkernel.backends.sim import SimError
from pwkernel.backends.sim import paper_dispatch as pd
from pwkernel.backends.sim import paper_workloads as pwl
from pwkernel.bench.sim_paper import PIPELINE

US = 1e-6
P = {"client_per_program": 1310 * US, "program_fanout_per_host": 69.4 * US}


def test_the_counts_pick_the_hardware_a_v3_host_has_8_cores_a_v4_host_4():
    assert pd.HARDWARE == {16: "tpu-v3", 512: "tpu-v4"} and pd.SWEEP_HARDWARE == "tpu-v3"
    v3 = pd.pathways_cluster(P, 32, "tpu-v3")
    # 128 v3 chips: a 2-D torus 16 x 8; a scalar all-reduce goes round both rings twice:
    # 2 x (15 + 7) hops of 1 us, plus the 2 us launch (4 bytes over the links: ~0).
    assert v3.ici.torus == (16, 8)
    assert pd.tiny_op_seconds(v3, 128) == pytest.approx(46 * US, rel=1e-4)
    v4 = pd.pathways_cluster(P, 32, "tpu-v4")  # 3-D, 8 x 4 x 4: 2 x 13 hops + 2
    assert pd.tiny_op_seconds(v4, 128) == pytest.approx(28 * US, rel=1e-4)


def test_a_chained_program_pays_the_client_once_and_beats_jax_op_by_op_on_few_hosts():
    r = pd.rates(P, 2, programs=12)
    # per node: the client's (1310 + 2 x 69.4) / 128 nodes = 11.3 us is the slowest stage
    # (device 10 us, hosts 10 us, scheduler 2 us); JAX OpByOp: its 30 us dispatch per call.
    assert 1 / r.pw_chained == pytest.approx((1310 + 2 * 69.4) / 128 * US, rel=0.02)
    assert 1 / r.jax_opbyop == pytest.approx(30 * US, rel=0.02)
    assert r.pw_chained > 2.5 * r.jax_opbyop


def test_on_many_hosts_the_schedulers_fan_out_bounds_chained_but_not_fused():
    r = pd.rates(P, 128, programs=12)
    # 128 hosts: the scheduler sends each node's launch to 128 hosts at 1 us: 128 us per
    # node, above the device's 94 us (2 x (31 + 15) hops + 2 on a 32 x 16 torus) and the
    # client's (1310 + 128 x 69.4) / 128 = 79.6 us.
    assert 1 / r.pw_chained == pytest.approx(128 * US, rel=0.02)
    assert 1 / r.jax_opbyop == pytest.approx(94 * US, rel=0.02)
    # Fused: one program of 128 x 94 us = 12.0 ms, longer than the client's 10.2 ms for it:
    # device-bound, as JAX Fused.
    assert r.pw_fused == pytest.approx(r.jax_fused, rel=0.02)
    assert r.pw_chained < pd.MATCH * r.jax_opbyop


def test_an_assumption_changed_reaches_every_cluster_and_an_unknown_one_is_refused():
    changed = {"scheduler_per_host": 2 * US, "jax_dispatch": 50 * US, "chain": 4}
    assert pd.pathways_cluster(P, 2, "tpu-v3", changed).host.scheduler_per_host == 2 * US
    assert pd.jax_cluster(2, "tpu-v3", changed).host.client_per_node == 50 * US
    r = pd.rates(P, 2, programs=12, assumed=changed)
    # JAX: 50 us per call; Pathways Chained: programs of 4 nodes, the client's
    # (1310 + 2 x 69.4) / 4 = 362 us per node
    assert 1 / r.jax_opbyop == pytest.approx(50 * US, rel=0.02)
    assert 1 / r.pw_chained == pytest.approx((1310 + 2 * 69.4) / 4 * US, rel=0.02)
    assert pd.ASSUMED["scheduler_per_host"][0] == 1 * US and pd.CHAIN == 128  # untouched
    with pytest.raises(SimError, match="no assumption .'not_a_cost'.*Maybe you want"):
        pd.what_if(programs=4, not_a_cost=1.0)


def test_up_to_is_the_first_unbroken_run_where_it_holds():
    def answers(*seq):
        it = iter(seq)
        return lambda rates: next(it)

    hosts = (2, 4, 8, 16)
    # not yet at 2, holds at 4, misses at 8: "up to 4", whatever 16 does
    assert pd.crossover(P, answers(False, True, False, True), hosts, programs=4) == 4
    assert pd.crossover(P, answers(True, True, True, True), hosts, programs=4) == 16
    assert pd.crossover(P, answers(False, False, False, False), hosts, programs=4) == 0


# --- pipelining a 3B decoder: training steps on 64 TPU v3 chips (the paper's 128 cores) ------
def test_a_layers_flops_are_what_xla_counts_forward_and_for_training():
    import jax
    import jax.numpy as jnp

    from pwkernel.backends.sim import Cluster, estimate

    d, h, s, b = 512, 4, 256, 4  # a small layer; head dimension 128 as the 3B's
    m = {"d_model": d, "heads": h, "seq": s}

    def layer(x, wqkv, wo, w1, w2):
        split = [t.reshape(b, s, h, d // h) for t in jnp.split(x @ wqkv, 3, axis=-1)]
        scores = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", split[0], split[1]), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", scores, split[2]).reshape(b, s, d) @ wo
        return x + jax.nn.gelu(x @ w1) @ w2

    def loss(*args):  # not linear in the output, so no product is left out of the gradient
        return jnp.square(layer(*args).astype(jnp.float32)).sum()

    shapes = [(b, s, d), (d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
    args = [jax.ShapeDtypeStruct(x, jnp.bfloat16) for x in shapes]
    v3 = Cluster.preset("tpu-v3", chips=4)
    forward = estimate(layer, *args, cluster=v3).flops
    training = estimate(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), *args, cluster=v3).flops
    # XLA adds the elementwise work (softmax, gelu, the residuals): under 1 %
    assert forward == pytest.approx(pwl.layer_flops(m, b * s), rel=0.01)
    assert training == pytest.approx(3 * pwl.layer_flops(m, b * s), rel=0.01)


def test_the_spmd_steps_collectives_are_the_2d_splits_per_layer_all_gathers_and_reduce_scatters():
    cluster = pwl.pipeline_cluster(P)
    assert cluster.num_chips == 64 and cluster.ici.torus == (8, 8)
    parts = pwl.spmd_parts(cluster, pwl.MODEL["3b"])
    # a group of 8 chips is one ring of the 8 x 8 torus: 2 x 100 GB/s per chip, 7 hops of 1 us
    ring = lambda nbytes: 7 / 8 * nbytes / 200e9 + 7 * US   # noqa: E731
    act = 512 * 1024 / 8 * 2816 * 2       # a block's input, whole, for one data row: 369 MB
    w = 12 * 2816**2 / 8                  # a layer's weights on one model column
    per_layer = 8 * ring(act) + 2 * ring(2 * w) + ring(4 * w)  # +2 weight gathers, 1 f32 RS
    assert parts["collectives"] == pytest.approx(32 * per_layer, rel=1e-6)   # 429 ms
    # compute: 3 x 32 layers x (24 d^2 + 4 seq d) per token, the batch over 64 chips at peak
    flops = 3 * 32 * (24 * 2816**2 + 4 * 1024 * 2816) * 512 * 1024 / 64
    assert parts["compute"] == pytest.approx(flops / 123e12, rel=1e-9)       # 1.29 s
    # compute-bound (HBM below the matrix units), the update memory-bound
    assert parts["forward"] + parts["backward"] == pytest.approx(
        parts["compute"] + parts["collectives"] + 4 * US, rel=1e-9)
    assert parts["update"] == pytest.approx(12 * 32 * 2816**2 / 64 * 20 / 900e9 + 2 * US)
    assert parts["collectives"] / parts["compute"] == pytest.approx(0.33, abs=0.01)


def test_a_gpipe_step_is_its_bubble_then_the_first_stages_all_reduce_and_update():
    for stages in (4, 16):
        micro = 4 * stages
        parts = pwl.gpipe_parts(pwl.pipeline_cluster(P), pwl.MODEL["3b"], stages, micro)
        assert parts["backward"] == pytest.approx(2 * parts["forward"], rel=0.01)
        # every stage busy for M microbatches of forward and backward, idle for S - 1 of
        # them (the bubble); stage 0 ends last and then reduces and applies its gradients;
        # on the way, S - 1 transfers each way (a microbatch's activations over the stage's
        # chips' links, 100 GB/s each, 1 us) ...
        bubble = (micro + stages - 1) * (parts["forward"] + parts["backward"])
        hop = parts["activations"] / (64 // stages) / 100e9 + 1 * US
        rest = pwl.step_seconds(P, stages) - bubble - parts["all_reduce"] - parts["update"]
        # ... and the client's submission of the program: 1310 us + 16 hosts x 69.4 us
        assert 2.42e-3 < rest - 2 * (stages - 1) * hop < 2.6e-3


def test_the_pipelines_train_faster_than_spmd_within_ten_percent_of_the_paper():
    got = pwl.pipelining(P)
    for stages, paper in PIPELINE.items():
        assert got[stages] > 1, (stages, got)                          # the paper's sign
        assert got[stages] == pytest.approx(paper, rel=0.10), (stages, got)
    assert got[4] > got[8] > got[16]    # the bubble grows with the stages, as in the paper


def test_the_sign_rests_on_the_spmd_mesh_fully_sharded_data_parallel_spmd_beats_them():
    # no model axis: no per-layer activation collectives; 61 ms of weight gathers and
    # gradient reduce-scatters against a 19-23 % bubble
    got = pwl.pipelining(P, mesh=(64, 1))
    assert all(0.8 < r < 0.9 for r in got.values()), got
    with pytest.raises(SimError, match="must cover the island's 64 chips.*maybe you want"):
        pwl.pipelining(P, stages=(4,), mesh=(8, 4))


def test_equal_weights_are_one_client_each_and_share_the_chips_equally():
    # two weights alike were one client "w1" with all the device time: {'w1': 100.0}
    got = pwl.shares(P, weights=(1, 1, 2), programs=20)
    assert list(got) == ["w1", "w1#2", "w2"]
    assert got["w1"] == pytest.approx(25, abs=1) and got["w1#2"] == pytest.approx(25, abs=1)
    assert got["w2"] == pytest.approx(50, abs=1)
    assert list(pwl.shares(P, programs=20)) == ["w1", "w2", "w4", "w8"]  # the table's names

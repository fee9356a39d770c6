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

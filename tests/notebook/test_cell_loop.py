"""A cell run again and again (Shift+Enter held down, ``run_cell`` in a loop) keeps nothing per
run: the bookkeeping of each run goes once the next run replaced its names."""

from __future__ import annotations

import gc

from pwkernel.runtime import plan
from pwkernel.runtime.clients import ESTIMATES, ClientAccount, ClientLedger
from tests.helpers.shell import run

STEP = ("%%pathways --slice s\nloss, g = jax.value_and_grad(loss_fn)(w, x)\n"
        "w = w - 0.01 * g\n")


def test_the_same_step_cell_run_again_keeps_no_cost_key_per_run(ip):
    run(ip, "%pathways slice s 2")
    run(ip, "w = jnp.ones((8, 8)); x = jnp.ones((4, 8))")
    run(ip, "def loss_fn(w, x):\n    return jnp.mean(jnp.tanh(x @ w) ** 2)\n")
    for _ in range(3):
        run(ip, STEP)
    ip.user_ns["w"].result()
    gc.collect()
    before = plan.cost_keys_kept()
    for _ in range(20):
        run(ip, STEP)
    ip.user_ns["w"].result()
    gc.collect()
    assert plan.cost_keys_kept() <= before  # (each run is a new function: it was 20 more)


def test_the_share_policy_keeps_the_estimates_settled_last():
    ledger, client = ClientLedger(), ClientAccount()
    for key in range(ESTIMATES + 50):  # each run of a cell: a computation never seen before
        charged, guessed = ledger.charge(client, key, 2, 1.0)
        ledger.settle(client, key, 0.5, charged, guessed, 1.0)
    assert len(ledger.estimates) == ESTIMATES
    assert 0 not in ledger.estimates and ESTIMATES + 49 in ledger.estimates
    charged, guessed = ledger.charge(client, 60, 2, 1.0)  # a kept one, settled again:
    ledger.settle(client, 60, 1.5, charged, guessed, 1.0)  # it becomes the newest
    ledger.charge(client, "new", 2, 1.0)
    ledger.settle(client, "new", 0.5, 0.5, 0.5, 1.0)
    assert 60 in ledger.estimates and ledger.estimates[60] == 1.0  # mean of 0.5 and 1.5

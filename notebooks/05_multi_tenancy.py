# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 05 · Multi-tenancy: clients sharing an island
#
# **What the paper found.** Several clients can time-share one island. With four clients the
# aggregate throughput was at least that of a dedicated client, with no context-switch cost
# while everything fitted in memory, and a trace showed proportional-share interleaving at
# weights 1:2:4:8 (results as summarised from the paper, not read off its figures).
#
# Here: four client threads, each inside `ctl.client(name, weight=w)`, queue work on the same
# four devices, with `ctl.policy = "share"`.

# %%
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw

ctl = pw.controller()          # the process-wide controller the kernel hosts
ctl

# %%
import threading

from pwkernel.bench import multitenancy

quad = ctl.slice(min(4, len(ctl.islands[0].devices)), island=0)   # 4, or all island 0 has
fn = pw.function(multitenancy.work, slice=quad, in_specs=P(), out_specs=P(), name="tenant_step")
x0 = jax.device_put(multitenancy.matrix(65536 * 4), NamedSharding(quad.mesh, P()))
fn(x0).result()                              # compile before anyone measures
WEIGHTS, BACKLOG = (1, 2, 4, 8), 40

# %%
view = pw.ScheduleView(ctl, programs=["tenant_step"], color_by="client", window=1.0)
view

# %%
names = [f"c{i}-w{w}" for i, w in enumerate(WEIGHTS)]  # one name per client, even at equal weights
ctl.policy = "share"                         # (set here: the throughput cell below sets fifo)
start = ctl.trace.next_index
gate = threading.Barrier(len(WEIGHTS))
outs = {}

def client(name, weight):
    with ctl.client(name, weight=weight):
        gate.wait(30)                        # everyone queues at about the same moment
        outs[name] = [fn(x0) for _ in range(BACKLOG)]

threads = [threading.Thread(target=client, args=(n, w))
           for n, w in zip(names, WEIGHTS, strict=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
for futs in outs.values():
    for f in futs:
        f.result(timeout=120)
assert ctl.trace.wait_for(start + len(WEIGHTS) * BACKLOG, timeout=10)
view.update()
ran = [e for e in view.history if e.index >= start]
view.window.value = max(e.t_end for e in ran) - min(e.t_start for e in ran)
view.stop()

# %% [markdown]
# Device time per client, counted while every client still had work queued (until the first
# one ran dry): that is when proportional share applies.

# %%
from pwkernel.bench.multitenancy import backlogged_device_time

busy, _, _ = backlogged_device_time(ctl.trace.events(since=start), names)
total = sum(busy.values())
shares = {n: 100 * busy[n] / total for n in names}
targets = {n: 100 * w / sum(WEIGHTS) for n, w in zip(names, WEIGHTS, strict=True)}
error = max(abs(shares[n] - targets[n]) for n in names)
for n in names:
    print(f"{n}: {shares[n]:5.1f}% of device time (target {targets[n]:5.1f}%)")
print(f"largest gap: {error:.1f} percentage points")
weight = dict(zip(names, WEIGHTS, strict=True))
assert all(shares[a] < shares[b] for a in names for b in names
           if weight[a] < weight[b]), "more weight, more device time"
assert error < 10, f"shares should follow the weights ({error:.1f} points off)"

# %% [markdown]
# ## Aggregate throughput: one client vs several
#
# `pwkernel.bench.multitenancy.throughput` runs the same total work split over 1, 2 and 4
# client threads (each keeping a few programs in flight), interleaved in paired rounds. Each
# row prints the median rate over the rounds and its range, then the *paired* ratio: the
# median of the round-by-round ratios to the one-client run of the same round. Pairing
# cancels a round slowed by the rest of this shared machine, so the ratio need not equal
# the ratio of the two medians beside it.

# %%
ctl.policy = "fifo"
cfg = dict(multitenancy.CONFIGS["quick"], programs=12, rounds=3)
rows, four_vs_one = multitenancy.throughput(ctl, cfg)
for row in rows:
    rate = row["computations_per_s"]
    n = row["clients"]
    print(f"{n} client{'s' * (n != 1)}: median {rate['median']:.0f} computations/s "
          f"({rate['min']:.0f}-{rate['max']:.0f}); paired with one client {row['vs_single']:.2f}x")
assert four_vs_one > 0.6, f"sharing should cost little ({four_vs_one:.2f}x)"

# %% [markdown]
# ## What we measured here

# %%
print("shares at weights 1:2:4:8: " + " / ".join(f"{shares[n]:.1f}" for n in names) +
      " % (targets " + " / ".join(f"{targets[n]:.1f}" for n in names) + ")")
print(f"4 clients vs 1: {four_vs_one:.2f}x aggregate throughput, paired rounds (paper: at least 1)")

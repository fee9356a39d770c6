# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 07 · Scale out: islands on a Ray cluster
#
# **What the paper found.** Pathways keeps *one* controller however many islands it drives:
# islands are joined by the data-center network, the controller sends each island its part of a
# program, and bytes go island to island. Two islands of 1024 chips over DCN reached about 97%
# of one island's throughput. The paper also measured Ray itself as a dispatch substrate: about
# 10x more overhead per computation than Pathways. (Both figures as summarised from the paper.)
#
# Here the same programs run with each island in its own **process**: a Ray actor with its own
# JAX devices, on a Ray cluster (a local one on 127.0.0.1 in this notebook; `docs/ray.md` shows
# how to point it at a multi-machine GPU cluster). The controller stays in this kernel.

# %%
import statistics
import time

import numpy as np
import ray

import pwkernel as pw

# %%
# Run again, this cell would leave the controller it made before open, and with it that
# controller's island actors and the Ray cluster (the last controller to close stops it).
if isinstance(previous := globals().get("rctl"), pw.Controller):
    previous.close()
t = time.perf_counter()
rctl = pw.Controller(backend="ray", islands=(2, 2))   # starts a private local Ray cluster
print(f"started in {time.perf_counter() - t:.1f} s:", rctl)
for island in rctl.islands:
    print(" island", island.id, "->", island.actor)


# %% [markdown]
# ## The same program, islands in other processes
#
# The paper's Figure 2 again. Nothing in it changes: slices, compiled functions and the program
# are the same objects as with the local backend. The functions travel to the islands as
# serialized `jax.export` artifacts; values stay in the islands until `result()` fetches them.

# %%
from pwkernel.bench.figure2 import figure2  # the program of 00, on any controller

f_ray = figure2(rctl).f
y, z = f_ray(np.array([1.0, 2.0]))
print(y.result().tolist(), z.result().tolist())
assert y.result().tolist() == [3.0, 5.0] and z.result().tolist() == [2.0, 4.0]
moved = [e for e in rctl.trace.events() if e.kind == "transfer" and e.link == "dcn"]
print(len(moved), "transfers between islands, e.g.", moved[0].src, "->", moved[0].dst)
assert {(e.src, e.dst) for e in moved} == {(0, 1), (1, 0)}


# %% [markdown]
# ## Parallel vs sequential dispatch, where dispatch is expensive
#
# With islands in other processes, every message to an island is a remote call. Sequential
# dispatch waits for a node's result before it prepares and sends the next: one message per node,
# and a round trip to the controller between dependent nodes. Parallel dispatch sends each island
# all of a program's nodes in **one message**, ahead of the data, and the island waits for its
# inputs itself (a value from the other island is pushed to it, actor to actor). Each island actor
# counts the messages with work it received:

# %%
def messages(mode):
    rctl.dispatch = mode
    before = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
    y, z = f_ray(np.array([1.0, 2.0]))
    y.run.wait(60)
    after = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
    return [a["messages"] - b["messages"] for a, b in zip(after, before, strict=True)]

print("messages per island, parallel:  ", messages("parallel"))
print("messages per island, sequential:", messages("sequential"))
assert messages("parallel") == [1, 1]
rctl.dispatch = "parallel"

# %% [markdown]
# A chain of 16 small stages alternating between the islands, in paired rounds
# (`pwkernel.bench.parallel_dispatch`):

# %%
from pwkernel.bench import parallel_dispatch
from pwkernel.bench.harness import interleave, paired_ratio

samples = interleave(parallel_dispatch.variants(rctl, 16, 256, 1, host_input=True), rounds=7)
speedup = paired_ratio(samples, "parallel", "sequential")
for mode, rates in samples.items():
    print(f"{mode:10} {statistics.median(rates):7.0f} stages/s")
print(f"parallel / sequential: {speedup:.2f}x")
assert speedup > 1.0

# %% [markdown]
# ## A lost island, and its recovery
#
# Kill island 0's process. Futures that depend on it fail with `pw.IslandLostError` naming the
# island; island 1 keeps working; `rctl.reattach(0)` starts a replacement, and the island's
# slices work again.

# %%
old = rctl.islands[0].actor
ray.kill(old)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:           # ray.kill is asynchronous: wait until it is gone
    try:
        ray.get(old.info.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        break

y, z = f_ray(np.array([1.0, 2.0]))
try:
    y.result(60)
    lost = None
except pw.IslandLostError as e:
    lost = e
print("lost:", lost)
assert lost is not None and "island 0" in str(lost)

g = pw.function(lambda x: x - 1, slice=rctl.slice(2, island=1))
print("island 1 still works:", g(np.ones(2)).result(60).tolist())

t = time.perf_counter()
rctl.reattach(0)
y, z = figure2(rctl).f(np.array([1.0, 2.0]))
print(f"reattached in {time.perf_counter() - t:.1f} s:", y.result().tolist(), z.result().tolist())
assert y.result().tolist() == [3.0, 5.0] and z.result().tolist() == [2.0, 4.0]

# %% [markdown]
# ## What we measured here
#
# The Figure 2 program gave the same answer with islands in other processes, with transfers
# between islands in both directions; on this backend, where every node is a remote call,
# parallel dispatch beat sequential; a killed island failed exactly the futures that needed it
# while the other kept working, and `reattach` brought it back. The numbers of this run:

# %%
print(f"Figure 2 across Ray islands: {y.result().tolist()}, {z.result().tolist()}")
print(f"parallel vs sequential dispatch on Ray: {speedup:.2f}x (paired rounds)")
print(f"a lost island: {type(lost).__name__}: {str(lost)[:80]}...")
rctl.close()        # kills the island actors and the private cluster: no processes left
# (island 0's first actor died above, so close keeps the cluster's logs in /tmp/ray and a
# warning on stderr says where; without a lost island they are removed)
print("closed:", rctl)

# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 06 · Two islands over the data-center network
#
# **What the paper found.** Islands are joined by the data-center network (DCN), much slower than
# the interconnect inside an island. Large models (64B, 136B parameters) trained data-parallel
# across two islands of 1024 chips reached about 97% of the throughput of one island with the
# same number of chips (a figure as summarised from the paper; its abstract says throughput
# comparable to the SPMD case on one island).
#
# Here: a small MLP trained data-parallel on two islands (2 devices each, half the batch each),
# gradients exchanged over an emulated DCN link, against the same training on four devices of
# one island. The link is a constructor argument, so we close the kernel's controller (it has
# no link) and make our own.

# %%
import statistics

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.bench import dcn
from pwkernel.bench.harness import interleave, paired_ratio, summarize

# JAX has exactly 8 devices: one controller at a time. Close this cell's own controller from
# an earlier run, if any, then the kernel's.
if isinstance(previous := globals().get("ctl"), pw.Controller):
    previous.close()
have = sum(len(isl.devices) for isl in pw.controller().islands)
assert have >= 8, (
    f"this notebook makes its own controller of islands (4, 4), 8 devices; this kernel has "
    f"{have}. Start Jupyter with PWKERNEL_ISLANDS=4,4, or restart the kernel and run "
    "pw.controller(islands=(4, 4)) first")
pw.controller().close()
link = pw.Link(bandwidth=1e9, latency=20e-6)        # 1 GB/s, 20 us
ctl = pw.Controller(islands=(4, 4), dcn=link)
ctl

# %%
cfg = {"width": 256, "batch": 512, "steps": 4}
params, x, y = dcn.make_data(cfg)
data_parallel = (P(), P("x"), P("x"))        # parameters replicated, batch sharded

halves = [ctl.slice(2, island=i) for i in (0, 1)]
grads = [pw.function(dcn.local_grads, slice=s, in_specs=data_parallel, out_specs=P(),
                     name=f"grads{i}") for i, s in enumerate(halves)]
apply = [pw.function(dcn.apply_grads, slice=s, in_specs=P(), out_specs=P(), name=f"apply{i}")
         for i, s in enumerate(halves)]
put = lambda s, a, spec: jax.device_put(a, NamedSharding(s.mesh, spec))
parts = [(put(s, params, P()), put(s, xh, P("x")), put(s, yh, P("x")))
         for s, xh, yh in zip(halves, np.split(x, 2), np.split(y, 2), strict=True)]

@pw.program(name="two_islands")
def train_two(a, b):
    (pa, xa, ya), (pb, xb, yb) = a, b
    for _ in range(cfg["steps"]):
        ga, gb = grads[0](pa, xa, ya), grads[1](pb, xb, yb)
        pa, pb = apply[0](pa, ga, gb), apply[1](pb, gb, ga)     # gb and ga cross the DCN
    return pa, pb

one = ctl.slice(4, island=0)
step1 = pw.function(dcn.one_island_step, slice=one, in_specs=data_parallel, out_specs=P(),
                    name="train")

@pw.program(name="one_island")
def train_one(p, xs, ys):
    for _ in range(cfg["steps"]):
        p = step1(p, xs, ys)
    return p


# %% [markdown]
# Each island averages its own gradients with the other's, which is the full-batch gradient:
# both islands end with the same parameters as the one-island run.

# %%
view = pw.ScheduleView(ctl, programs=["two_islands"], window=0.1)
view

# %%
k = ctl.trace.next_index
pa, pb = train_two(*parts)
p1 = train_one(put(one, params, P()), put(one, x, P("x")), put(one, y, P("x")))
pa, pb, p1 = ({n: f.result(timeout=60) for n, f in p.items()} for p in (pa, pb, p1))
for name in p1:
    np.testing.assert_allclose(pa[name], p1[name], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(pb[name], p1[name], rtol=1e-4, atol=1e-6)
view.update()
burst = [e for e in view.history if e.index >= k]
shown = [e for e in burst if e.program == "two_islands"]  # what the view draws
view.window.value = 1.05 * (max(e.t_end for e in shown) - min(e.t_start for e in shown))
view.stop()
crossed = [e for e in burst if e.link == "dcn"]
print(f"same parameters on both islands and on one island; {len(crossed)} DCN transfers, "
      f"{sum(e.nbytes for e in crossed) / 1e6:.2f} MB")
# every step, each island's gradient (one array per parameter) crosses to the other island
assert len(crossed) == 2 * len(params) * cfg["steps"], len(crossed)
for e in crossed:        # the emulated link holds each transfer to its modelled time
    assert e.t_end - e.t_start >= link.duration(e.nbytes) - 1e-9, e

# %% [markdown]
# ## Throughput vs one island, and what the bandwidth does
#
# `pwkernel.bench.dcn.variants` builds both trainings on a controller; one controller per
# emulated bandwidth, rounds interleaved. A slow link makes every step wait for its gradients.

# %%
ctl.close()
bench_cfg = dict(dcn.CONFIGS["quick"])
results = {}
for bandwidth in (3e7, 1e10):
    c = pw.Controller(islands=(4, 4), dcn=pw.Link(bandwidth=bandwidth, latency=20e-6))
    try:
        samples = interleave(dcn.variants(c, bench_cfg), rounds=3)
        moved = [e for e in c.trace.events() if e.link == "dcn"]
    finally:
        c.close()
    results[bandwidth] = {
        "one": summarize(samples["one_island"])["median"],
        "two": summarize(samples["two_islands"])["median"],
        "ratio": paired_ratio(samples, "two_islands", "one_island"),
        "link_ms": 1e3 * statistics.median(e.t_end - e.t_start for e in moved),
    }
for bw, r in results.items():
    print(f"DCN {bw / 1e9:g} GB/s: one island {r['one'] / 1e3:.0f}k samples/s, two islands "
          f"{r['two'] / 1e3:.0f}k ({r['ratio']:.2f}x); median DCN transfer {r['link_ms']:.2f} ms")
slow, fast = results[3e7], results[1e10]
# (link_ms is the link model's own time, printed for scale; the ratio is the measured claim)
assert fast["ratio"] > slow["ratio"], "a faster link should bring two islands closer to one"

# %% [markdown]
# On this machine the two islands' eight "devices" share two CPU cores, and a two-island step
# has four computations and two gradients crossing the DCN (one transfer per parameter array,
# each way) where one island has one computation, so the ratio stays below the paper's
# 0.97 even on a fast link; the direction (bandwidth matters: a faster link brings two islands
# closer to one) is the paper's. `docs/benchmarks.md` has the full sweep.
#
# ## What we measured here

# %%
print(f"two islands / one island: {slow['ratio']:.2f} at 30 MB/s, {fast['ratio']:.2f} at "
      "10 GB/s (paper: ~0.97 over the data-center network)")

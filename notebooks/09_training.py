# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 09 · Training: pipelines and SPMD with `pw.train`
#
# **What the paper found.** A 3B-parameter decoder-only Transformer trained on 128 TPU cores
# reached 125.7k tokens/s as SPMD and 131.4k-133.7k tokens/s pipelined over 4, 8 and 16
# stages; larger models (64B, 136B parameters) trained across two islands over DCN kept about
# 97 % of one island's throughput (figures as summarised from the paper). Whole training
# steps, with forwards, backwards and updates spread over many slices, run as single programs
# from one controller.
#
# Tutorial 04 pipelined a forward pass. Here we train: `pw.train` (`docs/training.md`) turns a
# model split into stages into one `@pw.program` per training step, with every forward,
# backward and optimizer update a `pw.function` on its stage's slice. The model is a tiny
# decoder (4 blocks, width 32), trained SPMD on one slice and pipelined over four stages on
# the two islands, two stages per island.

# %%
import time

import numpy as np
import optax

import pwkernel as pw
from pwkernel.bench.harness import interleave, paired_ratio, summarize
from pwkernel.train import transformer

ctl = pw.controller()          # the process-wide controller the kernel hosts
cfg = transformer.Config(vocab=32, width=32, heads=2, layers=4, seq=16)
BATCH, M = 16, 4               # sequences per step, microbatches per pipelined step
batch = transformer.batch(cfg, BATCH)          # (inputs, next-token targets), int32[16, 16]
train = dict(loss=transformer.cross_entropy, optimizer=optax.adam(1e-2))
sizes = [len(isl.devices) for isl in ctl.islands]   # this notebook: islands (4, 4)
assert len(sizes) >= 2 and sizes[0] >= 4, (
    f"this notebook needs two islands, of 4 and 1 devices at least; this kernel has {sizes}."
    " Start Jupyter with PWKERNEL_ISLANDS=4,4, or restart the kernel and run "
    "pw.controller(islands=(4, 4)) first")
ctl

# %% [markdown]
# ## Two ways to train the same model
#
# `SPMD`: the whole step (forward, backward, Adam) as one compiled function on four devices
# of island 0, the batch sharded over them. `Pipeline`: the model cut into four stages of one
# block each (`transformer.split`), stages 0 and 1 on island 0, stages 2 and 3 on island 1,
# so activations and their gradients cross between the islands. Both start from the same
# parameters (`init(0)`); `step` returns the next state and the loss as futures at once.

# %%
stages = transformer.split(cfg, 4)
spmd = pw.train.SPMD(stages, ctl.slice(4, island=0), **train)
pipe = pw.train.Pipeline(stages, [ctl.slice(1, island=i) for i in (0, 0, 1, 1)],
                         schedule="1f1b", microbatches=M, **train)
print(pipe)
print("stage devices:", [vs.device_ids for vs in pipe.slices])

# %% [markdown]
# ## A loss curve that grows as steps end
#
# Each step's loss is a future; the loop reads it when the step ends and streams it into the
# plot (`ColumnDataSource.stream`), which the page redraws while the cell is still running.
# `step` itself never waits: it returns futures at once, and a step is launched behind the
# one before it, whose state it donates, as `jax.jit` queues a call with donated arguments
# (`docs/training.md`, known limit 1). It is reading each loss that waits here, so the next
# step is submitted only once this one's loss exists; a loop that reads its losses now and
# then lets the host run further ahead of the devices.

# %%
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure

from pwkernel.viz.bokeh_model import EchoFreeBokehModel, ensure_bokehjs

ensure_bokehjs()
fig = figure(height=260, width=560, title="training loss", x_axis_label="step",
             y_axis_label="cross-entropy")
sources = {name: ColumnDataSource({"step": [], "loss": []}) for name in ("spmd", "1f1b")}
for (name, src), color in zip(sources.items(), ("#1f77b4", "#d62728"), strict=True):
    fig.line("step", "loss", source=src, legend_label=name, color=color, line_width=2)
    fig.scatter("step", "loss", source=src, color=color)
plot = EchoFreeBokehModel(fig)


def fit(trainer, name, steps=8):
    state, losses = trainer.init(0), []
    for i in range(steps):
        state, loss = trainer.step(state, batch)
        losses.append(float(loss))          # waits for this step's loss, then plots it
        with plot.batch():
            sources[name].stream({"step": [i], "loss": [losses[-1]]})
    return state, losses


plot

# %%
t0 = time.perf_counter()
spmd_state, spmd_losses = fit(spmd, "spmd")
pipe_state, pipe_losses = fit(pipe, "1f1b")
print(f"16 steps (compiles included) in {time.perf_counter() - t0:.1f} s")
print("SPMD:", " ".join(f"{v:.3f}" for v in spmd_losses))
print("1F1B:", " ".join(f"{v:.3f}" for v in pipe_losses))
assert spmd_losses[-1] < spmd_losses[0] and pipe_losses[-1] < pipe_losses[0]
np.testing.assert_allclose(pipe_losses, spmd_losses, rtol=1e-3)   # one model, two layouts

# %% [markdown]
# Both layouts give the same losses: the pipeline cuts the batch into four microbatches and
# sums their gradients, so each step's update is the SPMD step's.
#
# ## One step, call by call
#
# The trace names every call: `s2.fwd[m1]` is stage 2's forward of microbatch 1, `s2.bwd[m1]`
# its backward, `s2.update` its Adam update, `loss` the step's mean. Under 1F1B each stage
# runs a few forwards, then one forward and one backward in turn; every update waits for the
# whole step. In the schedule below (fitted to this one step), hover a bar to see its name.

# %%
view = pw.ScheduleView(ctl, programs=["pipeline.1f1b"], live=False)
k = ctl.trace.next_index
pipe_state, loss = pipe.step(pipe_state, batch)
pw.train.wait((pipe_state, loss))
ctl.wait()
[one_step] = pw.train.measure.steps(ctl.trace.events(since=k), program="pipeline.1f1b")
view.update()
view.window.value = 1.05 * (max(e.t_end for e in one_step) - min(e.t_start for e in one_step))
for s, calls in pw.train.stage_order_seen(one_step).items():
    print(f"stage {s}:", " ".join(f"{c.kind.value[0].upper()}{c.microbatch}" for c in calls))
kinds = {e.name.split(".")[-1].split("[")[0] for e in one_step}
print("kinds of call in the step:", sorted(kinds))
assert {"fwd", "bwd", "update"} <= kinds
view

# %% [markdown]
# ## GPipe against 1F1B: the bubble and the memory
#
# The same pipeline, one step under each schedule, alternating. GPipe runs every forward
# before any backward, so stage 0 keeps all M microbatches' residuals (what the backward
# needs) alive at once; 1F1B keeps at most S − s on stage s. We read the bubble and the
# residuals alive at once from the trace, and sample `ctl.memory()` while each step runs.
#
# Two readings of memory. `ctl.memory()` is sampled while the step runs; its peak is the
# largest rise on any one device, and with M = S stage 0 holds as many residuals under both
# schedules, so the sampled peaks lie close together, and under parallel dispatch (the
# default) the control plane launches a step's calls ahead of their data and a launched call's
# outputs count at once, which blurs them further (`docs/training.md`). The trace's count of
# the residuals alive on each stage follows the order the devices ran, which the schedule
# fixes: it is the same every run, and it is where 1F1B's saving shows, on the later stages.

# %%
placed = pipe.place(batch)
seen = {(sch, mode): [] for sch in ("gpipe", "1f1b") for mode in ("sequential", "parallel")}
for r in range(3):         # round 0 compiles GPipe's calls; it is dropped
    for sch in ("gpipe", "1f1b") if r % 2 == 0 else ("1f1b", "gpipe"):
        for mode in ("sequential", "parallel"):
            k = ctl.trace.next_index
            with pw.train.MemorySampler(ctl) as mem:
                pipe_state, loss = pipe.step(pipe_state, placed, schedule=sch, dispatch=mode)
                pw.train.wait((pipe_state, loss))
            ctl.wait()
            [run] = pw.train.measure.steps(ctl.trace.events(since=k), program=f"pipeline.{sch}")
            if r:
                seen[sch, mode].append((pw.train.bubble(run), mem.peak_above_baseline,
                                        pw.train.peak_residuals(run, pipe.residual_bytes)))
residuals = {sch: seen[sch, "parallel"][0][2] for sch in ("gpipe", "1f1b")}
for sch in ("gpipe", "1f1b"):
    bub = summarize([b for b, _, _ in seen[sch, "parallel"]])["median"]
    mem = {mode: max(m for _, m, _ in seen[sch, mode]) for mode in ("sequential", "parallel")}
    print(f"{sch:5}: bubble {bub:.2f}; memory sampled above baseline: sequential "
          f"{mem['sequential'] / 1e3:.0f} kB, parallel {mem['parallel'] / 1e3:.0f} kB; "
          f"residuals alive per stage (trace) {[round(b / 1e3) for b in residuals[sch]]} kB")
S = len(stages)
print(f"GPipe's ideal bubble (S - 1) / (M + S - 1) = {(S - 1) / (M + S - 1):.2f}")
assert all(runs[2] == residuals[sch] for (sch, _), v in seen.items() for runs in v)
# 1F1B keeps at most S - s microbatches' residuals on stage s (GPipe: all M), so with M = S
# stage 0 holds as many under both, and every later stage fewer
assert all(a <= b for a, b in zip(residuals["1f1b"], residuals["gpipe"], strict=True))
assert residuals["1f1b"][-1] < residuals["gpipe"][-1]

# %% [markdown]
# The bubble here is more than GPipe's ideal, and need not differ between the schedules: the
# eight virtual devices are threads on two shared CPU cores, so a device also idles while
# another has the cores. The sampled memory can miss a peak shorter than its interval, so it
# is printed, not asserted; the trace's count is exact.
#
# ## Throughput: pipelined against SPMD
#
# Tokens per second, three steps per sample, the two trainers alternated in paired rounds.

# %%
held = {"spmd": spmd_state, "1f1b": pipe_state}  # each step donates its state: keep the newest


def rate_of(name, trainer):
    data = trainer.place(batch)

    def sample():
        t0 = time.perf_counter()
        for _ in range(3):
            held[name], loss = trainer.step(held[name], data)
        pw.train.wait((held[name], loss))
        return 3 * BATCH * cfg.seq / (time.perf_counter() - t0)
    return sample


samples = interleave({"spmd": rate_of("spmd", spmd), "1f1b": rate_of("1f1b", pipe)}, rounds=3)
spmd_state, pipe_state = held["spmd"], held["1f1b"]  # (the old ones were donated): rerunnable
ratio = paired_ratio(samples, "1f1b", "spmd")
print(f"SPMD {summarize(samples['spmd'])['median'] / 1e3:.1f}k tok/s, 4-stage 1F1B "
      f"{summarize(samples['1f1b'])['median'] / 1e3:.1f}k tok/s, ratio {ratio:.2f}")

# %% [markdown]
# The paper's pipeline kept up with SPMD because its stages ran at the same time on their own
# TPUs. Here the "devices" share two CPU cores, so stages never truly overlap, and a pipeline
# only adds its 4 × 4 × 2 calls, their transfers and the bubble: the ratio above is below 1
# and moves with the machine's load. It is printed, not asserted. The same program on devices
# that run in parallel is what the next section simulates.
#
# ## The same pipeline on a simulated TPU v4 pod
#
# `pw.Controller(backend="sim")` (tutorial 08, `docs/simulator.md`) runs programs on a virtual
# clock, and `pw.train.Pipeline` runs there as it is: the same stages (`transformer.split`),
# the same step program with its tokens, the same transfers and gang schedulers. What is
# *estimated*: each call's duration, from XLA's cost analysis of the call lowered for the
# simulated chips, on a TPU v4's roofline, and each transfer's, from the ICI and DCN link
# model. What is *computed*: nothing. A simulated future has a shape, a dtype, a sharding and
# the virtual time it existed at, but no value. So the times, the order each stage ran its
# calls in, the bubble and the residuals alive come from the simulation; the loss does not.
#
# On a TPU the tiny model above would take microseconds a call, less than the control plane's
# costs per call, so the simulated pipeline trains a larger model of the same code: 8 blocks
# of width 2048 (about 0.4 B parameters) in 4 stages of 2 blocks, each stage on 16 chips, two
# stages per island of 64 chips, the islands joined by DCN; 8 microbatches of 128 sequences
# of 256 tokens (8 sequences per chip). Lowering needs shapes only, so simulating a step of
# this model takes seconds of wall time here (the cell prints how many), with no chip at all.

# %%
import dataclasses

pod = pw.sim.Cluster.preset("tpu-v4", chips=128, islands=2)
big = transformer.Config(vocab=1024, width=2048, heads=16, layers=8, seq=256)
SM, PER = 8, 128           # microbatches, and sequences in each


def simulate(cluster):
    """One step under each schedule on a simulated ``cluster``, read from its trace."""
    sim_ctl = pw.Controller(backend="sim", cluster=cluster)
    sim_pipe = pw.train.Pipeline(transformer.split(big, 4),
                                 [sim_ctl.slice(16, island=i) for i in (0, 0, 1, 1)],
                                 microbatches=SM, **train)
    state = sim_pipe.init(0)
    data = sim_pipe.place(transformer.batch(big, SM * PER))    # uploaded on the virtual clock
    out = {}
    for sch in ("gpipe", "1f1b"):
        sim_ctl.wait()
        k, t0 = sim_ctl.trace.next_index, sim_ctl.executor.now()
        state, loss = pw.train.wait(sim_pipe.step(state, data, schedule=sch))
        sim_ctl.wait()
        [run] = pw.train.measure.steps(sim_ctl.trace.events(since=k), program=f"pipeline.{sch}")
        out[sch] = {"ms": (sim_ctl.executor.now() - t0) * 1e3, "bubble": pw.train.bubble(run),
                    "residuals": pw.train.peak_residuals(run, sim_pipe.residual_bytes),
                    "order": pw.train.stage_order_seen(run), "run": run}
    return sim_ctl, loss, out


t0 = time.perf_counter()
sim_ctl, sim_loss, sim_runs = simulate(pod)
print(f"two simulated steps in {time.perf_counter() - t0:.1f} s of wall time")
print("the loss:", sim_loss, f"existed at t = {sim_loss.t_done * 1e3:.1f} ms (virtual)")
try:
    sim_loss.result()
except pw.NoValueError as e:
    print("sim_loss.result():", str(e).split(":")[0])
took = {e.name: (e.t_end - e.t_start) * 1e3 for e in sim_runs["1f1b"]["run"]}
print(f"stage 1, estimated: forward {took['s1.fwd[m0]']:.1f} ms, backward "
      f"{took['s1.bwd[m0]']:.1f} ms, Adam update {took['s1.update']:.1f} ms")
hops = [e for e in sim_ctl.trace.events() if e.link == "dcn" and e.program == "pipeline.1f1b"]
print(f"the 1F1B step crossed the DCN {len(hops)} times, the largest transfer "
      f"{max(e.nbytes for e in hops) / 1e6:.0f} MB (one microbatch's activation or cotangent)")
S = 4
ideal = (S - 1) / (SM + S - 1)
for sch, r in sim_runs.items():
    print(f"{sch:5}: step {r['ms']:.1f} ms (virtual), bubble {r['bubble']:.2f} (GPipe's ideal "
          f"{ideal:.2f}), residuals alive per chip of each stage "
          f"{[round(b / 16 / 1e9, 1) for b in r['residuals']]} GB")
    print("       stage 0 ran:", " ".join(f"{c.kind.value[0].upper()}{c.microbatch}"
                                         for c in r["order"][0]))
for sch, r in sim_runs.items():    # the runtime kept each stage to its schedule's order
    assert r["order"] == {s: pw.train.stage_order(sch, s, S, SM) for s in range(S)}
    assert 0 < r["bubble"] < 1
per = sim_runs["gpipe"]["residuals"][0] / SM       # one microbatch's, on stage 0
assert sim_runs["gpipe"]["residuals"][0] == SM * per
assert sim_runs["1f1b"]["residuals"][0] == S * per                 # 1F1B: S - s on stage s
pw.ScheduleView(sim_ctl, live=False, programs=["pipeline.1f1b"])

# %% [markdown]
# GPipe's bubble comes out near its ideal (S − 1) / (M + S − 1): on simulated chips that run
# at once, a pipeline's only idle time is its fill and drain (the updates run on every stage
# together at the end). 1F1B keeps at most S − s microbatches' residuals alive on stage s, a
# half of GPipe's on the first stage here. Its step is a little longer on this pod: in its
# steady state a stage alternates a forward and a backward, and each waits for an activation
# or a cotangent from the neighbouring stage, so the DCN hop between stages 1 and 2 (the
# largest transfer printed above, per microbatch) lies on the critical path again and again.
# On the same pod with a free DCN, both schedules take the same time:

# %%
free_ctl, _, free = simulate(dataclasses.replace(
    pod, dcn=pw.sim.Network(bandwidth_per_host=1e15, latency=0.0)))
free_ctl.close()
for sch, r in free.items():
    print(f"free DCN, {sch:5}: step {r['ms']:.1f} ms (virtual), bubble {r['bubble']:.2f}")
assert abs(free["1f1b"]["ms"] - free["gpipe"]["ms"]) < 0.01 * free["gpipe"]["ms"]
assert free["1f1b"]["ms"] < sim_runs["1f1b"]["ms"]

# %% [markdown]
# The durations are the cost model's, not measurements: XLA's cost analysis of a lowered,
# not yet optimized call counts every operation's memory traffic, so this model's calls come
# out bound by memory bandwidth, and the Adam update (parameters replicated on each stage's
# chips) longer than a forward. A backward takes about twice a forward: each chip reads and
# writes its whole copy of the stage's parameters and their gradients, and then all-reduces
# the gradients over the stage's 16 chips, as XLA's partitioner does on real chips (about
# 4 ms of its 17). The schedule, the order each stage kept, the transfers between the islands
# and what they cost the schedules are the runtime's and the simulator's own.
#
# ## What we measured here

# %%
sim_ctl.close()
print(f"losses, 8 steps: SPMD {spmd_losses[0]:.3f} -> {spmd_losses[-1]:.3f}, "
      f"4-stage 1F1B over two islands {pipe_losses[0]:.3f} -> {pipe_losses[-1]:.3f} (equal)")
print("residuals alive per stage (trace): GPipe "
      f"{[round(b / 1e3) for b in residuals['gpipe']]} kB, 1F1B "
      f"{[round(b / 1e3) for b in residuals['1f1b']]} kB")
print(f"pipelined / SPMD tokens per second here: {ratio:.2f} (paper: 1.04-1.06 on TPUs; "
      "shared CPU cores cannot show it)")
print("simulated TPU v4 pod, 0.4 B parameters, 4 stages over 2 islands: "
      + ", ".join(f"{s} {r['ms']:.0f} ms a step, bubble {r['bubble']:.2f}"
                  for s, r in sim_runs.items()))

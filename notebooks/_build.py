"""Writes the tutorial notebooks (``notebooks/NN_*.ipynb``) from the cells below.

The notebooks are generated so that they can be reviewed as code: edit this file, then run

    .venv/bin/python notebooks/_build.py          # rewrite every notebook
    .venv/bin/python notebooks/_build.py --check  # exit 1 if a notebook is out of date

Outputs are never written (the files hold sources only); ``tests/test_notebooks.py`` executes
each notebook on the ``pwkernel`` kernel and checks that no cell errored. Every notebook asserts
its claims on numbers it measures; timings are compared as ratios, in the direction of an
effect, never against a fixed time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"name": "pwkernel", "display_name": "Pathways (JAX)", "language": "python"}

SETUP = """\
import statistics
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import pwkernel as pw

ctl = pw.controller()          # the process-wide controller the kernel hosts
ctl"""


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text.strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(text.strip("\n"))


# --- 00 -------------------------------------------------------------------------------------
QUICKSTART = [
    md("""
# 00 · Quick start: one controller, many devices

**What the paper found.** Pathways (Barham et al., MLSys 2022) goes back to a *single
controller*: one Python program describes a dataflow graph of compiled functions placed on
sets of accelerators, and the runtime dispatches it asynchronously. It still reaches about
100% accelerator utilization for plain SPMD on 2048 TPUs. Its Figure 2 is a three-function
program across two device sets, which gives `([3., 5.], [2., 4.])` for the input `[1., 2.]`.

This notebook runs that program here: the host CPU split into two *islands* of four virtual
devices. It uses the **Pathways (JAX)** kernel, which has already run `%load_ext pwkernel`.
"""),
    code("""
%load_ext pwkernel
"""),
    md("Loading twice is harmless: it prints the banner again. Now the controller and its "
       "devices:"),
    code(SETUP),
    code("""
for isl in ctl.islands:
    print(f"island {isl.id}: {len(isl.devices)} {isl.platform} devices {isl.device_ids}")
assert len(ctl.islands) >= 2, "the Figure 2 program needs two islands (PWKERNEL_ISLANDS=4,4)"
"""),
    md("""
## Slices

A *virtual slice* is a set of devices with a mesh shape, handed out by the resource manager.
Functions are compiled for a slice; the runtime maps it to physical devices.
"""),
    code("""
s0 = ctl.slice(2, island=0)
s1 = ctl.slice(2, island=1)
print(s0, "devices", s0.device_ids)
print(s1, "devices", s1.device_ids)
"""),
    md("""
## The Figure 2 program

`a`, `b`, `c` are compiled functions (`jax.jit` with shardings over their slice). Inside
`@pw.program` the three calls are *traced* into one dataflow graph and submitted at once; the
runtime inserts the transfers between the two islands.
"""),
    code("""
a = pw.function(lambda x: x * 2, slice=s0, name="a")
b = pw.function(lambda x: x + 1, slice=s1, name="b")
c = pw.function(lambda x: x / 2, slice=s1, name="c")

@pw.program
def f(v):
    x = a(v)
    return b(x), a(c(x))

start = ctl.trace.next_index
y, z = f(np.array([1.0, 2.0]))
print("returned at once:", y)
print("shape, dtype, sharding known before the value:", y.shape, y.dtype, y.sharding.spec)
print("the program run:", y.run)
"""),
    code("""
y_value, z_value = y.result(), z.result()
print("y =", y_value, " z =", z_value)
np.testing.assert_allclose(y_value, [3.0, 5.0])
np.testing.assert_allclose(z_value, [2.0, 4.0])
"""),
    md("""
## What ran where

Every computation and transfer is an event on one clock. The host argument was copied onto
`a`'s devices, and `x` crossed between islands twice (to `c` and `b`, and back to `a`).
"""),
    code("""
assert ctl.trace.wait_for(start + 1, timeout=10)
events = ctl.trace.events(since=start)
for e in events:
    where = f"{e.src}->{e.dst}" if e.kind == "transfer" else f"island {e.island}"
    print(f"{e.kind:9} {e.name:14} {where:10} devices {e.devices}  link {e.link}  "
          f"{(e.t_end - e.t_start) * 1e6:7.1f} us")
computations = [e for e in events if e.kind == "compute"]
crossings = [e for e in events if e.kind == "transfer" and e.link == "dcn"]
assert len(computations) == 4, "a, b, c and a again"
assert {e.program for e in computations} == {"f"} and len({e.program_id for e in events}) == 1
assert crossings, "the runtime should have moved x between the islands"
"""),
    md("""
## Futures

A future stands for a sharded buffer that may not exist yet. It can be passed into the next
program before it resolves; the runtime chains the work and the caller never waits.
"""),
    code("""
heavy = pw.function(lambda m: jnp.tanh(m @ m) / m.shape[0], slice=s0, name="heavy")
m = jnp.ones((512, 512), jnp.float32)
first = heavy(m)
second = heavy(first)                # `first` may still be running: no wait here
print("first:", first.shape, first.dtype, "state", first.state)
second_value = second.result(timeout=60)
assert second_value.shape == first.shape == (512, 512)
print("second resolved:", second.state, "mean", float(second_value.mean()))
"""),
    md("""
## A live schedule

`pw.ScheduleView` draws one row per device, grouped by island: bars are computations,
hatched strips and lines are transfers. It follows the trace while programs run.
"""),
    code("""
view = pw.ScheduleView(ctl, programs=["f"], window=0.05)
view
"""),
    code("""
before = ctl.trace.next_index
outs = [f(np.array([1.0, 2.0]) * k) for k in range(20)]      # 20 programs in flight
for k, (_, zk) in enumerate(outs):
    np.testing.assert_allclose(zk.result(timeout=60), np.array([2.0, 4.0]) * k)
view.update()
mine = [e for e in view.history if e.index >= before]
span = max(e.t_end for e in mine) - min(e.t_start for e in mine)
view.window.value = span * 1.05              # fit the time axis to the last burst
print(f"{len(mine)} events for 20 programs in {span * 1e3:.1f} ms")
assert len([e for e in mine if e.kind == "compute"]) == 20 * 4
"""),
    md("""
## The same thing with the magics

`%%pathways` turns a plain JAX cell into one program on a slice: names bound in the cell
hold futures.
"""),
    code("""
%pathways slice quick 4 --island 0
"""),
    code("""
%%pathways --slice quick
xs = jnp.arange(16.0)
ys = jnp.sin(xs) * 2
total = ys.sum()
"""),
    code("""
print(type(total).__name__, total.shape, "=", float(total.result()))
np.testing.assert_allclose(float(total.result()), float((np.sin(np.arange(16.0)) * 2).sum()),
                           rtol=1e-5)
"""),
    md("## What we measured here"),
    code("""
view.stop()
print(f"Figure 2: y = {y_value.tolist()}, z = {z_value.tolist()} (paper: [3, 5], [2, 4])")
print(f"one program = {len(computations)} computations + {len(events) - len(computations)} "
      f"transfers, {len(crossings)} of them between islands")
print(f"20 programs in flight: {span * 1e3:.1f} ms on this machine")
"""),
]


# --- 01 -------------------------------------------------------------------------------------
FUTURES = [
    md("""
# 01 · The single controller, programs and futures

**What the paper found.** A single controller pays a dispatch cost that multi-controller JAX
does not. The paper measured it with a micro-benchmark in three forms: **OpByOp** (every call
its own program), **Chained** (a chain of calls traced into one program) and **Fused** (the
chain compiled into one computation). Fused Pathways matched JAX up to about 1000 TPU cores,
Chained Pathways beat JAX OpByOp up to 256 cores, and the smallest computation for which
Pathways matched JAX throughput was about 2.3 ms at 16 hosts (128 cores).

Here we take the same three forms on two virtual CPU devices, beside bare JAX, using the
benchmark harness (`pwkernel.bench`).
"""),
    code(SETUP),
    md("""
## Programs vs op-by-op calls

Called outside a program, a compiled function is a one-node program: one submission per call.
Inside `@pw.program`, the whole chain is one submission.
"""),
    code("""
sl = ctl.slice(2, island=0)
step = pw.function(lambda x: jnp.tanh(x) * 0.5 + x * 0.5, slice=sl, name="step")
x0 = jax.device_put(np.linspace(-1, 1, 256, dtype=np.float32), NamedSharding(sl.mesh, P("x")))

@pw.program(name="chain")
def chain(x):
    for _ in range(8):
        x = step(x)
    return x

k = ctl.trace.next_index
x = x0
for _ in range(8):
    x = step(x)                       # op by op: 8 programs
op_value = x.result()
k2 = ctl.trace.next_index
chained = chain(x0).result()          # one program of 8 computations
assert ctl.trace.wait_for(k2 + 8, timeout=10)
op_runs = {e.program_id for e in ctl.trace.events(since=k)[: k2 - k] if e.kind == "compute"}
chain_runs = {e.program_id for e in ctl.trace.events(since=k2) if e.kind == "compute"}
print("op by op:", len(op_runs), "programs;  chained:", len(chain_runs), "program")
np.testing.assert_allclose(op_value, chained, rtol=1e-6)
assert len(op_runs) == 8 and len(chain_runs) == 1
"""),
    md("""
## What a future is

Because a compiled function is *regular*, its output shapes, types and shardings are known
before its inputs are computed. So `heavy(m)` returns a future at once, with its shape, and
that future can feed the next program before its value exists.
"""),
    code("""
heavy = pw.function(lambda m: jnp.tanh(m @ m @ m) / m.shape[0], slice=sl, name="heavy")
m = jax.device_put(np.eye(768, dtype=np.float32), NamedSharding(sl.mesh, P("x")))
fut = heavy(m)
known = (fut.shape, fut.dtype, fut.sharding.spec, fut.state)
print("at once:", known)
later = step(fut)                                  # chained on a future
value = later.result(timeout=60)
print("after waiting:", fut.state, value.shape)
assert known[0] == value.shape == (768, 768)
"""),
    md("""
## The dispatch micro-benchmark at our scale

`pwkernel.bench.dispatch` builds the five variants (pwkernel OpByOp, Chained and Fused; JAX
OpByOp and Fused) for a slice size and an array size; `harness.interleave` runs them in rounds
(A B, then B A, ...) and `paired_ratio` compares samples taken side by side, so the noise of
this shared machine mostly cancels. Each sample is steps per second.
"""),
    code("""
from pwkernel.bench import dispatch
from pwkernel.bench.harness import interleave, paired_ratio, summarize

def measure(size, chain_len, fused_calls, rounds=3):
    samples = interleave(dispatch.variants(ctl, 2, size, chain_len, fused_calls), rounds=rounds)
    us = {v: 1e6 / summarize(samples[v])["median"] for v in dispatch.VARIANTS}
    return samples, us

small, small_us = measure(256, 16, 4)
large, large_us = measure(2 ** 22, 8, 1)
for name, us in (("256 elements", small_us), ("4M elements", large_us)):
    print(f"{name:13}" + "".join(f"  {v} {t:8.1f} us" for v, t in us.items()))
"""),
    code("""
fused_gain = paired_ratio(small, "pw_fused", "pw_opbyop")
ratios = {
    "small": {k: paired_ratio(small, a, b) for k, (a, b) in
              {"OpByOp/JAX": ("pw_opbyop", "jax_opbyop"),
               "Chained/JAX OpByOp": ("pw_chained", "jax_opbyop"),
               "Fused/JAX Fused": ("pw_fused", "jax_fused")}.items()},
    "large": {k: paired_ratio(large, a, b) for k, (a, b) in
              {"OpByOp/JAX": ("pw_opbyop", "jax_opbyop"),
               "Chained/JAX OpByOp": ("pw_chained", "jax_opbyop"),
               "Fused/JAX Fused": ("pw_fused", "jax_fused")}.items()},
}
overhead_us = small_us["pw_opbyop"] - small_us["jax_opbyop"]
print(f"per-call overhead of a one-node program vs bare JAX: {overhead_us:.0f} us")
print(f"Fused vs OpByOp on tiny steps: {fused_gain:.1f}x more steps per second")
for size, r in ratios.items():
    print(size, {k: round(v, 2) for k, v in r.items()})
# The claims, as directions: fusing removes the per-call cost; a bigger computation hides it.
assert fused_gain > 2, f"fusing should beat one program per step on tiny steps: {fused_gain:.2f}"
assert ratios["large"]["Fused/JAX Fused"] > ratios["small"]["Fused/JAX Fused"], ratios
"""),
    md("""
The per-call cost is fixed (submission, scheduling, completion: tens of microseconds here), so
its share shrinks as a computation grows: that is the paper's "smallest computation at which
Pathways matches JAX". The Fused rows show it most clearly (one submission per loop of 8
steps); the OpByOp and Chained rows at 4M elements are short chains of long steps and move
with the load of this shared machine, so only the Fused direction is asserted.
`docs/benchmarks.md` has the whole sweep (`python -m pwkernel.bench dispatch`), and explains
where the remaining overhead goes.

## What we measured here
"""),
    code("""
print(f"one step of 256 elements on 2 devices: JAX {small_us['jax_opbyop']:.0f} us per call, "
      f"pwkernel OpByOp {small_us['pw_opbyop']:.0f} us, Chained {small_us['pw_chained']:.0f} us, "
      f"Fused {small_us['pw_fused']:.1f} us")
print(f"Fused pwkernel / Fused JAX: {ratios['small']['Fused/JAX Fused']:.2f} at 256 elements, "
      f"{ratios['large']['Fused/JAX Fused']:.2f} at 4M elements "
      f"({large_us['jax_fused']:.0f} us per step)")
"""),
]


# --- 02 -------------------------------------------------------------------------------------
PARALLEL = [
    md("""
# 02 · Parallel asynchronous dispatch

**What the paper found.** With *sequential* dispatch, the host-side work for a computation
(allocate its inputs, tell the producer where to send them, prepare the launch) starts only
once its predecessor has run, so short computations leave accelerators idle. Because compiled
functions are regular, Pathways does that work for every node of a program up front, in
parallel: the control plane runs ahead of the data plane. In the paper's pipeline benchmark,
sequential dispatch was always slower.

`ctl.dispatch = "sequential"` prepares a node only when its inputs exist (the paper's
baseline); `"parallel"` prepares every node when the program is submitted.
"""),
    code(SETUP),
    code("""
import time
from collections import defaultdict
from pwkernel.bench import parallel_dispatch
from pwkernel.bench.harness import interleave, paired_ratio, rate, summarize

def make_chain(name, slices, stages):
    # stage i runs on slices[i % len(slices)]; each stage reads the previous one's output
    fns = [pw.function(parallel_dispatch.stage, slice=slices[i % len(slices)],
                       in_specs=P("x"), out_specs=P("x"), name=f"stage{i}")
           for i in range(stages)]
    @pw.program(name=name)
    def chain(x):
        for fn in fns:
            x = fn(x)
        return x
    return chain

def run(mode, chain, x, programs=1):
    # Run `programs` programs one after another; returns seconds and their trace events.
    ctl.dispatch = mode
    k = ctl.trace.next_index
    t0 = time.perf_counter()
    for _ in range(programs):
        chain(x).result(timeout=60)
    elapsed = time.perf_counter() - t0
    return elapsed, ctl.trace.events(since=k)

def by_run(events):
    runs = defaultdict(list)
    for e in events:
        if e.kind == "compute":
            runs[e.program_id].append(e)
    return [sorted(es, key=lambda e: e.t_start) for es in runs.values()]
"""),
    md("""
## A chain across islands: when is each node prepared?

Eight stages alternate between a 2-device slice on island 0 and one on island 1, so every
edge of the chain is a transfer between islands. Each event's `t_submit` is when the node was
handed to its island's scheduler, that is, when its host-side work was done.
"""),
    code("""
STAGES, SIZE = 8, 65536
halves = [ctl.slice(2, island=0), ctl.slice(2, island=1)]
across = make_chain("across", halves, STAGES)
x0 = jax.device_put(np.ones(SIZE, np.float32), NamedSharding(halves[0].mesh, P("x")))
prepared = {}
for mode in ("sequential", "parallel"):
    run(mode, across, x0)                                 # compile
    _, events = run(mode, across, x0)
    (nodes,) = by_run(events)
    t0 = nodes[0].t_submit
    prepared[mode] = nodes
    print(f"{mode:10} prepared at (us after the first): " +
          " ".join(f"{(e.t_submit - t0) * 1e6:5.0f}" for e in nodes))
seq, par = prepared["sequential"], prepared["parallel"]
# parallel: every node was prepared before the first stage had even finished
assert all(e.t_submit <= par[0].t_end for e in par)
# sequential: a node was prepared only after the stage it depends on had finished
assert all(q.t_submit >= p.t_end for p, q in zip(seq, seq[1:]))
"""),
    md("""
What does that buy across islands? The benchmark's own variant
(`parallel_dispatch.variants`: 16 stages alternating islands, paired rounds):
"""),
    code("""
samples = interleave(parallel_dispatch.variants(ctl, 16, SIZE, 1), rounds=5)
across_speedup = paired_ratio(samples, "parallel", "sequential")
print({k: f"{summarize(v)['median']:.0f} stages/s" for k, v in samples.items()},
      f"parallel / sequential {across_speedup:.2f}")
"""),
    md("""
Little, and it varies from run to run on this machine. Each stage here waits for a transfer
to the other island anyway, and preparing a node is only a dictionary lookup and a scheduler
event: there is almost no host work to hide. (The paper's host work included buffer
allocation and RPCs between hosts, hundreds of microseconds; on one machine the
transfer dominates.)

## A chain on one slice

Where the effect is large is a chain of short computations on the *same* devices. Prepared
up front, the next computation is launched behind the one still running, so the devices
never wait for the controller. Two views side by side, each showing its own program:
"""),
    code("""
import ipywidgets as widgets

one = ctl.slice(2, island=0)
xs = jax.device_put(np.ones(SIZE, np.float32), NamedSharding(one.mesh, P("x")))
local = {mode: make_chain(mode, [one], 16) for mode in ("sequential", "parallel")}
for mode, chain in local.items():
    run(mode, chain, xs)                                  # compile
views = {mode: pw.ScheduleView(ctl, programs=[mode], window=0.01) for mode in local}
widgets.HBox([widgets.VBox([widgets.HTML(f"<b>{m} dispatch</b>"), v],
                           layout=widgets.Layout(width="50%")) for m, v in views.items()])
"""),
    code("""
shown = {}
for mode, view in views.items():
    shown[mode], _ = run(mode, local[mode], xs)
    view.update()
for view in views.values():
    view.window.value = max(shown.values()) * 1.1        # one time scale for both
    view.stop()
print({m: f"{t * 1e3:.2f} ms" for m, t in shown.items()})
"""),
    md("""
## Measured: throughput on one slice

The views cannot measure the idle time between two computations here: a node launched ahead
*starts*, by the runtime's clock, when its producer ends (it was waiting on the device for that
data), so in parallel mode the spans touch by construction. What can be measured is the
wall-clock time of the whole chain, so that is the claim checked: stages per second in each
mode, rounds alternating the modes, the speedup being the harness's paired ratio.
"""),
    code("""
def variant(mode):
    return lambda: rate(lambda: run(mode, local[mode], xs), 16)

same = interleave({m: variant(m) for m in local}, rounds=7)
speedup = paired_ratio(same, "parallel", "sequential")
print({k: f"{summarize(v)['median']:.0f} stages/s" for k, v in same.items()},
      f"parallel / sequential {speedup:.2f}")
assert speedup > 1, f"running ahead on one slice should pay off ({speedup:.2f})"
ctl.dispatch = "parallel"
"""),
    md("## What we measured here"),
    code("""
print(f"parallel dispatch prepared all {STAGES} nodes before the first finished; sequential "
      "prepared each after its predecessor")
print(f"chain across islands: parallel / sequential {across_speedup:.2f} (transfers dominate)")
print(f"chain on one slice: {speedup:.2f}x the stages per second with parallel dispatch "
      "(paper: sequential always slower)")
"""),
]


# --- 03 -------------------------------------------------------------------------------------
GANG = [
    md("""
# 03 · Gang scheduling: one order per island

**What the paper found.** Accelerators run non-preemptible kernels in the order they were
enqueued. If two devices of an island enqueue two computations that use collectives in
*different* orders, each device waits at a collective the other will never reach: a deadlock.
So each Pathways island has one central scheduler that puts every computation on the island
into one consistent order. The paper evaluated FIFO, and showed priority and proportional
share between clients.

First a safe model of the deadlock in plain Python (we never hang XLA), then the gang
scheduler, then FIFO vs priority on the real runtime.
"""),
    code(SETUP),
    md("""
## The deadlock, modelled

Each device runs its queue in order. A collective completes only when *every* device taking
part is at it (a rendezvous). `run_queues` advances whatever can advance and stops when no
device can make progress.
"""),
    code("""
def run_queues(queues, members, limit=10_000):
    # queues: device -> collectives in the order that device runs them
    # members: collective -> the devices taking part. Returns (finished, stuck heads or None).
    queues = {d: list(q) for d, q in queues.items()}
    finished = []
    for _ in range(limit):
        heads = {d: q[0] for d, q in queues.items() if q}
        if not heads:
            return finished, None
        ready = sorted({c for c in heads.values()
                        if all(heads.get(d) == c for d in members[c])})
        if not ready:                       # no progress possible: every device waits forever
            return finished, heads
        for c in ready:
            for d in members[c]:
                queues[d].pop(0)
            finished.append(c)
    raise RuntimeError("no verdict within the step limit")

members = {"A": (0, 1), "B": (0, 1)}            # two all-reduces over devices 0 and 1
done, stuck = run_queues({0: ["A", "B"], 1: ["B", "A"]}, members)
print("different orders -> finished", done, "stuck at", stuck)
assert stuck == {0: "A", 1: "B"}
done, stuck = run_queues({0: ["A", "B"], 1: ["A", "B"]}, members)
print("one order        -> finished", done, "stuck at", stuck)
assert stuck is None and done == ["A", "B"]
"""),
    md("""
The same with threads, closer to real devices: each device is a thread, each collective a
barrier of its members. A barrier that times out tells us the devices would hang forever.
"""),
    code("""
import threading

def run_threads(queues, members, timeout=0.5):
    barriers = {c: threading.Barrier(len(ds), timeout=timeout) for c, ds in members.items()}
    reached = {d: [] for d in queues}
    def device(d):
        for c in queues[d]:
            try:
                barriers[c].wait()
            except threading.BrokenBarrierError:
                return                         # the rendezvous never completed
            reached[d].append(c)
    threads = [threading.Thread(target=device, args=(d,)) for d in queues]
    for t in threads: t.start()
    for t in threads: t.join(timeout * 4)
    return reached

hung = run_threads({0: ["A", "B"], 1: ["B", "A"]}, members)
fine = run_threads({0: ["A", "B"], 1: ["A", "B"]}, members)
print("different orders:", hung, "  one order:", fine)
assert hung == {0: [], 1: []} and fine == {0: ["A", "B"], 1: ["A", "B"]}
"""),
    md("""
## The gang scheduler gives one order

`pwkernel.runtime.scheduler.GangScheduler` is the real island scheduler as a pure state
machine: events in (`Submit`, `Finished`, ...), decisions out (`Launch`). It gives all devices
of a computation to it together and emits launches in **one sequence**, so every device sees
the computations in the same order, whatever order they arrived in.

Reading each device's queue off that one sequence makes the queues agree *by construction*, so
they can never deadlock in the model above. What the scheduler itself must get right is the
*gang*: it launches a computation only once all its devices are free (or busy only with the
computation's own producers, which it runs after anyway), so no device ever holds two unrelated
computations at once. `gang_order` checks that at every decision and counts the launches that
found a device busy.
"""),
    code("""
from pwkernel.runtime.scheduler import Finished, GangScheduler, Launch, Submit

def gang_order(arrivals, members, devices, scheduler=GangScheduler):
    # Feed the computations to one scheduler in arrival order; finish the oldest running one
    # until all ran. Returns each device's queue (read off the single launch sequence) and
    # how many launches found one of their devices busy with another computation.
    gs = scheduler(devices=devices)
    ids = {c: i for i, c in enumerate(members)}
    names = {i: c for c, i in ids.items()}
    on = {d: set() for d in devices}             # device -> computations running there
    order, running, busy_launches = [], [], 0

    def launched(decisions):
        nonlocal busy_launches
        for t in (d.task for d in decisions if isinstance(d, Launch)):
            busy_launches += any(on[d] for d in members[names[t]])
            for d in members[names[t]]:
                on[d].add(t)
            order.append(t)
            running.append(t)

    launched(gs.handle(*[Submit(ids[c], members[c], ready=True) for c in arrivals]))
    while running:
        t = running.pop(0)
        for d in members[names[t]]:
            on[d].discard(t)
        launched(gs.handle(Finished(t, 0.001)))
    return {d: [names[t] for t in order if d in members[names[t]]] for d in devices}, busy_launches

queues, busy = gang_order(["B", "A"], members, devices=(0, 1))
print("gang-scheduled queues:", queues, " launches onto a busy device:", busy)
print("result:", run_queues(queues, members))
assert busy == 0
"""),
    md("""
Now many collectives on random subsets of four devices, arriving in random orders. With each
device running them in the order *it* saw them arrive, a deadlock is the rule rather than the
exception. Through the gang scheduler every queue is cut from one sequence, so none deadlock
(that holds by construction and is only printed); what is checked is that no launch ever found
a device busy.
"""),
    code("""
rng = np.random.default_rng(0)
devices = (0, 1, 2, 3)
trials, own_order_hangs, gang_hangs, gang_busy = 200, 0, 0, 0
workloads = []
for _ in range(trials):
    names = [f"c{i}" for i in range(6)]
    mem = {c: tuple(sorted(rng.choice(4, size=int(rng.integers(2, 5)), replace=False).tolist()))
           for c in names}
    workloads.append((list(rng.permutation(names)), mem))
    # every device sees the programs arrive in its own order
    own = {d: [c for c in rng.permutation(names) if d in mem[c]] for d in devices}
    own_order_hangs += run_queues(own, mem)[1] is not None
    gang, busy = gang_order(*workloads[-1], devices)
    gang_hangs += run_queues(gang, mem)[1] is not None
    gang_busy += busy
print(f"{trials} random workloads: per-device order deadlocked {own_order_hangs} times; "
      f"gang scheduler: {gang_hangs} deadlocks, {gang_busy} launches onto a busy device")
assert own_order_hangs > 0 and gang_busy == 0
"""),
    md("""
The check can fail: a scheduler that ignores busy devices (the device test switched off)
launches computations on top of each other, and the count says so.
"""),
    code("""
class Careless(GangScheduler):
    def _devices_free(self, t):
        return True

careless = sum(gang_order(*w, devices, scheduler=Careless)[1] for w in workloads)
print(f"ignoring busy devices: {careless} launches onto a busy device in {trials} workloads")
assert careless > 0
"""),
    md("""
## FIFO vs priority on the real runtime

The island's order is also where policy lives. A *batch* client queues a backlog of
computations on four devices; then an *interactive* client submits one urgent computation.
Under `fifo` it waits behind the whole backlog; under `priority` (higher first) it goes next.
"""),
    code("""
quad = ctl.slice(4, island=0)
body = lambda x: jnp.tanh(x @ x.T @ x) * 0.1 + x * 0.9
work = pw.function(body, slice=quad, in_specs=P(), out_specs=P(), name="batch_step")
urgent = pw.function(body, slice=quad, in_specs=P(), out_specs=P(), name="urgent")
xq = jax.device_put(np.linspace(-1, 1, 384 * 384, dtype=np.float32).reshape(384, 384),
                    NamedSharding(quad.mesh, P()))
work(xq).result(); urgent(xq).result()          # compile outside the measurement
BACKLOG = 24

def experiment(policy):
    ctl.policy = policy
    k = ctl.trace.next_index
    with ctl.client("batch", priority=0):
        backlog = [work(xq) for _ in range(BACKLOG)]
    with ctl.client("interactive", priority=10):
        u = urgent(xq)
    u.result(timeout=60)
    for f in backlog:
        f.result(timeout=60)
    assert ctl.trace.wait_for(k + BACKLOG + 1, timeout=10)
    ran = sorted((e for e in ctl.trace.events(since=k) if e.kind == "compute"),
                 key=lambda e: e.t_start)
    mine = next(e for e in ran if e.name == "urgent")
    return ran.index(mine), mine.t_start - mine.t_submit

view = pw.ScheduleView(ctl, programs=["batch_step", "urgent"], color_by="client", window=0.5)
view
"""),
    code("""
fifo_pos, fifo_wait = experiment("fifo")
prio_pos, prio_wait = experiment("priority")
view.update()
view.stop()
ctl.policy = "fifo"
print(f"fifo:     the urgent computation ran at position {fifo_pos + 1} of {BACKLOG + 1}, "
      f"after waiting {fifo_wait * 1e3:.1f} ms")
print(f"priority: it ran at position {prio_pos + 1}, after waiting {prio_wait * 1e3:.1f} ms")
assert fifo_pos == BACKLOG, "FIFO keeps submission order"
assert prio_pos < fifo_pos, "priority lets it jump the queue"
"""),
    md("## What we measured here"),
    code("""
print(f"2 collectives in different orders on 2 devices: deadlock (both models); "
      f"{own_order_hangs}/{trials} random workloads deadlock with per-device order, none "
      f"through the gang scheduler, which launched onto a busy device {gang_busy} times "
      f"(a careless one: {careless})")
print(f"urgent work behind a backlog of {BACKLOG}: position {fifo_pos + 1} under fifo, "
      f"{prio_pos + 1} under priority; waited {fifo_wait / max(prio_wait, 1e-9):.1f}x longer "
      "under fifo")
"""),
]


# --- 04 -------------------------------------------------------------------------------------
PIPELINE = [
    md("""
# 04 · Pipelining a Transformer

**What the paper found.** A 3B-parameter decoder-only Transformer on 128 TPU cores: SPMD
reached 125.7k tokens/s; pipelined with 4, 8 and 16 stages (16, 32, 64 microbatches) it
reached 133.7k, 132.7k and 131.4k. With a single controller, a GPipe schedule is just a
program: each stage a compiled function on its own devices, every (microbatch, stage) call a
node, and the runtime's transfers carry activations between stages.

Here: a small decoder (4 layers, width 128) on the four devices of island 0.
"""),
    code(SETUP),
    code("""
import inspect
from pwkernel.bench import pipeline as pl
from pwkernel.bench.harness import interleave, paired_ratio, summarize

cfg = pl.ModelConfig(vocab=256, width=128, heads=4, layers=4, seq=64, batch=32)
params = pl.init_params(cfg)
tokens = np.random.default_rng(1).integers(0, cfg.vocab, (cfg.batch, cfg.seq), dtype=np.int32)
print(inspect.getsource(pl.block))
"""),
    md("""
## SPMD: the whole model on four devices

One compiled function, the batch sharded over the slice, the parameters replicated. It returns
each sequence's next-token loss. The model is written for the compiler's sharding propagation
(its embedding lookup gathers with sharded token ids), so its slices have *auto* mesh axes; a
slice's default is what `jax.make_mesh` gives, explicit axes.
"""),
    code("""
quad = ctl.slice(4, island=0, axis_types="auto")
spmd = pw.function(pl.stage_fn(True, True, cfg.heads), slice=quad, in_specs=(P(), P("x")),
                   out_specs=P("x"), name="spmd")
on = lambda vs, tree, spec: jax.device_put(tree, NamedSharding(vs.mesh, spec))
spmd_loss = spmd(on(quad, params, P()), on(quad, tokens, P("x"))).result()
print("per-sequence loss:", spmd_loss.shape, float(spmd_loss.mean()))
"""),
    md("""
## GPipe in one program

Four stages, one device each (the same four devices). The batch is cut into microbatches;
the program calls every stage on every microbatch. The gang scheduler runs stage 1 on
microbatch 0 while stage 0 works on microbatch 1, and so on.
"""),
    code("""
S = 4
stages = [ctl.slice(1, island=0, axis_types="auto") for _ in range(S)]
assert len({d for vs in stages for d in vs.device_ids}) == S, "one device per stage"
stage_fns = [pw.function(pl.stage_fn(s == 0, s == S - 1, cfg.heads), slice=vs,
                         in_specs=(P(), P("x"), P("x")) if s == S - 1 else (P(), P("x")),
                         out_specs=P("x"), name=f"stage{s}") for s, vs in enumerate(stages)]
stage_params = [on(vs, p, P()) for vs, p in zip(stages, pl.split_params(params, S))]

def gpipe_for(M):
    @pw.program(name=f"gpipe_m{M}")
    def gpipe(ps, microbatches):
        losses = []
        for t in microbatches:
            h = stage_fns[0](ps[0], t)
            for s in range(1, S - 1):
                h = stage_fns[s](ps[s], h)
            losses.append(stage_fns[-1](ps[-1], h, t))
        return losses
    micro = [on(stages[0], t, P("x")) for t in np.split(tokens, M)]
    return gpipe, micro

gpipe8, micro8 = gpipe_for(8)
piped_loss = np.concatenate([l.result() for l in gpipe8(stage_params, micro8)])
np.testing.assert_allclose(piped_loss, spmd_loss, rtol=2e-4, atol=2e-5)
print("pipelined loss equals SPMD loss:", float(piped_loss.mean()))
"""),
    md("""
## The bubble

In the schedule below, stage 3 (the last device) starts only after microbatch 0 went through
stages 0 to 2, and stage 0 idles at the end: GPipe's *bubble*. Its share of the time is about
(S − 1) / (M + S − 1), so more microbatches make it smaller.
"""),
    code("""
view = pw.ScheduleView(ctl, programs=["gpipe_m8"], window=0.05)
view
"""),
    code("""
k = ctl.trace.next_index
[l.result() for l in gpipe8(stage_params, micro8)]
view.update()
burst = [e for e in view.history if e.index >= k]
view.window.value = (max(e.t_end for e in burst) - min(e.t_start for e in burst)) * 1.05
view.stop()
"""),
    code("""
def bubble(events):
    comp = [e for e in events if e.kind == "compute"]
    t0, t1 = min(e.t_start for e in comp), max(e.t_end for e in comp)
    idle = [1 - sum(e.t_end - e.t_start for e in comp if e.name == f"stage{s}") / (t1 - t0)
            for s in range(S)]
    return statistics.mean(idle)

programs = {M: gpipe_for(M) for M in (4, 16)}
for gp, mb in programs.values():
    [l.result() for l in gp(stage_params, mb)]          # compile
measured = {M: [] for M in programs}
for r in range(3):
    for M, (gp, mb) in programs.items():
        k = ctl.trace.next_index
        [l.result() for l in gp(stage_params, mb)]
        assert ctl.trace.wait_for(k + S * M, timeout=10)
        measured[M].append(bubble(ctl.trace.events(since=k)))
bubbles = {M: statistics.median(v) for M, v in measured.items()}
for M, b in bubbles.items():
    print(f"M={M:2} microbatches: idle share {b:.2f} (GPipe's ideal {(S - 1) / (M + S - 1):.2f})")
assert bubbles[16] < bubbles[4], bubbles
"""),
    md("""
## Pipelined vs SPMD throughput

The benchmark's own builders (`pwkernel.bench.pipeline`), interleaved in paired rounds: SPMD
on four devices against 2- and 4-stage pipelines on the same four devices.
"""),
    code("""
spmd_rate = pl.spmd_rate(ctl, cfg, 4, params, tokens, 2)
table = {}
for stages_n in (2, 4):
    piped_rate = pl.pipelined_rate(ctl, cfg, 4, stages_n, 2 * stages_n, params, tokens, 2)
    samples = interleave({"spmd": spmd_rate, "pipelined": piped_rate}, rounds=3)
    table[stages_n] = (summarize(samples["spmd"])["median"],
                       summarize(samples["pipelined"])["median"],
                       paired_ratio(samples, "pipelined", "spmd"))
for n, (a, b, r) in table.items():
    print(f"{n} stages x {2 * n} microbatches: SPMD {a / 1e3:.1f}k tok/s, "
          f"pipelined {b / 1e3:.1f}k tok/s, ratio {r:.2f}")
assert all(r > 0.25 for _, _, r in table.values()), table
"""),
    md("""
The paper's pipelines matched SPMD because each stage had its own TPUs working at the same
time. Here the four "devices" are threads sharing two CPU cores: stages cannot truly run in
parallel, so a pipeline can only add its per-node overhead (S × M computations and their
transfers where SPMD has one computation). The correctness and the schedule are the same;
the speed needs real devices (`bench/gpu.sh` runs it on GPUs).

## What we measured here
"""),
    code("""
print(f"pipelined loss equals SPMD loss (mean {float(piped_loss.mean()):.4f})")
print("bubble: " + ", ".join(f"M={M}: {b:.2f}" for M, b in bubbles.items()))
print("pipelined / SPMD tokens per second: " +
      ", ".join(f"{n} stages {r:.2f}" for n, (_, _, r) in table.items()) +
      "  (paper: 1.06 with 4 stages on 128 TPU cores)")
"""),
]


# --- 05 -------------------------------------------------------------------------------------
TENANCY = [
    md("""
# 05 · Multi-tenancy: clients sharing an island

**What the paper found.** Several clients can time-share one island. With four clients the
aggregate throughput was at least that of a dedicated client, with no context-switch cost
while everything fitted in memory, and a trace showed proportional-share interleaving at
weights 1:2:4:8.

Here: four client threads, each inside `ctl.client(name, weight=w)`, queue work on the same
four devices, with `ctl.policy = "share"`.
"""),
    code(SETUP),
    code("""
import threading
from pwkernel.bench import multitenancy
from pwkernel.bench.harness import summarize

quad = ctl.slice(4, island=0)
fn = pw.function(multitenancy.work, slice=quad, in_specs=P(), out_specs=P(), name="tenant_step")
x0 = jax.device_put(multitenancy.matrix(65536 * 4), NamedSharding(quad.mesh, P()))
fn(x0).result()                              # compile before anyone measures
ctl.policy = "share"
WEIGHTS, BACKLOG = (1, 2, 4, 8), 40
"""),
    code("""
view = pw.ScheduleView(ctl, programs=["tenant_step"], color_by="client", window=1.0)
view
"""),
    code("""
names = [f"w{w}" for w in WEIGHTS]
start = ctl.trace.next_index
gate = threading.Barrier(len(WEIGHTS))
outs = {}

def client(name, weight):
    with ctl.client(name, weight=weight):
        gate.wait(30)                        # everyone queues at about the same moment
        outs[name] = [fn(x0) for _ in range(BACKLOG)]

threads = [threading.Thread(target=client, args=(n, w)) for n, w in zip(names, WEIGHTS)]
for t in threads: t.start()
for t in threads: t.join(60)
for futs in outs.values():
    for f in futs:
        f.result(timeout=120)
assert ctl.trace.wait_for(start + len(WEIGHTS) * BACKLOG, timeout=10)
view.update()
ran = [e for e in view.history if e.index >= start]
view.window.value = max(e.t_end for e in ran) - min(e.t_start for e in ran)
view.stop()
"""),
    md("""
Device time per client, counted while every client still had work queued (until the first
one ran dry): that is when proportional share applies.
"""),
    code("""
events = [e for e in ctl.trace.events(since=start) if e.kind == "compute" and e.client in names]
t_begin = min(e.t_start for e in events)
t_stop = min(max(e.t_end for e in events if e.client == n) for n in names)
busy = dict.fromkeys(names, 0.0)
for e in events:
    overlap = min(e.t_end, t_stop) - max(e.t_start, t_begin)
    if overlap > 0:
        busy[e.client] += overlap * len(e.devices)
total = sum(busy.values())
shares = {n: 100 * busy[n] / total for n in names}
targets = {n: 100 * w / sum(WEIGHTS) for n, w in zip(names, WEIGHTS)}
error = max(abs(shares[n] - targets[n]) for n in names)
for n in names:
    print(f"{n}: {shares[n]:5.1f}% of device time (target {targets[n]:5.1f}%)")
print(f"largest gap: {error:.1f} percentage points")
assert [shares[n] for n in names] == sorted(shares.values()), "more weight, more device time"
assert error < 10, f"shares should follow the weights ({error:.1f} points off)"
"""),
    md("""
## Aggregate throughput: one client vs several

`pwkernel.bench.multitenancy.throughput` runs the same total work split over 1, 2 and 4
client threads (each keeping a few programs in flight), interleaved in paired rounds.
"""),
    code("""
ctl.policy = "fifo"
cfg = dict(multitenancy.CONFIGS["quick"], programs=12, rounds=3)
rows, four_vs_one = multitenancy.throughput(ctl, cfg)
for row in rows:
    print(f"{row['clients']} clients: {row['computations_per_s']['median']:.0f} "
          f"computations/s ({row['vs_single']:.2f}x one client)")
assert four_vs_one > 0.6, f"sharing should cost little ({four_vs_one:.2f}x)"
"""),
    md("## What we measured here"),
    code("""
print("shares at weights 1:2:4:8: " + " / ".join(f"{shares[n]:.1f}" for n in names) +
      f" % (targets " + " / ".join(f"{targets[n]:.1f}" for n in names) + ")")
print(f"4 clients vs 1: {four_vs_one:.2f}x aggregate throughput (paper: at least 1)")
"""),
]


# --- 06 -------------------------------------------------------------------------------------
DCN = [
    md("""
# 06 · Two islands over the data-center network

**What the paper found.** Islands are joined by the data-center network (DCN), much slower than
the interconnect inside an island. Large models (64B, 136B parameters) trained data-parallel
across two islands of 1024 chips reached about 97% of the throughput of one island with the
same number of chips.

Here: a small MLP trained data-parallel on two islands (2 devices each, half the batch each),
gradients exchanged over an emulated DCN link, against the same training on four devices of
one island. The link is a constructor argument, so we close the kernel's controller (it has
none) and make our own.
"""),
    code("""
import statistics
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import pwkernel as pw
from pwkernel.bench import dcn
from pwkernel.bench.harness import interleave, paired_ratio, summarize

pw.controller().close()                  # JAX has exactly 8 devices: one controller at a time
link = pw.Link(bandwidth=1e9, latency=20e-6)        # 1 GB/s, 20 us
ctl = pw.Controller(islands=(4, 4), dcn=link)
ctl
"""),
    code("""
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
         for s, xh, yh in zip(halves, np.split(x, 2), np.split(y, 2))]

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
"""),
    md("""
Each island averages its own gradients with the other's, which is the full-batch gradient:
both islands end with the same parameters as the one-island run.
"""),
    code("""
view = pw.ScheduleView(ctl, programs=["two_islands"], window=0.1)
view
"""),
    code("""
k = ctl.trace.next_index
pa, pb = train_two(*parts)
p1 = train_one(put(one, params, P()), put(one, x, P("x")), put(one, y, P("x")))
pa, pb, p1 = ({n: f.result(timeout=60) for n, f in p.items()} for p in (pa, pb, p1))
for name in p1:
    np.testing.assert_allclose(pa[name], p1[name], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(pb[name], p1[name], rtol=1e-4, atol=1e-6)
view.update()
burst = [e for e in view.history if e.index >= k]
view.window.value = max(e.t_end for e in burst) - min(e.t_start for e in burst)
view.stop()
crossed = [e for e in burst if e.link == "dcn"]
print(f"same parameters on both islands and on one island; {len(crossed)} DCN transfers, "
      f"{sum(e.nbytes for e in crossed) / 1e6:.2f} MB")
for e in crossed:        # the emulated link holds each transfer to its modelled time
    assert e.t_end - e.t_start >= link.duration(e.nbytes) - 1e-9, e
"""),
    md("""
## Throughput vs one island, and what the bandwidth does

`pwkernel.bench.dcn.variants` builds both trainings on a controller; one controller per
emulated bandwidth, rounds interleaved. A slow link makes every step wait for its gradients.
"""),
    code("""
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
"""),
    md("""
On this machine the two islands' eight "devices" share two CPU cores, and a two-island step
has four computations and two DCN transfers where one island has one computation, so the
ratio stays below the paper's 0.97 even on a fast link; the direction (bandwidth matters,
and a fast link hides most of it) is the paper's. `docs/benchmarks.md` has the full sweep.

## What we measured here
"""),
    code("""
print(f"two islands / one island: {slow['ratio']:.2f} at 30 MB/s, {fast['ratio']:.2f} at "
      "10 GB/s (paper: ~0.97 over the data-center network)")
"""),
]


# --- 07 -------------------------------------------------------------------------------------
RAY = [
    md("""
# 07 · Scale out: islands on a Ray cluster

**What the paper found.** Pathways keeps *one* controller however many islands it drives:
islands are joined by the data-center network, the controller sends each island its part of a
program, and bytes go island to island. Two islands of 1024 chips over DCN reached about 97%
of one island's throughput. The paper also measured Ray itself as a dispatch substrate: about
10x more overhead per computation than Pathways.

Here the same programs run with each island in its own **process**: a Ray actor with its own
JAX devices, on a Ray cluster (a local one on 127.0.0.1 in this notebook; `docs/ray.md` shows
how to point it at a multi-machine GPU cluster). The controller stays in this kernel.
"""),
    code(SETUP.replace("ctl = pw.controller()          # the process-wide controller the kernel hosts\nctl",
                       "import ray, time")),
    code("""
t = time.perf_counter()
rctl = pw.Controller(backend="ray", islands=(2, 2))   # starts a private local Ray cluster
print(f"started in {time.perf_counter() - t:.1f} s:", rctl)
for island in rctl.islands:
    print(" island", island.id, "->", island.actor)
"""),
    md("""
## The same program, islands in other processes

The paper's Figure 2 again. Nothing in it changes: slices, compiled functions and the program
are the same objects as with the local backend. The functions travel to the islands as
serialized `jax.export` artifacts; values stay in the islands until `result()` fetches them.
"""),
    code("""
def figure2(c):
    s0, s1 = c.slice(2, island=0), c.slice(2, island=1)
    a = pw.function(lambda x: x * 2, slice=s0)
    b = pw.function(lambda x: x + 1, slice=s1)
    cc = pw.function(lambda x: x / 2, slice=s1)

    @pw.program
    def f(v):
        x = a(v)
        return b(x), a(cc(x))
    return f

f_ray = figure2(rctl)
y, z = f_ray(np.array([1.0, 2.0]))
print(y.result().tolist(), z.result().tolist())
assert y.result().tolist() == [3.0, 5.0] and z.result().tolist() == [2.0, 4.0]
moved = [e for e in rctl.trace.events() if e.kind == "transfer" and e.link == "dcn"]
print(len(moved), "transfers between islands, e.g.", moved[0].src, "->", moved[0].dst)
assert {(e.src, e.dst) for e in moved} == {(0, 1), (1, 0)}
"""),
    md("""
## Parallel vs sequential dispatch, where dispatch is expensive

With islands in other processes, every message to an island is a remote call. Sequential
dispatch waits for a node's result before it prepares and sends the next: one message per node,
and a round trip to the controller between dependent nodes. Parallel dispatch sends each island
all of a program's nodes in **one message**, ahead of the data, and the island waits for its
inputs itself (a value from the other island is pushed to it, actor to actor). Each island actor
counts the messages with work it received:
"""),
    code("""
def messages(mode):
    rctl.dispatch = mode
    before = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
    y, z = f_ray(np.array([1.0, 2.0]))
    y.run.wait(60)
    after = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
    return [a["messages"] - b["messages"] for a, b in zip(after, before)]

print("messages per island, parallel:  ", messages("parallel"))
print("messages per island, sequential:", messages("sequential"))
assert messages("parallel") == [1, 1]
rctl.dispatch = "parallel"
"""),
    md("""
A chain of 16 small stages alternating between the islands, in paired rounds
(`pwkernel.bench.parallel_dispatch`):
"""),
    code("""
from pwkernel.bench import parallel_dispatch
from pwkernel.bench.harness import interleave, paired_ratio

samples = interleave(parallel_dispatch.variants(rctl, 16, 256, 1, host_input=True), rounds=7)
speedup = paired_ratio(samples, "parallel", "sequential")
for mode, rates in samples.items():
    print(f"{mode:10} {statistics.median(rates):7.0f} stages/s")
print(f"parallel / sequential: {speedup:.2f}x")
assert speedup > 1.0
"""),
    md("""
## A lost island, and its recovery

Kill island 0's process. Futures that depend on it fail with `pw.IslandLostError` naming the
island; island 1 keeps working; `rctl.reattach(0)` starts a replacement, and the island's
slices work again.
"""),
    code("""
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
y, z = figure2(rctl)(np.array([1.0, 2.0]))
print(f"reattached in {time.perf_counter() - t:.1f} s:", y.result().tolist(), z.result().tolist())
assert y.result().tolist() == [3.0, 5.0] and z.result().tolist() == [2.0, 4.0]
"""),
    md("""
## What we measured here

The Figure 2 program gave the same answer with islands in other processes, with transfers
between islands in both directions; on this backend, where every node is a remote call,
parallel dispatch beat sequential; a killed island failed exactly the futures that needed it
while the other kept working, and `reattach` brought it back. The numbers of this run:
"""),
    code("""
print(f"Figure 2 across Ray islands: {y.result().tolist()}, {z.result().tolist()}")
print(f"parallel vs sequential dispatch on Ray: {speedup:.2f}x (paired rounds)")
print(f"a lost island: {type(lost).__name__}: {str(lost)[:80]}...")
rctl.close()        # kills the island actors and the private cluster: no processes left
print("closed:", rctl)
"""),
]

NOTEBOOKS = {
    "00_quickstart": QUICKSTART,
    "01_single_controller_and_futures": FUTURES,
    "02_parallel_async_dispatch": PARALLEL,
    "03_gang_scheduling": GANG,
    "04_pipelining": PIPELINE,
    "05_multi_tenancy": TENANCY,
    "06_two_islands_dcn": DCN,
    "07_scale_out_with_ray": RAY,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (without outputs), with the pwkernel kernelspec."""
    nb = nbformat.v4.new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"    # stable ids: rebuilding changes nothing
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in NOTEBOOKS:
        path = HERE / f"{name}.ipynb"
        text = render(name)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print("out of date (run: .venv/bin/python notebooks/_build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 10 · One pool, many notebooks: a classroom on one machine
#
# **What the paper found.** In Pathways many client programs share the accelerators. Each
# client is a single controller of its own, but the resource manager and **one gang scheduler
# per island** are shared services: the island's scheduler puts every client's computations
# into one order. Accelerators run kernels in the order they get them and a collective waits
# for all its devices, so two clients whose programs reach shared devices in different orders
# would deadlock; with one order per island they cannot. The same scheduler shares the island
# between clients in proportion to their weights (the paper's trace at weights 1:2:4:8), and a
# client's buffers carry its label, so what a failed client held is collected.
#
# Until tutorial 09, one kernel was one controller that owned its devices. Here a **pool**
# (`python -m pwkernel.pool`, `docs/pool.md`) holds the devices: a Ray cluster on 127.0.0.1
# with one long-lived island actor per island, each with its devices, every tenant's buffers
# and the island's gang scheduler. This kernel (the teacher) and two other processes (two
# students) attach to it, each keeping its own controller, and share the islands.

# %%
import atexit
import inspect
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

import pwkernel as pw
from pwkernel.backends.ray import poolfile, tenancy
from pwkernel.bench import pool as poolbench
from pwkernel.pool import head, service

T0 = time.perf_counter()
NAME = f"classroom-{os.getpid()}"      # a pool of our own (its name keys its files and actors)
record = service.start(NAME, (4, 2), lease=5.0)   # = python -m pwkernel.pool start ...
atexit.register(lambda: poolfile.load(NAME) and service.stop(NAME))  # if the kernel ends first
print(f"pool {NAME!r} started in {time.perf_counter() - T0:.0f} s at {record['address']}")
print("token file:", record["token_path"], oct(os.stat(record["token_path"]).st_mode & 0o777))
print(service.attach_hint(NAME, record["address"]))

# %% [markdown]
# The pool runs on its own now: `start` returned, and the islands live in processes of the
# pool's cluster, not of this kernel. Its Ray servers listen on the loopback address only, and
# a connection needs the token in that owner-only file; controllers on this machine find it
# from the pool's name.
#
# ## A program with a collective on each island
#
# `collectives` builds the program every student runs: a `psum` over a slice of island 0, an
# `all_gather` of twice that over a slice of island 1, and a `psum` back on island 0. Each
# participant gets its own slices, and they **overlap**: the teacher sums over devices 0-3,
# Anna over 1-2, Ben over 2-3, and all three gather over island 1's devices 4-5.

# %%
def collectives(ctl, d0, d1):
    """A psum over devices ``d0`` (island 0), an all_gather over ``d1`` (island 1) and a psum
    again; returns the program, six inputs and the exact answer for an input."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import pwkernel as pw

    s0, s1 = ctl.slice(len(d0), devices=d0), ctl.slice(len(d1), devices=d1)
    total = pw.function(jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=s0.mesh,
                                      in_specs=P("x"), out_specs=P()),
                        slice=s0, in_specs=P("x"), out_specs=P(), name="psum")
    gather = pw.function(jax.shard_map(lambda b: jax.lax.all_gather(b * 2, "x", tiled=True),
                                       mesh=s1.mesh, in_specs=P("x"), out_specs=P(),
                                       check_vma=False),
                         slice=s1, in_specs=P("x"), out_specs=P(), name="all_gather")

    @pw.program
    def step(v):
        return total(gather(total(v)))

    def expected(v):
        once = v.reshape(len(d0), -1).sum(0)
        return (2 * once).reshape(len(d0), -1).sum(0)

    runs = [np.arange(64, dtype=np.float32) + 100 * i for i in range(6)]
    return step, runs, expected


# %% [markdown]
# ## Two students, each a process of its own
#
# A student is a notebook like this one; here it is a short script (the function below, with
# `collectives`, written to a file) that attaches to the pool by name and then does what the
# teacher says, one command per line: run its collectives, keep the devices busy, hold some
# memory, or quit. Nothing in it knows about the other tenants.

# %%
def student():
    """Attach to pool argv[2] as tenant argv[1] (weight argv[3], slices argv[4], argv[5]) and
    answer each command read from stdin with one JSON line."""
    import json
    import sys

    import numpy as np

    import pwkernel as pw
    from pwkernel.bench.pool_tenant import chain, held, step_function

    name, pool, weight, d0, d1 = sys.argv[1:6]
    ctl = pw.Controller(backend="ray", pool=pool, tenant=name, weight=float(weight))
    step, runs, expected = collectives(ctl, [int(d) for d in d0.split(",")],
                                       [int(d) for d in d1.split(",")])
    busy = step_function(ctl, 4, f"busy-{name}")   # a product and a psum on island 0
    x = busy(np.ones((4 * 160, 160), np.float32))
    step(runs[0]).result(120)                        # compiled before the race
    kept = []
    print(json.dumps({"ready": name}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "collectives":                # every run submitted before any is read
            outs = [(v, step(v)) for v in runs]
            exact = [bool(np.array_equal(np.asarray(o.result(120)), expected(v)))
                     for v, o in outs]
            print(json.dumps({"exact": exact}), flush=True)
        elif command == "busy":
            x, steps, _ = chain(busy, x, 8, seconds=float(args[0]))
            print(json.dumps({"steps": steps}), flush=True)
        elif command == "hold":
            kept = held(ctl, 8 << 20)
            print(json.dumps({"holding": len(kept) * (8 << 20)}), flush=True)
        elif command == "quit":
            break
    ctl.close()


script = Path(tempfile.mkdtemp(prefix="classroom-")) / "student.py"
script.write_text(inspect.getsource(collectives) + "\n\n" + inspect.getsource(student)
                  + "\n\nstudent()\n")
SEATS = {"anna": (2, "1,2", "4,5"), "ben": (4, "2,3", "4,5")}   # weight, slices
students = {name: poolbench.Process(name, [sys.executable, str(script), name, NAME, str(w),
                                           d0, d1])
            for name, (w, d0, d1) in SEATS.items()}

# %% [markdown]
# While the students start, this kernel attaches too: `pool=` names the pool (its address
# and token come from its file), `tenant=` the name the others see, `weight=` its share.

# %%
# Run again, this cell would leave the controller it made before attached to the pool (two
# teachers): close that one first.
if isinstance(previous := globals().get("ctl"), pw.Controller):
    previous.close()
t = time.perf_counter()
ctl = pw.Controller(backend="ray", pool=NAME, tenant="teacher", weight=1)
print(f"attached in {time.perf_counter() - t:.1f} s:", [len(i.devices) for i in ctl.islands],
      "devices per island")
step, runs, expected = collectives(ctl, [0, 1, 2, 3], [4, 5])
step(runs[0]).result(120)

# %%
for s in students.values():
    print(s.answer())                 # {"ready": ...} once attached and compiled
print(sorted(t["name"] for t in ctl.executor.status()["pool"]["tenants"]))
islands = tenancy.find_islands(NAME)  # the pool's island actors, to read their launch logs

# %% [markdown]
# ## Overlapping collectives from three controllers
#
# Go: each student submits its six runs at once, and so does the teacher. Three controllers,
# three traces, but on each island one scheduler takes every tenant's computations and issues
# them in **one order**, handing the shared devices from tenant to tenant.

# %%
before = [ray.get(a.pool_status.remote())["launches"] for a in islands]
t_go = time.perf_counter()
for s in students.values():
    s.send("collectives")
mine = [(v, step(v)) for v in runs]
exact = {"teacher": [bool(np.array_equal(np.asarray(o.result(120)), expected(v)))
                     for v, o in mine]}
exact |= {name: s.answer()["exact"] for name, s in students.items()}
print(f"18 programs from 3 controllers in {time.perf_counter() - t_go:.2f} s; exact:", exact)
assert all(all(e) for e in exact.values())

# %% [markdown]
# Each island keeps a **launch log**: every operation it issued, in its one issue order, with
# the tenant it belongs to. Plotted, each row is a device and each bar a computation, coloured
# by tenant: on a shared device the bars of different tenants never overlap, because the
# island's scheduler never lets two tenants' collectives interleave.

# %%
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure

from pwkernel.viz.bokeh_model import EchoFreeBokehModel, ensure_bokehjs


def island_logs(since):
    return {i: ray.get(a.launches.remote(since[i])) for i, a in enumerate(islands)}


def schedule(logs, title):
    first = {0: 0, 1: len(ctl.islands[0].devices)}
    t0 = min(r["t_start"] for log in logs.values() for r in log if r["t_start"] is not None)
    cols = poolbench.schedule_columns(logs, first, t0)
    colors = {"teacher": "#0072B2", "anna": "#E69F00", "ben": "#009E73"}
    cols["color"] = [colors.get(n, "#999999") for n in cols["tenant"]]
    fig = figure(height=240, width=720, title=title, x_axis_label="seconds",
                 y_axis_label="device", tooltips=[("tenant", "@tenant"), ("", "@name")])
    fig.quad(left="left", right="right", bottom="bottom", top="top", color="color",
             legend_field="tenant", source=ColumnDataSource(cols))
    fig.y_range.flipped = True
    return EchoFreeBokehModel(fig)


ensure_bokehjs()
logs = island_logs(before)
for island, log in logs.items():
    launched = [r["t_launch"] for r in log]
    assert launched == sorted(launched) and all(r["ok"] for r in log)   # one issue order
    assert poolbench.overlaps(log) == [], island                         # gangs never mixed
    print(f"island {island}: {len(log)} operations from",
          sorted({r["tenant"] for r in log if r["kind"] == "compute"}))
schedule(logs, "three tenants' collectives on one pool")

# %% [markdown]
# ## Proportional share between notebooks
#
# The islands' policy is `share`: when several tenants have work waiting, the scheduler picks
# the one furthest below its weight's share of device time. Anna has weight 2, Ben 4, the
# teacher 1. For three seconds everyone keeps a chain of steps queued on all of island 0; the
# device time each got, counted from the island's own log while all three were busy:

# %%
from pwkernel.bench.pool_tenant import chain, step_function

busy = step_function(ctl, 4, "busy-teacher")
x = busy(np.ones((4 * 160, 160), np.float32))
x.result(120)
before = [ray.get(a.pool_status.remote())["launches"] for a in islands]
for s in students.values():
    s.send("busy 3")
x, steps, _ = chain(busy, x, 8, seconds=3.0)
print({"teacher": steps} | {name: s.answer()["steps"] for name, s in students.items()},
      "steps")
weights = {"teacher": 1} | {name: seat[0] for name, seat in SEATS.items()}
log = island_logs(before)[0]
seconds = poolbench.busy_window_device_time(log, list(weights))
share = {n: 100 * seconds[n] / sum(seconds.values()) for n in weights}
target = {n: 100 * w / sum(weights.values()) for n, w in weights.items()}
for n in weights:
    print(f"{n:8} weight {weights[n]}: {share[n]:5.1f}% of island 0 (target {target[n]:4.1f}%)")
share_error = max(abs(share[n] - target[n]) for n in weights)
assert share["ben"] > share["anna"] > share["teacher"], share
schedule({0: log}, "island 0 shared at weights 1:2:4")

# %% [markdown]
# The pool's own view of its tenants (`ctl.executor.status()["pool"]`, also what
# `%pathways status` and `python -m pwkernel.pool status` print): device time and share since
# each attached, bytes held, and the devices its work used on each island, as positions on
# that island (island 1's devices 4 and 5 are its positions 0 and 1). (A function's first run
# on an island includes compiling it there, and the pool counts that as device time too.)

# %%
view = ctl.executor.status()["pool"]
for t in view["tenants"]:
    print(f"{t['name']:8} {t['device_seconds']:6.2f} device-s  {100 * t['share']:5.1f}%  "
          f"{t['bytes'] / 2**20:6.2f} MiB  devices {t['devices']}" + ("  (me)" * t["me"]))

# %% [markdown]
# ## A student's kernel dies
#
# Ben makes 8 MiB on each island, then his process is killed (`kill -9`: nothing of his runs
# to say goodbye). Nobody unregisters him; the pool notices that he has been silent for its
# lease (5 s: a controller polls its islands every second while it is open) and drops him: his
# queued work is cancelled and his buffers freed. Meanwhile the teacher and Anna carry on.

# %%
ben_holds = students["ben"].ask("hold")["holding"]
print("ben holds", ben_holds / 2**20, "MiB")
unowned, held = poolbench.unowned_bytes(islands)   # bytes beyond the tenants' buffers, and each's
assert ben_holds <= held["ben"] < ben_holds + 2**20, held   # the pool counts what he holds
os.kill(students["ben"].proc.pid, signal.SIGKILL)
t_kill = time.monotonic()
students["anna"].send("collectives")
carry_on = [bool(np.array_equal(np.asarray(step(v).result(120)), expected(v))) for v in runs]
assert all(carry_on) and all(students["anna"].answer()["exact"])
print(f"teacher and anna ran their collectives {time.monotonic() - t_kill:.1f} s after the kill")
# read the pool's status until it dropped ben and none of his bytes is left on the islands
reclaim_s = poolbench.wait_reclaimed(islands, "ben", unowned, t_kill, timeout=60)["reclaim_s"]
_, now_held = poolbench.unowned_bytes(islands)
print(f"ben dropped and all his {held['ben'] / 2**20:.1f} MiB (those values, and his busy loop's "
      f"state) freed {reclaim_s:.1f} s after the kill;"
      f" tenants now: {sorted(now_held)}")
assert np.array_equal(np.asarray(step(runs[0]).result(120)), expected(runs[0]))

# %% [markdown]
# ## Class dismissed
#
# Anna quits (her controller closes: it unregisters at once), the teacher closes, and the pool
# stops: its island actors and every process of its Ray cluster end.

# %%
students["anna"].end()
students["ben"].end()
ctl.close()
done = service.stop(NAME)
print(f"stopped: {len(done['processes_ended'])} processes of the pool ended")
assert head.processes(record) == [], "no process of the pool is left"
shutil.rmtree(script.parent)          # the students' script

# %% [markdown]
# ## What we measured here
#
# One pool served three controllers in three processes. Their programs, with collectives on
# overlapping slices of both islands, all gave exact results and never deadlocked: each
# island's launch log shows one issue order and no two tenants' computations at the same time
# on a shared device. While all three kept island 0 busy, device time followed the weights
# 1:2:4. A student killed with `kill -9` was dropped after the lease and his memory freed,
# while the others carried on. The numbers of this run:

# %%
print(f"exact collectives from 3 tenants: {sum(map(sum, exact.values()))} of 18")
print("shares at weights 1:2:4 (teacher, anna, ben): "
      + " / ".join(f"{share[n]:.1f}" for n in weights)
      + " % (targets " + " / ".join(f"{target[n]:.1f}" for n in weights)
      + f"), largest gap {share_error:.1f} points")
print(f"a killed tenant's memory freed {reclaim_s:.1f} s after the kill (lease 5 s)")
print(f"the whole tutorial: {time.perf_counter() - T0:.0f} s")

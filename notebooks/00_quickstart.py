# ---
# jupyter:
#   kernelspec:
#     display_name: Pathways (JAX)
#     language: python
#     name: pwkernel
# ---

# %% [markdown]
# # 00 · Quick start: one controller, many devices
#
# **What the paper found.** Pathways (Barham et al., MLSys 2022) goes back to a *single
# controller*: one Python program describes a dataflow graph of compiled functions placed on
# sets of accelerators, and the runtime dispatches it asynchronously. It still reaches about
# 100% accelerator utilization for plain SPMD on 2048 TPUs. Its Figure 2 is a program of
# three compiled functions (`jax.pmap`s, each on its own set of two devices), which gives
# `([3., 5.], [2., 4.])` for the input `[1., 2.]`.
#
# This notebook runs that program here: the host CPU split into two *islands* of four virtual
# devices, with `a` on two devices of island 0 and `b` and `c` sharing two devices of island 1.
# It uses the **Pathways (JAX)** kernel, which has already run `%load_ext pwkernel`.

# %%
# %load_ext pwkernel

# %% [markdown]
# Loading twice is harmless: IPython says the extension is loaded already (this kernel loads it
# when it starts). Now the controller and its devices:

# %%
import time

import jax.numpy as jnp
import numpy as np

import pwkernel as pw

ctl = pw.controller()          # the process-wide controller the kernel hosts
ctl

# %%
for isl in ctl.islands:
    print(f"island {isl.id}: {len(isl.devices)} {isl.platform} devices {isl.device_ids}")
sizes = [len(isl.devices) for isl in ctl.islands]   # this notebook: islands (4, 4)
assert len(sizes) >= 2 and sizes[0] >= 4 and sizes[1] >= 2, (
    f"this notebook needs two islands, of 4 and 2 devices at least; this kernel has {sizes}."
    " Start Jupyter with PWKERNEL_ISLANDS=4,4, or restart the kernel and run "
    "pw.controller(islands=(4, 4)) first")

# %% [markdown]
# ## Slices
#
# A *virtual slice* is a set of devices with a mesh shape, handed out by the resource manager.
# Functions are compiled for a slice; the runtime maps it to physical devices.

# %%
s0 = ctl.slice(2, island=0)
s1 = ctl.slice(2, island=1)
print(s0, "devices", s0.device_ids)
print(s1, "devices", s1.device_ids)

# %% [markdown]
# ## The Figure 2 program
#
# `a`, `b`, `c` are compiled functions (`jax.jit` with shardings over their slice). Inside
# `@pw.program` the three calls are *traced* into one dataflow graph and submitted at once; the
# runtime inserts the transfers between the two islands. `f` returns futures once the program
# is submitted, without waiting for its computations. `print(y)` would wait (it prints the
# value), so the cell reads `y`'s state the moment `f` returns, and only then waits. This
# program is tiny: its computations take less time than submitting them (the trace below
# times each; this first call also traces and compiles), so it may have ended by then
# (`done`); the futures section below shows calls that return while their work still runs.

# %%
a = pw.function(lambda x: x * 2, slice=s0, name="a")
b = pw.function(lambda x: x + 1, slice=s1, name="b")
c = pw.function(lambda x: x / 2, slice=s1, name="c")

@pw.program
def f(v):
    x = a(v)
    return b(x), a(c(x))

start = ctl.trace.next_index
t0 = time.perf_counter()
y, z = f(np.array([1.0, 2.0]))
returned_ms = (time.perf_counter() - t0) * 1e3
at_return = (y.state.value, repr(y.run))      # read at once, before anything waits
print(f"f returned after {returned_ms:.1f} ms; then y was {at_return[0]}, its run {at_return[1]}")
print("shape, dtype, sharding known before the value:", y.shape, y.dtype, y.sharding.spec)
print("y is a future:", repr(y))               # repr never waits; print(y) waits for the value
y_value = y.result()                          # the first wait
print(f"y's value {y_value} came {(time.perf_counter() - t0) * 1e3 - returned_ms:.2f} ms after f"
      " returned")

# %%
z_value = z.result()
print("y =", y_value, " z =", z_value)
np.testing.assert_allclose(y_value, [3.0, 5.0])
np.testing.assert_allclose(z_value, [2.0, 4.0])

# %% [markdown]
# ## What ran where
#
# Every computation and transfer is an event on one clock. The host argument was copied onto
# `a`'s devices, `x` crossed to the other island once (`b` and `c` both read it there), and
# `c(x)` crossed back to `a`'s island.

# %%
assert ctl.trace.wait_for(start + 1, timeout=10)
events = ctl.trace.events(since=start)
for e in events:   # a transfer from the host has no source island (src None)
    where = (f"{'host' if e.src is None else e.src}->{e.dst} ({e.link})"
             if e.kind == "transfer" else f"island {e.island}")
    print(f"{e.kind:9} {e.name:14} {where:15} devices {e.devices}  "
          f"{(e.t_end - e.t_start) * 1e6:7.1f} us")
computations = [e for e in events if e.kind == "compute"]
crossings = [e for e in events if e.kind == "transfer" and e.link == "dcn"]
assert len(computations) == 4, "a, b, c and a again"
assert {e.program for e in computations} == {"f"} and len({e.program_id for e in events}) == 1
# x to island 1 once (b and c share it), c(x) back to island 0
assert sorted((e.src, e.dst) for e in crossings) == [(0, 1), (1, 0)], crossings

# %% [markdown]
# ## Futures
#
# A future stands for a sharded buffer that may not exist yet. It can be passed into the next
# program before it resolves; the runtime chains the work and the caller never waits.

# %%
heavy = pw.function(lambda m: jnp.tanh(m @ m) / m.shape[0], slice=s0, name="heavy")
m = jnp.ones((1024, 1024), jnp.float32)
heavy(heavy(m)).result()             # compile first (both input layouts): now a call only submits
t0 = time.perf_counter()
first = heavy(m)
second = heavy(first)                # `first` is still running: no wait here
returned_ms = (time.perf_counter() - t0) * 1e3
states = (first.state.value, second.state.value)  # read before anything waits
print(f"both calls returned after {returned_ms:.1f} ms: first {states[0]}, second {states[1]}")
second_value = second.result(timeout=60)
print(f"second's value came {(time.perf_counter() - t0) * 1e3:.1f} ms after the first call")
assert second_value.shape == first.shape == (1024, 1024)
print("second resolved:", second.state, "mean", float(second_value.mean()))

# %% [markdown]
# ## A live schedule
#
# `pw.ScheduleView` draws one row per device, grouped by island: bars are computations,
# hatched strips and lines are transfers. It follows the trace while programs run.

# %%
view = pw.ScheduleView(ctl, programs=["f"], window=0.05)
view

# %%
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

# %% [markdown]
# ## The same thing with the magics
#
# `%%pathways` turns a plain JAX cell into one program on a slice: names bound in the cell
# hold futures.

# %%
# %pathways slice quick 4 --island 0

# %%
# %%pathways --slice quick
xs = jnp.arange(16.0)
ys = jnp.sin(xs) * 2
total = ys.sum()

# %%
print(type(total).__name__, total.shape, "=", float(total.result()))
np.testing.assert_allclose(float(total.result()), float((np.sin(np.arange(16.0)) * 2).sum()),
                           rtol=1e-5)

# %% [markdown]
# ## What we measured here

# %%
view.stop()
print(f"Figure 2: y = {y_value.tolist()}, z = {z_value.tolist()} (paper: [3, 5], [2, 4])")
print(f"one program = {len(computations)} computations + {len(events) - len(computations)} "
      f"transfers, {len(crossings)} of them between islands")
print(f"20 programs in flight: {span * 1e3:.1f} ms on this machine")

"""Correctness on the accelerator at hand, before its benchmarks: what the test suite checks on
virtual CPU devices, checked once on the real devices (`bench/gpu.sh` runs it first).

    python bench/gpu_checks.py [--json PATH]     # ~1 minute; exit 1 if a check failed
    PWKERNEL_ISLANDS=1 python bench/gpu_checks.py  # here: one island of one device, as one GPU

Each check compares pwkernel with plain ``jax.jit`` on the same devices and inputs (values,
shardings, the caller's arrays left alive), or checks that a failure stays in its futures and
that closing the controller gives the devices' memory back. Every check runs even when one
before it failed; the JSON holds each one's verdict and details. On a machine without
accelerators it runs on the host CPU and says so.

The controller's islands are ``PWKERNEL_ISLANDS``'s, else ``islands=None``: the accelerators
grouped by host (one island of one device on one GPU), or (4, 4) on the host CPU. Never
``pw.Controller()``'s default (4, 4), which a machine with fewer than 8 GPUs refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import jax

jax.config.update("jax_num_cpu_devices", 8)  # (only used when there is no accelerator)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import pwkernel as pw  # noqa: E402
from pwkernel.runtime.resources import islands_from_env  # noqa: E402
from pwkernel.train import transformer as T  # noqa: E402

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def step(x, w):
    return jnp.tanh(x @ w) @ w.T


def inputs(ctl, dtype) -> tuple:
    vs = ctl.slice(1, island=0)
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((512, 256)).astype(dtype), vs.devices[0])
    w = jax.device_put((rng.standard_normal((256, 256)) / 16).astype(dtype), vs.devices[0])
    return vs, x, w


def close(a, b, rtol) -> float:
    """The largest difference relative to the largest value (normwise, not per element: two
    compilations of a matmul on a GPU may pick different algorithms, whose sums differ in their
    last bits, and an element near zero would turn that into a large relative difference)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    err = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
    assert err <= rtol, f"largest relative difference {err:.3g} > {rtol}"
    return err


@check
def function_matches_jit(ctl) -> dict:
    out = {}
    for dtype, rtol in ((np.float32, 1e-5), (jnp.bfloat16, 1e-2)):
        vs, x, w = inputs(ctl, dtype)
        got, want = pw.function(step, slice=vs)(x, w).result(), jax.jit(step)(x, w)
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding,
                                                                         want.sharding)
        assert got.dtype == want.dtype and not x.is_deleted() and not w.is_deleted()
        out[str(np.dtype(dtype))] = close(got, want, rtol)
    return {"largest_relative_difference": out}


@check
def chained_program_matches_jit(ctl) -> dict:
    vs, x, w = inputs(ctl, np.float32)
    f = pw.function(step, slice=vs)

    @pw.program
    def chain(x, w):
        for _ in range(16):
            x = f(x, w)
        return x

    want = x
    for _ in range(16):
        want = jax.jit(step)(want, w)
    return {"largest_relative_difference": close(chain(x, w).result(), want, 1e-4)}


@check
def donation_only_when_asked(ctl) -> dict:
    vs, x, w = inputs(ctl, np.float32)
    pw.function(step, slice=vs)(x, w).result()
    kept = not x.is_deleted()
    y = x + 0
    pw.function(step, slice=vs, donate_argnums=0)(y, w).result()
    assert kept and y.is_deleted(), (kept, y.is_deleted())
    return {}


@check
def a_failure_stays_in_its_future(ctl) -> dict:
    vs, x, w = inputs(ctl, np.float32)

    def bad(x):
        jax.debug.callback(lambda _: 1 / 0, x)
        return x * 2

    fut = pw.function(bad, slice=vs)(x)
    try:
        fut.result()
    except Exception as e:  # noqa: BLE001 (any error is the point: it reached the future)
        failed = type(e).__name__
    else:
        raise AssertionError("the failing function's future gave a value")
    close(pw.function(step, slice=vs)(x, w).result(), jax.jit(step)(x, w), 1e-5)
    return {"error": failed}


@check
def spmd_training_matches_plain_jax(ctl) -> dict:
    cfg = T.Config(vocab=64, width=64, heads=4, layers=2, seq=32)
    stages, opt = T.split(cfg, 1), optax.sgd(0.3, momentum=0.9)
    n = len(ctl.islands[0].devices)
    spmd = pw.train.SPMD(stages, ctl.slice(n, island=0), loss=T.cross_entropy, optimizer=opt)
    state = spmd.init(0)
    params = jax.device_get(pw.train.fetch(state.params))
    full = pw.train.model_loss(stages, T.cross_entropy)

    @jax.jit
    def plain(params, opt_state, x, y):
        value, grads = jax.value_and_grad(full)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state, got, want = opt.init(params), [], []
    for i in range(5):
        x, y = T.batch(cfg, 8 * n, seed=i)
        state, loss = spmd.step(state, (x, y))
        params, opt_state, value = plain(params, opt_state, x, y)
        got.append(float(loss))
        want.append(float(value))
    assert got[-1] < got[0], got
    return {"devices": n, "losses": got, "plain_jax": want,
            "largest_relative_difference": close(got, want, 1e-3)}


def in_use() -> list[int]:
    stats = [d.memory_stats() for d in jax.devices()]
    return [int(s.get("bytes_in_use", 0)) for s in stats if s]


def live() -> dict[int, jax.Array]:
    """The arrays alive on the devices, by id (what every platform can tell, CPU too; held
    here, so no id is reused meanwhile)."""
    return {id(a): a for a in jax.live_arrays()}


def run(json_path: str | None) -> int:
    devices = jax.devices()
    facts = {"platform": devices[0].platform, "devices": [str(d) for d in devices],
             "jax": jax.__version__}
    before, alive_before = in_use(), live()
    ctl = pw.Controller(islands=islands_from_env())
    facts["islands"] = [len(i.devices) for i in ctl.islands]
    results = {}
    for fn in CHECKS:
        t0 = time.perf_counter()
        try:
            results[fn.__name__] = {"ok": True, **fn(ctl)}
        except Exception as e:  # noqa: BLE001 (each check's failure is its verdict)
            results[fn.__name__] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                    "where": traceback.format_exc(limit=-3)}
        results[fn.__name__]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"{fn.__name__:36s} {'ok' if results[fn.__name__]['ok'] else 'FAILED'}",
              flush=True)
    ctl.close()
    import gc

    gc.collect()
    after, left = in_use(), [a for a in jax.live_arrays() if id(a) not in alive_before]
    given_back = {"ok": not left, "arrays_left": [f"{a.dtype}{list(a.shape)}" for a in left]}
    if before and after:  # (CPU devices report no memory statistics)
        given_back.update(ok=not left and sum(after) <= sum(before) + (1 << 20),
                          bytes_in_use_before=before, bytes_in_use_after=after)
    del left
    results["memory_given_back"] = given_back
    print(f"{'memory_given_back':36s} {'ok' if given_back['ok'] else 'FAILED'}")
    report = {"machine": facts, "checks": results}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    failed = [k for k, v in results.items() if not v["ok"]]
    print(f"{facts['platform']}: {len(results) - len(failed)} of {len(results)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write every check's verdict here")
    sys.exit(run(p.parse_args().json))

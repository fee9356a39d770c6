"""What one more output costs a call under JAX's own dispatch: the fence every local launch
returns (``runtime/callbacks.py``, ``LaunchOutputs``), measured without pwkernel.

    .venv/bin/python bench/fence_cost.py

A jitted 256-element step on one device, called in a loop (asynchronous dispatch, each call
reading the last one's output), compiled once as ``x -> y`` and once as ``x -> (y, fence)``
with a one-byte fence. Prints the process CPU per call of each, in microseconds (sorted
rounds), and the difference: a host cost every pwkernel computation pays that
``bench/count_bytecodes.py`` cannot see (it is JAX's and XLA's, not Python's).
"""

from __future__ import annotations

import json
import statistics
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

CALLS, ROUNDS = 3000, 7


def _per_call_us(call, x) -> float:
    y = x
    c0 = time.process_time()
    for _ in range(CALLS):
        y = call(y)
    jax.block_until_ready(y)
    return (time.process_time() - c0) / CALLS * 1e6


def main() -> dict:
    x = jax.device_put(np.ones(256, np.float32), jax.devices()[0])
    plain = jax.jit(lambda v: jnp.tanh(v) * 0.5).lower(x).compile()
    fenced = jax.jit(lambda v: (jnp.tanh(v) * 0.5, jnp.zeros((), jnp.uint8))).lower(x).compile()
    calls = {"plain": plain, "fenced": lambda v: fenced(v)[0]}
    for call in calls.values():  # warm
        _per_call_us(call, x)
    seen: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            seen[name].append(round(_per_call_us(call, x), 2))
    out = {f"{k}_cpu_us": sorted(v) for k, v in seen.items()}
    out["fence_cpu_us"] = round(statistics.median(seen["fenced"])
                                - statistics.median(seen["plain"]), 2)
    return out


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " ")
                            ).parse_args()  # (no options: --help says what it measures)
    print(json.dumps(main(), indent=1))

"""Wall time of one training step as a ``%%pathways`` cell, run five times in an IPython shell
(the first run compiles; the others reuse the executable, ``runtime/compiled.py``).

    .venv/bin/python bench/cell_rerun.py

A two-layer MLP (16 -> 64 -> 1) on a batch of 128, Adam, on a 2-device slice. Prints one
line per run: milliseconds, from running the cell to its loss read on the host.
"""

from __future__ import annotations

import argparse
import time

from IPython.core.interactiveshell import InteractiveShell

SETUP = """
params = {'w1': jnp.ones((16, 64)) * 0.1, 'w2': jnp.ones((64, 1)) * 0.1}
opt = optax.adam(1e-3); opt_state = opt.init(params)
X = np.ones((128, 16), np.float32); Y = np.ones((128, 1), np.float32)
def loss_fn(p, x, y): return jnp.mean((jnp.tanh(x @ p['w1']) @ p['w2'] - y) ** 2)
"""
CELL = """%%pathways --slice s
loss, g = jax.value_and_grad(loss_fn)(params, X, Y)
u, opt_state = opt.update(g, opt_state, params)
params = optax.apply_updates(params, u)
"""


def main() -> list[float]:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " ")).parse_args()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pwkernel")
    ip.run_cell("import jax, jax.numpy as jnp, numpy as np, optax\n%pathways slice s 2")
    ip.run_cell(SETUP)
    out = []
    for i in range(5):
        t = time.perf_counter()
        if not ip.run_cell(CELL).success:
            raise SystemExit("the cell failed")
        float(ip.user_ns["loss"])
        out.append((time.perf_counter() - t) * 1e3)
        print(f"run {i}: {out[-1]:.0f} ms", flush=True)
    return out


if __name__ == "__main__":
    main()

"""What tests in several folders share. ``ROOT`` is the repository's root: every path a test
reads or writes outside tests/ (docs/, notebooks/, extension/, the Makefile) is built from it,
so no test counts its own file's parents.

The modules: ``programs`` (computations and programs on a controller), ``budget`` (the
memory-budget fan-in), ``gang_order`` (the gang scheduler's order, read from its decisions),
``kernel`` (nbclient and jupyter_client on the real ``pwkernel`` kernel), ``shell`` (cells in
an IPython shell), ``jit_cases`` (plain JAX functions and their inputs), ``lab`` and
``sidebar_lab`` (a private JupyterLab and a chromium page, for the browser tests), ``pool``
(a Ray head with token authentication and tenant processes for a device pool, which run
``pool_tenant``), ``doc_images`` (where the browser tests' screenshots go).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

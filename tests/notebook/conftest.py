"""The notebook tests' fixtures: an IPython shell with pwkernel loaded, and a real kernel."""

from __future__ import annotations

import os

import pytest
from IPython.core.interactiveshell import InteractiveShell

from pwkernel.notebook import kernelspec
from tests.helpers.shell import forget_futures


@pytest.fixture
def ip(capsys):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pwkernel")
    shell.run_cell("import jax, numpy as np, jax.numpy as jnp, pwkernel as pw")
    capsys.readouterr()
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "pwkernel")
        forget_futures(shell)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real ``pwkernel`` kernel (its kernelspec written to a temporary JUPYTER_PATH)."""
    from jupyter_client.manager import start_new_kernel

    path = tmp_path_factory.mktemp("jupyter")
    kernelspec.write(path)
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(path) + (os.pathsep + old if old else "")
    try:
        km, kc = start_new_kernel(kernel_name=kernelspec.NAME, startup_timeout=120,
                                  cwd=str(tmp_path_factory.mktemp("cwd")))
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

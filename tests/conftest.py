"""Shared fixtures. JAX gets 8 virtual CPU devices before anything initializes its backend."""

from __future__ import annotations

import os

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)

import pwkernel as pw  # noqa: E402
from pwkernel.bench.figure2 import Figure2, figure2  # noqa: E402


@pytest.fixture
def ctl():
    """A fresh controller: the host as 2 islands x 4 virtual devices, closed afterwards."""
    controller = pw.Controller(islands=(4, 4))
    try:
        yield controller
    finally:
        controller.close()


@pytest.fixture
def fig2(ctl) -> Figure2:
    """The paper's Figure 2 program on ``ctl`` (``pwkernel.bench.figure2``): the one copy the
    tests share; tests on another controller call ``pwkernel.bench.figure2.figure2(other)``."""
    return figure2(ctl)


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """For tests that start the real ``pwkernel`` kernel: the installed kernelspec, or one
    written to a temporary JUPYTER_PATH entry; the embedded default islands (4, 4)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    from pwkernel.notebook import kernelspec

    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PWKERNEL_ISLANDS")}
    try:
        KernelSpecManager().get_kernel_spec(kernelspec.NAME)
    except NoSuchKernel:
        path = tmp_path_factory.mktemp("jupyter")
        kernelspec.write(path)
        old = saved["JUPYTER_PATH"]
        os.environ["JUPYTER_PATH"] = str(path) + (os.pathsep + old if old else "")
    os.environ["PWKERNEL_ISLANDS"] = "4,4"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

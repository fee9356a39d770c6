"""Shared fixtures. JAX gets 8 virtual CPU devices before anything initializes its backend."""

from __future__ import annotations

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)

import pwkernel as pw  # noqa: E402


@pytest.fixture
def ctl():
    """A fresh controller: the host as 2 islands x 4 virtual devices, closed afterwards."""
    controller = pw.Controller(islands=(4, 4))
    try:
        yield controller
    finally:
        controller.close()

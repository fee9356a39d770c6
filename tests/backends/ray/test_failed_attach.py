"""In a fresh Python process (the test process started JAX and Ray long ago): a local cluster
starts with no warning, and a failed first ``%pathways attach ray`` leaves the kernel as it
was: JAX not started and its host device count unchanged, so the local controller (or another
attach) still works."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = """
import os
os.environ["PWKERNEL_ISLANDS"] = "4,4"
import jax
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from jax._src import xla_bridge

count = jax.config.jax_num_cpu_devices
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "pwkernel")
try:
    shell.run_line_magic("pathways", "attach ray --address 127.0.0.1:{port} --islands 3,3")
except UsageError as e:
    assert "could not connect" in str(e), e
else:
    raise AssertionError("the attach should have failed")
import ray
assert not ray.is_initialized()
assert not xla_bridge.backends_are_initialized(), "a failed attach started JAX"
assert jax.config.jax_num_cpu_devices == count
import numpy as np
import pwkernel as pw
ctl = pw.controller()  # the kernel's local controller, on PWKERNEL_ISLANDS
assert ctl.backend == "local" and [len(i.devices) for i in ctl.islands] == [4, 4]
double = pw.function(lambda x: x * 2, slice=ctl.slice(4, island=1))
assert double(np.ones(4)).result(60).tolist() == [2.0] * 4
print("ok")
"""


def runs_ok(script: str, drop: tuple[str, ...] = ("XLA_FLAGS", "RAY_AUTH")):
    """``script`` in a fresh Python process (without the variables starting with ``drop``)
    ends well and prints "ok" last; returns the finished process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    return done


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # (closed again: nothing answers there)


def test_a_failed_attach_leaves_the_kernel_usable():
    runs_ok(SCRIPT.format(port=_closed_port()), drop=("XLA_FLAGS",))


QUIET = """
import os
import jax
jax.config.update("jax_num_cpu_devices", 2)
import pwkernel as pw
from pwkernel.backends.ray import cluster
ctl = pw.Controller(backend="ray", islands=(1,))
assert cluster.token_auth_enabled()
assert ctl.islands[0].devices and os.environ["RAY_AUTH_MODE"] == "token"
ctl.close()
assert "RAY_AUTH_MODE" not in os.environ
print("ok")
"""


def test_a_local_cluster_starts_with_token_auth_and_no_warning():
    """Ray's own default for a new local cluster (token authentication), chosen by pwkernel so
    that Ray prints no warning (in red under a tutorial's cell), and unset again at close."""
    done = runs_ok(QUIET)
    assert "Token authentication" not in done.stderr, done.stderr[-3000:]


NO_SUCH_POOL = """
import os
import jax
jax.config.update("jax_num_cpu_devices", 2)
import numpy as np
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
import pwkernel as pw

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "pwkernel")
shell.run_line_magic("pathways", "attach ray --islands 1")
ctl = pw.controller()
shell.run_line_magic("pathways", "slice r0 1")
r0 = shell.user_ns["r0"]
try:
    shell.run_line_magic("pathways", "attach ray --pool nosuchpool")
except UsageError as e:
    assert "nosuchpool" in str(e), e
else:
    raise AssertionError("attaching to a pool that does not exist should have failed")
assert pw.controller() is ctl and not ctl.closed, "the kernel's controller was left"
assert not r0.released and shell.user_ns["r0"] is r0, "the kernel's slice was released"
double = pw.function(lambda x: x * 2, slice=r0)
assert double(np.ones(2)).result(60).tolist() == [2.0] * 2
ctl.close()
print("ok")
"""


def test_attaching_to_a_pool_that_does_not_exist_leaves_the_ray_kernel_as_it_was():
    """A mistyped ``--pool`` is refused before the kernel's Ray controller is closed and its
    slices released (one Ray connection per process: a pool's tenant closes the old one
    first)."""
    runs_ok(NO_SUCH_POOL)

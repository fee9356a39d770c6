"""A real ``pwkernel`` kernel shut down by its frontend (``KernelManager.shutdown_kernel``)."""

from __future__ import annotations

import psutil
from jupyter_client.manager import KernelManager

from pwkernel.notebook import kernelspec
from tests.helpers.ray_session import session_dir

RAY_CELL = """\
import numpy as np, jax.numpy as jnp, pwkernel as pw
ctl = pw.Controller(islands=(2, 2), backend="ray")
f = pw.function(lambda x: jnp.tanh(x @ x.T), slice=ctl.slice(2, island=0))
x = np.ones((256, 256), np.float32)
f(x).result()
queued = [f(x) for _ in range(20)]
"""


def test_a_kernel_shut_down_under_a_ray_controller_stops_its_cluster_and_exits(kernel_env,
                                                                               tmp_path):
    """ipykernel ends its child processes (the local Ray cluster's GCS and raylet) before
    the interpreter exits; the controller is closed first, so its ``ray.shutdown()`` does
    not wait on a dead GCS. Before, the kernel hung in it until the frontend killed it
    (Ray printed its SIGTERM stack dump), the island actors outlived it and the cluster's
    session folder stayed in /tmp."""
    km = KernelManager(kernel_name=kernelspec.NAME)
    km.shutdown_wait_time = 120.0  # (SIGTERM after half of it: the kernel must end itself)
    log = tmp_path / "kernel.log"
    with log.open("w") as err:  # (ipykernel's debug log says which children it ended)
        km.start_kernel(cwd=str(tmp_path), extra_arguments=["--debug"], stderr=err)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(RAY_CELL, timeout=240)
        assert reply["content"]["status"] == "ok", reply["content"]
        kernel = km.provisioner.process
        cluster = psutil.Process(kernel.pid).children(recursive=True)
        session = session_dir(cluster)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    ended = [line for line in log.read_text().splitlines() if "to subprocess" in line]
    assert not ended, "ipykernel ended the cluster under the controller:\n" + "\n".join(ended)
    assert kernel.returncode == 0, f"the kernel did not exit by itself: {kernel.returncode}"
    _, alive = psutil.wait_procs(cluster, timeout=60)
    assert not alive, f"left running: {[p.name() for p in alive]}"
    assert not session.exists(), f"{session} was left"

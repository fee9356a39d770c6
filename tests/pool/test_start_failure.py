"""A start that fails after its Ray cluster is up leaves nothing behind: here the islands ask
for GPUs this machine does not have (``--platform gpu``), which is known only once the
cluster runs. One cluster, started and ended by the command itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.helpers import ROOT
from tests.helpers.pool import wait_until
from tests.pool.test_start_race import pool_processes


def test_a_failed_start_ends_its_cluster_and_writes_no_pool(tmp_path):
    pool_dir = tmp_path / "pools"
    env = dict(os.environ, PWKERNEL_POOL_DIR=str(pool_dir), HOME=str(tmp_path),
               PYTHONPATH=str(ROOT))
    env.pop("PWKERNEL_RAY_DEVICES", None)
    before = _pool_dirs()  # (another run's, killed before it could clean up, is not this one's)
    done = subprocess.run([sys.executable, "-m", "pwkernel.pool", "start", "--name", "gpus",
                           "--islands", "1", "--platform", "gpu"], env=env, text=True,
                          capture_output=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1
    assert "has 0 GPUs and --islands 1 needs 1" in done.stderr
    assert "--platform cpu" in done.stderr
    assert sorted(p.name for p in pool_dir.iterdir()) == []  # no pool file, no token
    token = str(pool_dir / "gpus.token")
    left = [p.pid for p in psutil.process_iter(["environ", "status"])
            if (p.info["environ"] or {}).get("RAY_AUTH_TOKEN_PATH") == token
            and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert left == []
    assert _pool_dirs() - before == set()


def _pool_dirs() -> set[str]:
    """The temporary directories of pools named ``gpus`` (``head.start_head`` makes them)."""
    return {d for d in os.listdir("/tmp") if d.startswith("pwpool-gpus-")}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_start_ended_by_a_signal_ends_the_cluster_it_started(tmp_path, signum):
    """``kill`` of a start while ``ray start`` runs: before, the start died alone and its
    cluster (a session of its own) ran on with its directory."""
    name = f"sig{os.getpid()}"
    env = dict(os.environ, PWKERNEL_POOL_DIR=str(tmp_path / "pools"), HOME=str(tmp_path),
               PYTHONPATH=str(ROOT))
    start = subprocess.Popen([sys.executable, "-m", "pwkernel.pool", "start", "--name", name,
                              "--islands", "1", "--platform", "cpu"], env=env, cwd=ROOT,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the signal comes once the cluster has a process: its directory holds Ray's session
        wait_until(lambda: pool_processes(name) or start.poll() is not None, 300,
                   "a process of the pool's cluster", lambda left: _ended(start, left))
        assert start.poll() is None, start.communicate()
        start.send_signal(signum)
        out, err = start.communicate(timeout=300)
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
    assert start.returncode == 128 + signum, (out, err)
    assert pool_processes(name) == []
    assert not [d for d in os.listdir("/tmp") if d.startswith(f"pwpool-{name}-")]
    assert sorted(os.listdir(tmp_path / "pools")) == []  # no pool file, token or lock


def _ended(process: subprocess.Popen, most: float) -> None:
    """Wait at most 50 ms (``most`` at most) for ``process`` to end."""
    try:
        process.wait(min(most, 0.05))
    except subprocess.TimeoutExpired:
        pass


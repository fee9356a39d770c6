"""A start that fails after its Ray cluster is up leaves nothing behind: here the islands ask
for GPUs this machine does not have (``--platform gpu``), which is known only once the
cluster runs. One cluster, started and ended by the command itself."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from tests.helpers import ROOT


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

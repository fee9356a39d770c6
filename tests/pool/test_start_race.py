"""Two ``python -m pwkernel.pool start`` of one name at once: one starts the pool, the other
is refused and starts nothing (no second cluster left running without a pool file)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from pwkernel.pool import head, service
from tests.helpers import ROOT

TIMEOUT = 300.0


def pool_processes(name: str) -> list[int]:
    """Every live process of a cluster started for pool ``name`` (by its mark)."""
    prefix = f"/tmp/pwpool-{name}-"
    out = []
    for p in psutil.process_iter(["environ", "status"]):
        mark = (p.info["environ"] or {}).get(head.MARK) or ""
        if mark.startswith(prefix) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def test_two_starts_of_one_name_at_once_make_one_pool(tmp_path):
    name = f"race{os.getpid()}"
    env = dict(os.environ, PWKERNEL_POOL_DIR=str(tmp_path / "pools"), HOME=str(tmp_path),
               PYTHONPATH=str(ROOT))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "pwkernel.pool", "start", "--name", name, "--islands", "1",
           "--platform", "cpu"]
    starts = [subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for _ in range(2)]
    try:
        done = [(p.wait(TIMEOUT), *p.communicate()) for p in starts]
        codes = sorted(code for code, _, _ in done)
        refused = next((err for code, _, err in done if code == 1), "")
        assert codes == [0, 1], done
        assert (f"pool {name!r} is being started right now by another process" in refused
                or f"pool {name!r} runs already" in refused), refused
        assert "python -m pwkernel.pool stop --name" in refused
    finally:
        for p in starts:
            if p.poll() is None:
                p.kill()
                p.wait(TIMEOUT)
        stopped = subprocess.run([sys.executable, "-m", "pwkernel.pool", "stop", "--name", name],
                                 env=env, cwd=ROOT, text=True, capture_output=True,
                                 timeout=TIMEOUT)
    assert stopped.returncode == 0, stopped.stderr
    assert pool_processes(name) == []  # no cluster of this name left running
    assert sorted(os.listdir(tmp_path / "pools")) == []  # nor its lock file


def test_a_start_while_another_holds_the_name_is_refused_at_once(tmp_path, monkeypatch):
    """Deterministic half of the race: the name's start lock is held (here by this test)."""
    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(tmp_path / "pools"))
    with service.starting("held"):
        try:
            service.start("held", (1,), platform="cpu")
        except service.PoolRunningError as e:
            message = str(e)
        else:
            raise AssertionError("a second start of 'held' was not refused")
    assert f"(pid {os.getpid()})" in message and "--name held" in message
    assert sorted(os.listdir(tmp_path / "pools")) == []  # nothing started, nothing written


def test_status_while_a_start_runs_says_the_pool_is_being_started(tmp_path, monkeypatch):
    """Before: while ``start`` ran (half a minute on a busy machine) ``status`` said "no pool
    named ..., start one", then (once the pool file was written) every island "lost (its
    actor died)" or the cluster "stopped ... clean up with stop", which would end the start."""
    from pwkernel.backends.ray import poolfile
    from tests.pool.test_poolfile import record

    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(tmp_path / "pools"))
    with service.starting("held"):
        for written in (False, True):
            if written:  # as `start` does once its head runs
                poolfile.save(record("held", address=f"127.0.0.1:{head.free_port()}",
                                     started_cluster=True))
            try:
                service.status("held")
            except service.PoolError as e:
                message = str(e)
            else:
                raise AssertionError("status of a pool being started gave a status")
            assert f"pool 'held' is being started right now (pid {os.getpid()})" in message, \
                message
    poolfile.remove("held")
    try:
        service.status("held")
    except service.PoolError as e:  # the start is over: as before
        assert "no pool named 'held'" in str(e)

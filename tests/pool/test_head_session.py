"""A pool whose head crashed (its raylet and GCS killed, as the kernel's OOM killer may) and
is then stopped: ``stop`` ends Ray's dashboard and runtime-env agents too. They were the
raylet's children, are init's now, renamed themselves (their environment reads blank, so the
pool's mark is not seen) and wait a minute or more for the dead GCS before they end; only the
session ``ray start`` ran in (``pool/head.py``) still finds them. A head of its own (~20 s)."""

from __future__ import annotations

import secrets
import time

import psutil

from pwkernel.pool import head

TIMEOUT = 120.0
AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def test_stop_after_a_crash_of_the_heads_raylet_and_gcs_ends_rays_agents(tmp_path):
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    record = head.start_head("agents", token)
    try:
        procs = _with_agents(record)
        core = [p for p in procs if p.name() in ("raylet", "gcs_server")]
        assert len(core) == 2, [p.name() for p in procs]
        for p in core:  # a crash: no SIGTERM, nothing of theirs cleans up
            p.kill()
        psutil.wait_procs(core, timeout=TIMEOUT)
        head.stop_head(record)
        left = [f"{p.pid} {p.name()}" for p in procs if _alive(p)]
        assert left == [], f"stop left processes of the pool's cluster running: {left}"
        assert head.session_processes(record["sid"], record["started"]) == []
    finally:
        head.stop_head(record)


def _with_agents(record: dict) -> list[psutil.Process]:
    """The cluster's processes once both agents run (the raylet starts them after `ray start`
    returns)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        procs = head.processes(record)
        if AGENTS <= {p.name() for p in procs} or time.monotonic() > deadline:
            assert AGENTS <= {p.name() for p in procs}, [p.name() for p in procs]
            return procs
        psutil.wait_procs(procs[:1], timeout=0.5)  # (a pause that ends if that one ends)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

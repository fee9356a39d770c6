"""A pool for tests, started the simple way: a Ray head on 127.0.0.1 (``ray start --head``)
with token authentication and a token file of its own, the pool's island actors on it
(``tenancy.create_islands``), and tenant processes (``tests/helpers/pool_tenant.py``) that
attach to it. ``Head.stop`` kills every process of that head (found by its temp dir and port,
with their children) and waits for them, so nothing is left."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import ROOT

TIMEOUT = 120.0


@dataclass
class Head:
    """A Ray head of our own on 127.0.0.1 with token authentication: the pool command's own
    (``pwkernel.pool.head``), with a token in a temporary file, for tests that make the pool's
    islands themselves."""

    record: dict       # ``head.start_head``'s: address, temp_dir, pids, ...
    token_path: Path
    env: dict = field(default_factory=dict)  # what a process needs to join it

    @property
    def address(self) -> str:
        return self.record["address"]

    @classmethod
    def start(cls) -> Head:
        from pwkernel.pool import head

        token_dir = Path(tempfile.mkdtemp(prefix="pwp-token-"))
        token_path = token_dir / "token"
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            record = head.start_head("test", token_path)
        except BaseException:
            shutil.rmtree(token_dir, ignore_errors=True)
            raise
        env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path),
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # bind 127.0.0.1 only
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT),
                                                          os.environ.get("PYTHONPATH")) if p))
        env.pop("RAY_AUTH_TOKEN", None)
        return cls(record, token_path, env)

    def stop(self) -> None:
        from pwkernel.pool import head

        head.stop_head(self.record)
        assert not head.processes(self.record), "head processes left"
        shutil.rmtree(self.token_path.parent, ignore_errors=True)


class Tenant:
    """A tenant process: ``python -m tests.helpers.pool_tenant MODE`` attached to the pool.

    It prints one JSON line when it is ready (attached, compiled), waits for ``go()``, works,
    and prints one JSON line with its results."""

    def __init__(self, head: Head, pool: str, mode: str, name: str, **options):
        args = [sys.executable, "-m", "tests.helpers.pool_tenant", mode, "--address",
                head.address, "--pool", pool, "--name", name]
        for key, value in options.items():
            args += [f"--{key}", str(value)]
        self.name = name
        self.proc = subprocess.Popen(args, env=head.env, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def line(self, timeout: float = TIMEOUT) -> dict:
        """Its next JSON line (a dead tenant's error output if it exits first)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"tenant {self.name} said nothing for {timeout:g} s")
        out = self.proc.stdout.readline()  # one whole line at a time: none stays buffered
        if not out:
            self.proc.wait(TIMEOUT)
            raise AssertionError(f"tenant {self.name} exited ({self.proc.returncode}): "
                                 f"{self.proc.stderr.read()[-3000:]}")
        return json.loads(out)

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = TIMEOUT) -> dict:
        result = self.line(timeout)
        self.proc.stdin.close()
        assert self.proc.wait(timeout) == 0, self.proc.stderr.read()[-3000:]
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


def wait_until(predicate, timeout: float, what: str, wait):
    """Read ``predicate()`` until it returns something true; between reads ``wait(left)``
    blocks until what it reads may have changed (``island_changes``, or a trace's
    ``wait_for``), at most ``left`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        wait(min(left, 1.0))


def island_changes(actor):
    """A ``wait`` for ``wait_until``: until the pool island ``actor`` changes (``changed``)."""
    import ray

    seen = [-1]

    def wait(left: float) -> None:
        seen[0] = ray.get(actor.changed.remote(seen[0], left), timeout=left + TIMEOUT)
    return wait


@contextlib.contextmanager
def renewing(actor, secrets: list[str], every: float = 1.0) -> Iterator[None]:
    """Renew the leases of tenants registered by hand (``actor.register``) every ``every``
    seconds, as a controller's ``KeepAlive`` does, while the block runs: a test that reads
    one tenant's records for seconds must not have the pool drop the others meanwhile."""
    import threading

    import ray

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):  # (a heartbeat, not a wait for something to happen)
            ray.get([actor.renew.remote(s) for s in secrets], timeout=TIMEOUT)

    thread = threading.Thread(target=loop, name="test-renewals", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(TIMEOUT)


@contextlib.contextmanager
def running_pool(name: str, sizes: tuple[int, ...] = (4, 4),
                 lease: float = 4.0) -> Iterator[Head]:
    """A head of our own with pool ``name``'s island actors on it, this process connected to
    it with the pool's token (as a controller attaching finds it); everything stopped, and
    the Ray settings of this process put back, after."""
    from pwkernel.backends.ray import cluster, tenancy

    head = Head.start()
    put_back = cluster.lend_token(head.token_path)  # as a controller does from the pool's file
    try:
        cluster.connect(head.address)
        try:
            tenancy.create_islands(name, sizes, "cpu", lease=lease)
            yield head
        finally:
            try:
                tenancy.destroy_islands(name)
            finally:
                cluster.disconnect()
    finally:
        head.stop()
        put_back()

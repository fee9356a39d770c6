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
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.helpers import ROOT

TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Head:
    """A Ray head of our own on 127.0.0.1, with token authentication."""

    port: int
    temp_dir: Path
    token_path: Path
    env: dict = field(default_factory=dict)  # what a process needs to join it

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> Head:
        temp_dir = Path(tempfile.mkdtemp(prefix="pwp-", dir="/tmp"))  # short: Ray's sockets
        token_path = temp_dir / "token"
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
        env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path),
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # bind 127.0.0.1 only
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT),
                                                          os.environ.get("PYTHONPATH")) if p))
        env.pop("RAY_AUTH_TOKEN", None)
        ray_cli = str(Path(sys.executable).with_name("ray"))
        for _attempt in (1, 2):  # a port taken meanwhile (the free port is only free now)
            head = cls(free_port(), temp_dir, token_path, env)
            try:
                done = subprocess.run([ray_cli, "start", "--head", "--node-ip-address",
                                       "127.0.0.1", "--port", str(head.port), "--num-cpus",
                                       "1", "--include-dashboard", "false",
                                       "--disable-usage-stats", "--temp-dir", str(temp_dir)],
                                      env=env, capture_output=True, text=True,
                                      timeout=TIMEOUT)
            except BaseException:
                head.stop()
                raise
            if done.returncode == 0:
                return head
            head.stop(keep_dir=True)
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise AssertionError(f"ray start failed twice: {done.stdout[-2000:]}"
                             f"{done.stderr[-2000:]}")

    def processes(self) -> list[psutil.Process]:
        marks = (str(self.temp_dir), f"127.0.0.1:{self.port}", f"gcs_server_port={self.port}")
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if any(m in line for m in marks):
                found[p.pid] = p
                try:
                    found |= {c.pid: c for c in p.children(recursive=True)}
                except psutil.NoSuchProcess:
                    pass
        found.pop(os.getpid(), None)  # this process joined the head; it is not the head's
        return list(found.values())

    def stop(self, keep_dir: bool = False) -> None:
        procs = self.processes()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=60)
        assert not alive, f"head processes left: {[p.name() for p in alive]}"
        current = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")
        if current.exists() and current.read_text().strip() == self.address:
            current.unlink()
        if not keep_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


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

"""``python -m pwkernel.pool start|status|stop --name NAME``: a device pool from the shell.

    python -m pwkernel.pool start --name class --islands 4,4 [--address HOST:PORT] [--lease S]
    python -m pwkernel.pool status --name class [--json]
    python -m pwkernel.pool stop --name class

Exit status: 0 done, 1 refused or failed (the message says why and what to do), 2 bad
arguments, 143 or 129 a start ended by SIGTERM or SIGHUP (after ending what it had started),
141 the reader of the output went away (``... | head -1``; quietly, as shell tools
do).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys

from ..backends.ray.poolfile import PoolNameError, check_name
from ..runtime.errors import PathwaysError
from ..runtime.sizes import sizes_problem
from . import report, service

EXIT_PIPE = 128 + signal.SIGPIPE  # the reader of our output went away (141 on Linux)


def _name(text: str) -> str:
    try:
        return check_name(text)
    except PoolNameError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _islands(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not devices per island as positive ints separated by commas; "
            "e.g. --islands 4,4 (two islands of 4 devices)")
    sizes = tuple(int(p) for p in parts)
    problem = sizes_problem(sizes, named=f"--islands {text}")
    if problem is not None:  # (before a cluster starts: JAX would refuse it a minute later)
        raise argparse.ArgumentTypeError(f"{problem}; e.g. --islands 4,4")
    return sizes


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}"
                                         "; e.g. --lease 5")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1 to 65535), got {text!r}")
    return int(text)


def _address(text: str) -> str:
    try:
        return service.check_address(text)
    except service.PoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pwkernel.pool",
        description="A device pool: islands shared by many notebooks and scripts, each "
                    "island with one gang scheduler for all of them (docs/pool.md).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    s = sub.add_parser("start", help="start a pool (and its Ray cluster) and return")
    s.add_argument("--name", type=_name, required=True, help="the pool's name, e.g. class")
    s.add_argument("--islands", type=_islands, required=True, metavar="4,4",
                   help="devices per island (GPUs on a GPU machine, else virtual CPU devices)")
    s.add_argument("--address", type=_address, default=None, metavar="HOST:PORT",
                   help="join this running Ray cluster (default: start one on 127.0.0.1)")
    s.add_argument("--port", type=_port, default=None, metavar="P",
                   help="the new cluster's GCS port (default: a free one)")
    s.add_argument("--lease", type=_seconds, default=5.0, metavar="S",
                   help="drop a tenant silent for S seconds (default 5)")
    s.add_argument("--platform", choices=service.PLATFORMS, default=None,
                   help="island devices: gpu, cpu or auto (default: PWKERNEL_RAY_DEVICES, "
                        "else gpu when the cluster has GPUs)")
    st = sub.add_parser("status", help="tenants, islands and memory of a pool")
    st.add_argument("--name", type=_name, required=True)
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    sp = sub.add_parser("stop", help="end a pool and every process it started")
    sp.add_argument("--name", type=_name, required=True)
    return p


def say(text: str, stream=None) -> None:
    """Write ``text`` and a newline to ``stream`` (default stdout) and flush it. A reader that
    went away (``... status --json | head -1``) ends the command as it ends a shell tool: at
    once, quietly, with exit status 141 (128 + SIGPIPE), instead of a BrokenPipeError
    traceback."""
    stream = sys.stdout if stream is None else stream
    try:
        if text is not None:
            print(text, file=stream)
        stream.flush()
    except BrokenPipeError:
        # The Python docs' recipe (library/signal, "Note on SIGPIPE"): point the stream at
        # devnull, so that the interpreter's own flush at exit does not fail on it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        raise SystemExit(EXIT_PIPE) from None


@contextlib.contextmanager
def _ended_cleanly_by_signals():
    """While a start runs, SIGTERM (``kill``, a job runner's timeout) and SIGHUP (its terminal
    closed) end it as Ctrl-C does: through its clean-up, which ends the cluster it started and
    removes its directory and files (by default they would kill this process alone, and the
    cluster, in a session of its own, would run on). Exit status 128 + the signal's number;
    a second signal while the clean-up runs is ignored (SIGKILL still ends it at once)."""
    def end(signum, _frame):
        for s in caught:
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    caught = (signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, end) for s in caught}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    try:
        a = parser().parse_args(argv)
    except SystemExit:  # --help, or a usage error: argparse wrote them (unflushed)
        say(None)
        say(None, sys.stderr)
        raise
    try:
        if a.command == "start":
            if a.address is not None and a.port is not None:
                say("--port is the port of a cluster the pool starts; with --address it "
                    "joins a running one. Drop one of them.", sys.stderr)
                return 2
            with _ended_cleanly_by_signals():
                record = service.start(a.name, a.islands, address=a.address, lease=a.lease,
                                       platform=a.platform, port=a.port)
            say(report.started(record))
        elif a.command == "status":
            st = service.status(a.name)
            say(json.dumps(st, indent=2, sort_keys=True) if a.json else report.status_text(st))
        else:
            say(report.stopped(service.stop(a.name)))
    except PathwaysError as e:
        say(f"pwkernel.pool {a.command}: {e}", sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

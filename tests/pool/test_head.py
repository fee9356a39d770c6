"""Which processes a pool's ``stop`` ends (``pool/head.py``), without a Ray cluster: a
stand-in record whose "cluster" is a process carrying the pool's mark and its child, next to
a bystander that only names the pool's directory on its command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from pwkernel.pool import head

WAIT = "import sys; sys.stdin.read()"  # runs until its stdin closes
PARENT = ("import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]],"
          " stdin=subprocess.PIPE); print(c.pid, flush=True); sys.stdin.read()")


def test_stop_ends_the_pools_processes_and_not_one_that_names_its_directory(tmp_path):
    temp_dir = str(tmp_path / "pwpool-x-1")
    os.mkdir(temp_dir)
    record = {"temp_dir": temp_dir, "pids": [], "started": time.time(), "address": None}
    # a user's process that only names the pool's directory (a `tail -f` of its logs)
    bystander = subprocess.Popen([sys.executable, "-c", WAIT, f"{temp_dir}/session_latest"],
                                 stdin=subprocess.PIPE)
    # a process of the pool (started with the pool's environment) and its child
    ours = subprocess.Popen([sys.executable, "-c", PARENT, WAIT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, **{head.MARK: temp_dir}))
    child = int(ours.stdout.readline())
    try:
        found = {p.pid for p in head.processes(record)}
        assert found == {ours.pid, child}
        ended = head.stop_head(record, grace=10.0)
        assert sorted(ended) == sorted([ours.pid, child])
        assert ours.wait(30) is not None and not _runs(child)
        assert bystander.poll() is None  # the bystander runs on
    finally:
        for p in (bystander, ours):
            if p.poll() is None:
                p.kill()
            p.wait(30)


def test_a_recorded_pid_counts_only_while_it_is_the_process_the_pool_started(tmp_path):
    """A pid written down at start that now belongs to another program (used again soon
    after: within the start's time, without the pool's mark) is left alone."""
    other = subprocess.Popen([sys.executable, "-c", WAIT], stdin=subprocess.PIPE)
    try:
        made = psutil.Process(other.pid).create_time()
        for started in (made - 3600, made):  # long before; just before
            record = {"temp_dir": str(tmp_path), "pids": [other.pid], "started": started}
            assert head.processes(record) == [], started
    finally:
        other.kill()
        other.wait(30)


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


NOISY = ("import signal, sys, threading\n"
         "def said(*_):\n"
         "    print('The autoscaler failed with the following error: signal 15', flush=True)\n"
         "    sys.exit(1)\n"
         "signal.signal(signal.SIGTERM, said)\n"
         "print('ready', flush=True)\n"
         "sys.stdin.read()\n")


def test_stop_ends_rays_monitor_without_a_sigterm_it_would_tell_every_tenant(tmp_path):
    """Ray's autoscaler monitor answers SIGTERM by publishing "The autoscaler failed with the
    following error: ... Terminated with signal 15" to every driver of the cluster: each
    tenant still attached printed that traceback when the pool was stopped. Its stand-in
    (the pool's mark, Ray's monitor on its command line) says so if it gets a SIGTERM."""
    temp_dir = str(tmp_path / "pwpool-x-2")
    os.mkdir(temp_dir)
    record = {"temp_dir": temp_dir, "pids": [], "started": time.time(), "address": None}
    monitor = subprocess.Popen(
        [sys.executable, "-c", NOISY, "/site-packages/ray/autoscaler/_private/monitor.py"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, **{head.MARK: temp_dir}))
    try:
        assert monitor.stdout.readline().strip() == "ready"  # its handler is in place
        assert head.stop_head(record, grace=10.0) == [monitor.pid]
        assert monitor.wait(30) is not None
        assert monitor.stdout.read() == ""
    finally:
        if monitor.poll() is None:
            monitor.kill()
        monitor.wait(30)

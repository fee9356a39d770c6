"""The pool's files and choices without a cluster: names, the pool directory, owner-only
files, the platform of the islands, and a stale pool cleaned up by ``stop``."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest

import pwkernel as pw
from pwkernel.backends.ray import poolfile
from pwkernel.pool import service


@pytest.fixture
def pool_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "pools"
    monkeypatch.setenv(poolfile.ENV, str(folder))
    return folder


def record(name: str, **changes) -> dict:
    base = {"name": name, "address": "127.0.0.1:1", "token_path": None, "islands": [2],
            "platform": "cpu", "lease": 5.0, "started_cluster": False, "session_dir": None,
            "temp_dir": None, "pids": [], "started": 0.0}
    return base | changes


def test_pool_names_are_refused_unless_they_can_name_files():
    for bad in ("", "a/b", "../x", "-x", "a b", "x" * 65, 3):
        with pytest.raises(pw.DeviceSetupError, match=r"e.g. .class. \(--name class"):
            poolfile.check_name(bad)
    assert poolfile.check_name("class-1_a.b") == "class-1_a.b"


def test_the_pool_directory_is_the_env_or_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv(poolfile.ENV, str(tmp_path))
    assert poolfile.file_path("p") == tmp_path / "p.json"
    assert poolfile.token_path("p") == tmp_path / "p.token"
    monkeypatch.delenv(poolfile.ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert poolfile.pool_dir() == tmp_path / ".pwkernel" / "pools"


def test_files_are_owner_only_whatever_the_umask(pool_dir):
    old = os.umask(0)
    try:
        token = poolfile.new_token("p")
        path = poolfile.save(record("p", token_path=str(token)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(pool_dir.stat().st_mode) == 0o700
    for f in (token, path):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    first = token.read_text()
    assert len(first) == 64 and int(first, 16) >= 0
    assert poolfile.new_token("p").read_text() != first  # a fresh token every start
    assert poolfile.load("p")["token_path"] == str(token)
    assert sorted(p.name for p in pool_dir.iterdir()) == ["p.json", "p.token"]  # no temp
    poolfile.remove("p")
    assert list(pool_dir.iterdir()) == [] and poolfile.load("p") is None


def test_a_broken_pool_file_says_what_to_do(pool_dir):
    pool_dir.mkdir()
    (pool_dir / "p.json").write_text("{not json")
    with pytest.raises(pw.DeviceSetupError, match="is not JSON.*pwkernel.pool stop --name p"):
        poolfile.load("p")
    (pool_dir / "p.json").write_text(json.dumps({"name": "q"}))
    with pytest.raises(pw.DeviceSetupError, match="does not describe pool 'p'"):
        poolfile.load("p")
    with pytest.raises(ValueError, match="missing"):
        poolfile.save({"name": "p"})


def test_islands_are_gpus_when_the_cluster_has_them_and_they_fit():
    assert service.platform_for((4, 4), "auto", 0) == "cpu"
    assert service.platform_for((4, 4), "auto", 8) == "gpu"
    assert service.platform_for((4, 4), "cpu", 8) == "cpu"
    with pytest.raises(service.PoolError, match="has 1 GPUs and --islands 4,4 needs 8; ask "
                                                "for at most 1 .e.g. --islands 1.*--platform cpu"):
        service.platform_for((4, 4), "auto", 1)
    with pytest.raises(service.PoolError, match="has 0 GPUs"):
        service.platform_for((1,), "gpu", 0)


def test_bad_start_arguments_are_refused_before_anything_starts(pool_dir, monkeypatch):
    with pytest.raises(service.PoolError, match="positive device counts.*--islands 4,4"):
        service.start("p", (4, 0))
    with pytest.raises(service.PoolError, match="lease must be a positive number"):
        service.start("p", (4,), lease=0)
    monkeypatch.setenv("PWKERNEL_RAY_DEVICES", "tpu")
    with pytest.raises(service.PoolError, match="PWKERNEL_RAY_DEVICES='tpu'; expected one of"):
        service.start("p", (4,))
    assert not pool_dir.exists()  # nothing was written


def test_stop_cleans_up_a_pool_whose_cluster_is_gone(pool_dir):
    """A pool file left by a machine restart: nothing answers at its address; stop removes
    its files and its cluster's directory, and refuses nothing."""
    from pwkernel.pool.head import free_port

    temp_dir = tempfile.mkdtemp(prefix="pwpool-stale-", dir="/tmp")
    Path(temp_dir, "session_latest").mkdir()
    token = poolfile.new_token("old")
    poolfile.save(record("old", address=f"127.0.0.1:{free_port()}", started_cluster=True,
                         temp_dir=temp_dir, token_path=str(token)))
    done = service.stop("old")
    assert done == {"name": "old", "islands_ended": False, "processes_ended": [],
                    "started_cluster": True}
    assert not Path(temp_dir).exists() and poolfile.load("old") is None
    assert not token.exists()
    with pytest.raises(service.PoolError, match="no pool named 'old'"):
        service.status("old")


def test_a_mistyped_pool_name_is_told_the_name_of_the_pool_at_that_address(pool_dir):
    """Refused before Ray is asked: with the wrong name, the pool's token is not lent and the
    cluster refuses the connection only after half a minute of retries."""
    poolfile.save(record("class", address="127.0.0.1:1"))
    with pytest.raises(pw.DeviceSetupError, match=r"no pool named 'clas'.*the pool at "
                       r"localhost:1 is 'class': attach with pool='class'"):
        pw.Controller(backend="ray", pool="clas", address="localhost:1")
    with pytest.raises(pw.DeviceSetupError, match=r"pools written down here: 'class'\)"):
        pw.Controller(backend="ray", pool="clas")


def test_attaching_to_a_pool_whose_cluster_is_gone_says_the_pool_is_not_running(pool_dir):
    """A pool written down here whose head died (or a machine restart): the error names the
    pool and the pool's commands, not `ray start` or ray_address=None (a cluster of one's
    own would not be the pool)."""
    from pwkernel.pool.head import free_port

    address = f"127.0.0.1:{free_port()}"
    poolfile.save(record("gone", address=address))
    with pytest.raises(pw.DeviceSetupError) as caught:
        pw.Controller(backend="ray", pool="gone", tenant="late")
    message = str(caught.value)
    assert f"pool 'gone' does not answer at {address}" in message
    assert "python -m pwkernel.pool stop --name gone" in message
    assert "ray start" not in message and "ray_address=None" not in message


def test_attaching_while_the_pool_is_being_started_says_so(pool_dir):
    """A notebook attaching while ``start`` still places the islands: the pool file may not
    be written yet, or name an address whose islands are not up. Before, the error said "pools
    written down here: none", or "no pool named ... Start it with ..." once connected (or an
    island not yet made could be taken as lost)."""
    with service.starting("early"):
        for written in (False, True):
            if written:
                poolfile.save(record("early", address="127.0.0.1:1"))
            with pytest.raises(pw.DeviceSetupError, match=rf"pool 'early' is being started "
                               rf"right now \(pid {os.getpid()}\); its islands are not up "
                               r"yet.*python -m pwkernel.pool start"):
                pw.Controller(backend="ray", pool="early")
        with pytest.raises(service.PoolRunningError, match="being started right now"):
            service.status("early")


@pytest.mark.parametrize("tenant", ["", 3])
def test_a_tenant_name_that_is_not_a_non_empty_string_is_refused_first(pool_dir, tenant):
    """Refused before anything connects, as a bad weight= is (before: after the attempt to
    connect, which at a dead address said the pool does not answer)."""
    poolfile.save(record("t", address="127.0.0.1:1"))
    with pytest.raises(pw.DeviceSetupError, match=r"tenant= must be a non-empty string, got"):
        pw.Controller(backend="ray", pool="t", tenant=tenant)


def test_attaching_to_a_pool_not_written_down_here_says_to_check_the_address(pool_dir):
    """A pool started on another machine (or never): ``stop`` here would answer "no pool
    named ...", so the error does not send the user there."""
    from pwkernel.pool.head import free_port

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(pw.DeviceSetupError) as caught:
        pw.Controller(backend="ray", pool="elsewhere", address=address)
    message = str(caught.value)
    assert f"pool 'elsewhere' does not answer at {address}" in message
    assert "no pool of that name was started on this machine. Check the address" in message
    assert "python -m pwkernel.pool start --name elsewhere --islands 4,4" in message
    assert "pool stop" not in message


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), 0, -1.0, True, "2"])
def test_a_tenant_weight_that_is_not_a_finite_number_above_0_is_refused_first(pool_dir, weight):
    """Refused before anything connects (an infinite weight took every island for itself while
    it had work: ``ctl.client`` refuses it for a client); a NumPy number is a number."""
    poolfile.save(record("w", address="127.0.0.1:1"))
    with pytest.raises(pw.DeviceSetupError, match=r"weight= \(this tenant's share of the "
                       r"pool\) must be a finite number > 0, got"):
        pw.Controller(backend="ray", pool="w", weight=weight)
    with pytest.raises(pw.DeviceSetupError, match="pool 'w' does not answer"):  # (accepted)
        pw.Controller(backend="ray", pool="w", weight=np.float32(2.0))


def test_start_with_an_address_where_no_cluster_runs_says_so(pool_dir, capsys):
    """``start --address`` joins a running cluster: an address that is not ``host:port`` is a
    usage error (exit 2, not Ray's traceback), and one where nothing answers names the
    address it tried and how to start a pool without one (not "pool ... is not running",
    which is about a pool that ran once)."""
    from pwkernel.pool.__main__ import main
    from pwkernel.pool.head import free_port

    for bad in ("foo", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:0", ":6379",
                "ray://127.0.0.1:10001"):
        with pytest.raises(SystemExit) as info:
            main(["start", "--name", "p", "--islands", "2", "--address", bad])
        assert info.value.code == 2, bad
        assert "HOST:PORT of" in capsys.readouterr().err
    with pytest.raises(service.PoolError, match="expected HOST:PORT"):
        service.start("p", (2,), address="foo")
    address = f"127.0.0.1:{free_port()}"
    assert main(["start", "--name", "p", "--islands", "2", "--address", address]) == 1
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at {address}" in err, err
    assert "leave --address out" in err and "is not running" not in err
    assert poolfile.load("p") is None


def test_a_controller_given_an_address_that_is_not_host_port_says_what_it_expects():
    """Before: Ray's "Invalid address format: foo" (nothing about the expected form)."""
    for bad in ("foo", "127.0.0.1", "localhost:abc", "127.0.0.1:70000"):
        with pytest.raises(pw.DeviceSetupError, match="expected HOST:PORT of a running Ray "
                           r"cluster's head \(e.g. 10.0.0.1:6379\) or 'auto'"):
            pw.Controller(backend="ray", islands=(2,), ray_address=bad)
    # (was Ray's "Ray Client requires pip package `ray[client]`": install it by hand)
    with pytest.raises(pw.DeviceSetupError, match=r"ray_address: a Ray Client address "
                       r"\('ray://10.0.0.1:10001'\) is not supported.*HOST:PORT of the "
                       r"cluster's head"):
        pw.Controller(backend="ray", islands=(2,), ray_address="ray://10.0.0.1:10001")

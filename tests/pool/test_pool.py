"""The pool's command line on a real Ray cluster: ``python -m pwkernel.pool start|status|stop``
run as subprocesses, on a temporary pool directory.

One pool (one Ray cluster, ~20 s to start on 2 cores) for the module; the tests run in file
order and the last one stops it (the fixture stops it too if a test failed first).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pwkernel.backends.ray import poolfile
from pwkernel.pool import head, service
from pwkernel.pool.__main__ import main, parser
from tests.helpers import ROOT

TIMEOUT = 240.0
NAME = "class"


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pools")


@pytest.fixture(scope="module")
def env(pool_dir, tmp_path_factory) -> dict[str, str]:
    """The CLI's environment: this worktree's code, the temporary pool directory, a HOME
    without a Ray token of its own (only the pool's token can open the pool)."""
    out = dict(os.environ, PWKERNEL_POOL_DIR=str(pool_dir),
               HOME=str(tmp_path_factory.mktemp("home")),
               PYTHONPATH=str(ROOT))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        out.pop(key, None)
    return out


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pwkernel.pool", *args], env=env, text=True,
                          capture_output=True, timeout=TIMEOUT, cwd=ROOT)


def cli_to_gone_reader(env: dict[str, str], stream: str, *args: str):
    """The CLI with its ``stream`` (stdout or stderr) a pipe whose reader is gone, as in
    ``python -m pwkernel.pool status --json | head -1``; the other stream is captured. Its
    output is buffered, as in a user's shell (not PYTHONUNBUFFERED)."""
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)  # (before the CLI writes: every write fails, no race with a reader)
    other = "stderr" if stream == "stdout" else "stdout"
    try:
        return subprocess.run([sys.executable, "-m", "pwkernel.pool", *args], env=env,
                              text=True, timeout=TIMEOUT, cwd=ROOT,
                              **{stream: write, other: subprocess.PIPE})
    finally:
        os.close(write)


def assert_quiet_end(done: subprocess.CompletedProcess) -> None:
    """Ended as a shell tool does when its reader goes: 141 (128 + SIGPIPE), no traceback."""
    said = (done.stdout or "") + (done.stderr or "")
    assert (done.returncode, said) == (141, ""), done.args


def load(pool_dir: Path, name: str = NAME) -> dict:
    return json.loads((pool_dir / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def started(env, pool_dir):
    """``start`` once; yields (its output, the pool file as it wrote it); always stopped."""
    done = cli(env, "start", "--name", NAME, "--islands", "2,2", "--lease", "3")
    record = load(pool_dir) if (pool_dir / f"{NAME}.json").exists() else None
    try:
        assert done.returncode == 0, done.stderr
        yield done, record
    finally:
        if (pool_dir / f"{NAME}.json").exists():
            cli(env, "stop", "--name", NAME)
        if record is not None:  # whatever a failed stop left
            head.stop_head(record)


def test_bad_arguments_are_refused_with_what_to_do(env, pool_dir, monkeypatch, capsys):
    done = cli(env, "start", "--name", "a/b", "--islands", "2,2")  # the real command line
    assert done.returncode == 2 and "pool name 'a/b' is not 1 to 64 letters" in done.stderr
    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(pool_dir))  # the rest in this process
    for argv, code, message in [
            (["start", "--name", NAME, "--islands", "2,0"], 2, "e.g. --islands 4,4"),
            (["start", "--name", NAME, "--islands", "2", "--lease", "-1"], 2,
             "positive number of seconds"),
            (["start", "--name", NAME, "--islands", "2", "--address", "127.0.0.1:1", "--port",
              "7000"], 2, "Drop one of them"),
            (["status", "--name", "nowhere"], 1, "no pool named 'nowhere' on this machine"),
            (["stop", "--name", "nowhere"], 1,
             "python -m pwkernel.pool start --name nowhere")]:
        try:
            got = main(argv)
        except SystemExit as e:  # argparse's usage errors
            got = e.code
        assert (got, message in capsys.readouterr().err) == (code, True), argv
    assert not (pool_dir / f"{NAME}.json").exists()


def test_an_absurd_device_count_is_a_usage_error_at_once(env, pool_dir, capsys):
    done = cli(env, "start", "--name", NAME, "--islands", "99999999999999999999")
    assert done.returncode == 2, done.stderr  # (it started a cluster, then failed in JAX)
    assert "--islands 99999999999999999999 asks for 99999999999999999999 devices" in done.stderr
    assert "at most 4096 devices in all" in done.stderr and "incompatible" not in done.stderr
    with pytest.raises(SystemExit) as refused:  # (parsed only: a count that fits would start)
        parser().parse_args(["start", "--name", NAME, "--islands", "4000,97"])
    assert refused.value.code == 2
    assert "--islands 4000,97 asks for 4097 devices; at most 4096" in capsys.readouterr().err
    with pytest.raises(service.PoolError, match="at most 4096 devices in all"):
        service.start(NAME, (10**20,))
    assert not (pool_dir / f"{NAME}.json").exists()


def test_a_reader_that_goes_away_ends_the_command_quietly(env, pool_dir, monkeypatch):
    assert_quiet_end(cli_to_gone_reader(env, "stdout", "--help"))
    assert_quiet_end(cli_to_gone_reader(env, "stderr", "status", "--name", "nowhere"))
    # `stop` of a pool whose cluster is gone (the machine restarted) cleans up and says so
    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(pool_dir))
    poolfile.save({"name": "gone", "address": "127.0.0.1:1", "token_path": None,
                   "islands": [1], "platform": "cpu", "lease": 5.0, "started_cluster": False,
                   "session_dir": None, "temp_dir": None, "pids": [], "started": 0.0})
    assert_quiet_end(cli_to_gone_reader(env, "stdout", "stop", "--name", "gone"))
    assert not (pool_dir / "gone.json").exists()  # (it did its work, then said nothing)


def test_start_leaves_a_pool_running_and_says_how_to_attach(started, pool_dir):
    done, record = started
    address = record["address"]
    assert address.startswith("127.0.0.1:")
    assert f'pw.Controller(backend="ray", address="{address}", pool="{NAME}")' in done.stdout
    assert f"%pathways attach ray --address {address} --pool {NAME}" in done.stdout
    assert str(pool_dir / f"{NAME}.token") in done.stdout
    assert set(record) >= {"name", "address", "token_path", "islands", "platform",
                           "started_cluster", "session_dir", "pids"}
    assert record["islands"] == [2, 2] and record["platform"] == "cpu"
    assert record["started_cluster"] is True and record["lease"] == 3.0
    assert Path(record["session_dir"]).is_dir()
    assert record["session_dir"].startswith(record["temp_dir"])
    assert record["pids"] and all(psutil.pid_exists(p) for p in record["pids"])
    assert head.answers(address)  # the CLI returned; the pool runs on


def test_the_token_and_pool_files_are_owner_only(started, pool_dir):
    _, record = started
    token = Path(record["token_path"])
    assert token == pool_dir / f"{NAME}.token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text()) == 64  # 256 random bits in hex, as Ray makes them
    assert stat.S_IMODE((pool_dir / f"{NAME}.json").stat().st_mode) == 0o600


def test_a_second_start_says_the_pool_runs_and_where(started, env, pool_dir):
    _, record = started
    done = cli(env, "start", "--name", NAME, "--islands", "2,2")
    assert done.returncode == 1
    assert f"pool '{NAME}' runs already at {record['address']}" in done.stderr
    assert f"python -m pwkernel.pool stop --name {NAME}" in done.stderr
    assert load(pool_dir) == record  # the running pool is untouched


def test_status_lists_islands_tenants_and_memory(started, env):
    _, record = started
    done = cli(env, "status", "--name", NAME, "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["address"] == record["address"] and status["sizes"] == [2, 2]
    islands = status["islands"]
    assert [i["island"] for i in islands] == [0, 1]
    assert all(i["devices"] == 2 and i["platform"] == "cpu" for i in islands)
    assert all({"tenants", "bytes", "launches", "pid"} <= set(i) for i in islands)
    assert {i["pid"] for i in islands} <= set(record["pids"])  # the islands are ours
    text = cli(env, "status", "--name", NAME)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"pool '{NAME}' at {record['address']} (its own cluster")
    assert any(line.split()[:3] == ["0", "2", "cpu"] for line in lines)
    assert "tenants: none" in text.stdout
    for args in (["status", "--name", NAME, "--json"], ["status", "--name", NAME]):
        assert_quiet_end(cli_to_gone_reader(env, "stdout", *args))  # e.g. `| head -1`
    assert_quiet_end(cli_to_gone_reader(env, "stderr", "start", "--name", NAME,
                                        "--islands", "2,2"))  # refused: runs already


def test_the_pool_listens_on_loopback_only(started):
    _, record = started
    pids = {p.pid for p in head.processes(record)}
    assert set(record["pids"]) <= pids
    listening = [c for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    ports = {c.laddr.port for c in listening}
    assert int(record["address"].rsplit(":", 1)[1]) in ports  # the GCS is among them
    assert len(ports) >= 3  # gcs_server, raylet and more
    assert all(c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1") for c in listening), listening


DRIVER = textwrap.dedent("""
    import sys, ray
    ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", log_to_driver=False)
    print("connected", ray.get_runtime_context().gcs_address)
""")


def driver(env: dict[str, str], address: str, **auth: str) -> subprocess.CompletedProcess:
    """A plain Ray driver trying to join ``address`` with ``auth`` as its RAY_AUTH_* env."""
    denv = dict(env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **auth)
    return subprocess.run([sys.executable, "-c", DRIVER, address], env=denv, text=True,
                          capture_output=True, timeout=120)


@pytest.mark.parametrize("auth", [
    {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},  # a wrong token
    {"RAY_AUTH_MODE": "disabled"},  # no token at all
], ids=["wrong-token", "no-token"])
def test_a_driver_without_the_pool_token_is_refused(started, env, auth):
    _, record = started
    done = driver(env, record["address"], **auth)
    assert done.returncode != 0 and "connected" not in done.stdout
    assert "AuthenticationError" in done.stderr or "nauthenticated" in done.stderr, \
        done.stderr[-2000:]


def test_the_pool_token_lets_a_driver_in(started, env):
    """The refusals above are about the token: the same driver with it connects."""
    _, record = started
    done = driver(env, record["address"], RAY_AUTH_MODE="token",
                  RAY_AUTH_TOKEN_PATH=record["token_path"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"connected {record['address']}" in done.stdout


ATTACH = textwrap.dedent("""
    import os, sys, ray
    from pwkernel.backends.ray import cluster
    cluster.connect(sys.argv[1], pool=sys.argv[2])
    island = ray.get_actor("island-0", namespace="pwkernel-pool-" + sys.argv[2])
    print("attached", cluster.token_auth_enabled(), ray.get(island.info.remote())["island"])
    cluster.disconnect()
    print("after", ray.is_initialized(), os.environ.get("RAY_AUTH_MODE"),
          os.environ.get("RAY_AUTH_TOKEN_PATH"))
""")


def test_a_controller_on_this_machine_finds_the_pool_token_by_its_name(started, env):
    """``cluster.connect(address, pool=NAME)``: no RAY_AUTH_* set and no ~/.ray/auth_token,
    yet it joins with the pool's token, and puts the environment back afterwards."""
    _, record = started
    done = subprocess.run([sys.executable, "-c", ATTACH, record["address"], NAME], env=env,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "attached True 0" in done.stdout
    assert "after False None None" in done.stdout
    # The user's own settings win: a token of theirs (here a wrong one) is used, and refused.
    done = subprocess.run([sys.executable, "-c", ATTACH, record["address"], NAME],
                          env=dict(env, RAY_AUTH_TOKEN="1" * 64), text=True,
                          capture_output=True, timeout=120)
    assert done.returncode != 0 and "AuthenticationError" in done.stderr, done.stderr[-2000:]
    # ...and the error says what is wrong and the fix, not "start a cluster"
    assert "refused this process's token" in done.stderr
    assert "it used the token in RAY_AUTH_TOKEN" in done.stderr
    assert f"The token of pool '{NAME}' is in {record['token_path']}: unset RAY_AUTH_TOKEN" \
        in done.stderr
    assert "ray start --head" not in done.stderr


NOTEBOOK = textwrap.dedent("""
    import os, socket, subprocess, sys
    from IPython.core.interactiveshell import InteractiveShell
    address, name = sys.argv[1], sys.argv[2]
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pwkernel")
    ip.run_line_magic("pathways", f"attach ray --address {address} --pool {name}")
    print(repr(ip.run_line_magic("pathways", "status")))
    print("me", f"{socket.gethostname()}:{os.getpid()}")
    # %%pathways cells on the pool's devices: state carried from one cell to the next
    ip.run_cell("import jax.numpy as jnp, numpy as np")
    ip.run_cell_magic("pathways", "--devices 2 --island 1", "w = jnp.arange(4.0) * 3")
    ip.run_cell_magic("pathways", "--devices 2 --island 1",
                      "total = (w + 1).sum()\\nprint('cells', float(total))")
    cli = subprocess.run([sys.executable, "-m", "pwkernel.pool", "status", "--name", name],
                         capture_output=True, text=True, timeout=120)
    print(cli.stdout, cli.stderr)
    # attached again under a name and weight of its own (the address from the pool file)
    ip.run_line_magic("pathways", f"attach ray --pool {name} --tenant anna --weight 2.5")
    import ray
    from pwkernel.backends.ray import tenancy
    rows = ray.get(tenancy.find_islands(name)[0].pool_status.remote())["tenants"]
    print("tenants", sorted((t["name"], t["weight"]) for t in rows))
    ip.run_line_magic("unload_ext", "pwkernel")
""")
def test_a_notebook_attaches_as_a_tenant_and_sees_itself_in_status(started, env):
    _, record = started
    done = subprocess.run([sys.executable, "-c", NOTEBOOK, record["address"], NAME], env=env,
                          text=True, capture_output=True, timeout=TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert (f"attached ray to pool '{NAME}' at {record['address']}: island 0: 2 cpu, "
            "island 1: 2 cpu") in out
    me = next(line.split()[1] for line in out.splitlines() if line.startswith("me "))
    assert f"Pool {NAME}: tenants" in out and f"{me} (this kernel)" in out
    assert "cells 22.0" in out  # (0 + 3 + 6 + 9) + 4, computed on the pool's island 1
    assert "tenant" in out and me in out.split("token file:")[-1]  # the CLI sees it too
    assert "tenants [('anna', 2.5)]" in out  # --tenant, --weight; the first one left


def test_a_pool_that_joins_a_cluster_uses_its_token_and_leaves_it_running(started, env,
                                                                         pool_dir):
    """``--address``: a second pool on the first pool's cluster (no cluster of its own)."""
    _, record = started
    join_env = dict(env, RAY_AUTH_TOKEN_PATH=record["token_path"])
    done = cli(join_env, "start", "--name", "guest", "--islands", "1", "--address",
               record["address"])
    try:
        assert done.returncode == 0, done.stderr
        guest = load(pool_dir, "guest")
        assert guest["started_cluster"] is False and guest["pids"] == []
        assert guest["address"] == record["address"]
        token = Path(guest["token_path"])  # a copy of the token it joined with, owner-only
        assert token.read_text() == Path(record["token_path"]).read_text()
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        status = json.loads(cli(env, "status", "--name", "guest", "--json").stdout)
        assert [i["devices"] for i in status["islands"]] == [1]
    finally:
        stopped = cli(env, "stop", "--name", "guest")
    assert stopped.returncode == 0, stopped.stderr
    assert "the Ray cluster it joined runs on" in stopped.stdout
    assert not (pool_dir / "guest.json").exists() and not (pool_dir / "guest.token").exists()
    assert head.answers(record["address"])  # the first pool's cluster is untouched
    assert cli(env, "status", "--name", NAME).returncode == 0


TENANT = textwrap.dedent("""
    import sys
    import numpy as np, ray
    import pwkernel as pw
    ctl = pw.Controller(backend="ray", address=sys.argv[1], pool=sys.argv[2])
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1, island=0))
    print("value", f(np.arange(2.0)).result(timeout=120).tolist(), flush=True)
    sys.stdin.readline()  # the pool is stopped meanwhile
    print("left", ctl.executor.keepalive.join(120), ray.is_initialized(), flush=True)
    try:
        f(np.arange(2.0)).result(timeout=60)
    except pw.IslandLostError as e:
        print("lost:", e, flush=True)
    view = ctl.executor.status()["pool"]  # (%pathways status): the islands, lost; and
    print("view", [i.get("lost") for i in view["islands"]], ray.is_initialized(), flush=True)
    ctl.close()
    print("closed", ray.is_initialized(), flush=True)
""")


def test_stop_ends_every_process_of_the_pool(started, env, pool_dir):
    _, record = started
    before = head.processes(record)
    assert len(before) >= len(record["pids"])
    port = record["address"].rsplit(":", 1)[1]
    # a user's process that names the pool's directory (reading its logs) is not the pool's
    bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()",
                                  f"{record['session_dir']}/logs"], stdin=subprocess.PIPE)
    # an attached tenant (a notebook kernel) outlives the pool: it leaves the cluster when the
    # pool goes (Ray ended it 60 s later, everything in it lost), its calls say what to do
    tenant = subprocess.Popen([sys.executable, "-c", TENANT, record["address"], NAME],
                              env=env, cwd=ROOT, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tenant.stdout.readline().strip() == "value [1.0, 2.0]"
        done = cli(env, "stop", "--name", NAME)
        assert bystander.poll() is None, "stop ended a process that is not the pool's"
        out, err = tenant.communicate("\n", timeout=TIMEOUT)
    finally:
        bystander.kill()
        bystander.wait(TIMEOUT)
        tenant.kill()
    assert tenant.returncode == 0, err[-3000:]
    assert out.splitlines()[0] == "left True False"
    assert f"pool '{NAME}' lost it" in out and "attach again once the pool runs" in out
    # reading the pool's view started no local cluster of Ray's own (its auto-init took 15 s
    # and then raised "Can't find actor")
    assert f"view {[True] * len(record['islands'])} False" in out.splitlines()
    assert out.splitlines()[-1] == "closed False"  # (closing started no new cluster)
    assert done.returncode == 0, done.stderr
    assert f"pool '{NAME}' stopped" in done.stdout
    assert not (pool_dir / f"{NAME}.json").exists()
    assert not (pool_dir / f"{NAME}.token").exists()
    assert not Path(record["temp_dir"]).exists()
    marks = (record["session_dir"], record["temp_dir"], f"127.0.0.1:{port}",
             f"gcs_server_port={port}", f"--port={port}")
    left = []
    for p in psutil.process_iter(["cmdline", "status", "environ"]):
        line = " ".join(p.info["cmdline"] or [])
        # Ray's agents and workers rename themselves (`ray::DashboardAgent`), and outlive a
        # killed raylet as orphans: their environment still names the pool's token file.
        token = (p.info["environ"] or {}).get("RAY_AUTH_TOKEN_PATH")
        if p.info["status"] != psutil.STATUS_ZOMBIE and (
                any(m in line for m in marks) or token == record["token_path"]):
            left.append((p.pid, line[:200]))
    assert left == []
    assert [p.pid for p in before if _alive(p)] == []
    assert not head.answers(record["address"])


def _alive(p: psutil.Process) -> bool:
    """``p`` still runs as the process we saw (not a zombie, its pid not reused meanwhile)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

"""The Ray backend on a real local Ray cluster: islands are actor processes.

One cluster and one controller for the module (starting them takes ~15 s on 2 cores). The
tests run in file order: the fault test kills and reattaches island 0, the last test closes the
controller and checks no process of ours is left.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest
import ray

import pwkernel as pw
from pwkernel.backends.ray import RayIsland, RemoteBuffer
from pwkernel.bench.figure2 import figure2
from pwkernel.pool import head as pool_head
from tests.helpers.programs import overlapping_chain
from tests.helpers.ray_session import cluster_processes, session_dir

TIMEOUT = 120.0


def run_twice(f) -> list[np.ndarray]:
    """Figure 2, then again on its own output (futures fed back as inputs)."""
    y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
    y2, z2 = f(y)
    out = [np.asarray(v.result(TIMEOUT)) for v in (y, z, y2, z2)]
    for v in (y, z, y2, z2):
        assert v.run.wait(TIMEOUT)
    return out


@pytest.fixture(scope="module")
def expected() -> list[np.ndarray]:
    with pw.Controller(islands=(4, 4)) as local:
        f = figure2(local).f
        return run_twice(f)


STARTED_WARNINGS: list[warnings.WarningMessage] = []  # what starting `rctl` warned of


@pytest.fixture(scope="module")
def rctl():
    """The module's controller, started as in a notebook whose JAX is up already (a cell run
    again); the warnings it gave go to ``STARTED_WARNINGS``."""
    jax.devices()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctl = pw.Controller(backend="ray", islands=(4, 4))
    STARTED_WARNINGS[:] = caught
    try:
        yield ctl
    finally:
        ctl.close()


def wait_dead(actor, timeout: float = TIMEOUT) -> None:
    """Until Ray reports ``actor`` dead (``ray.kill`` is asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.info.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
    raise AssertionError(f"actor {actor} still alive after {timeout} s")


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown backend 'rey'"):
        pw.Controller(backend="rey")
    with pytest.raises(ValueError, match="only for backend='ray'"):
        pw.Controller(ray_address="auto")
    with pw.Controller(islands=(2,)) as local:
        for island in (0, local.islands[0]):  # an island's id, or the Island itself
            with pytest.raises(ValueError, match="backend='ray'"):
                local.reattach(island)
        foreign = pw.Island(0, tuple(local.islands[0].devices[:1]), "cpu")
        with pytest.raises(pw.SliceError, match="not an island of this controller"):
            local.reattach(foreign)
    # an absurd device count: at once, before a cluster starts (not a minute later, in JAX)
    with pytest.raises(pw.DeviceSetupError, match=r"islands=\(100000000000000000000,\) asks "
                       r"for 100000000000000000000 devices; at most 4096 devices in all"):
        pw.Controller(backend="ray", islands=(10**20,))
    assert not ray.is_initialized()


def test_islands_are_actor_processes_on_a_private_cluster(rctl):
    assert all(isinstance(i, RayIsland) for i in rctl.islands)
    infos = [ray.get(i.actor.info.remote()) for i in rctl.islands]
    assert [i["island"] for i in infos] == [0, 1]
    assert all(len(i["devices"]) == 4 and i["platform"] == "cpu" for i in infos)
    assert len({i["pid"] for i in infos}) == 2
    status = rctl._backend.status()
    assert status["token_auth"] is True  # Ray's token authentication stays on
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    ours = {p.pid for p in psutil.Process().children(recursive=True)} | {psutil.Process().pid}
    listening = [c.laddr.ip for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening)
    assert rctl.status()["islands"][0]["lost"] is False


def test_starting_a_cluster_after_jax_gives_no_fork_warning(rctl):
    """Ray starts its processes with fork and exec (Popen with a preexec_fn); the children
    run no JAX, so JAX's "os.fork() ... will likely lead to a deadlock" is noise there."""
    assert [str(w.message) for w in STARTED_WARNINGS if "os.fork()" in str(w.message)] == []


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_figure2_matches_the_local_backend(rctl, expected, mode):
    rctl.dispatch = mode
    start = rctl.trace.next_index
    f = figure2(rctl).f
    got = run_twice(f)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    # Each run: host upload, a, 0->1, b, c, 1->0, a (the second run reads y on island 1).
    assert rctl.trace.wait_for(start + 14, TIMEOUT)
    events = rctl.trace.events(since=start)
    assert all(e.status == "ok" for e in events)
    computes = [e for e in events if e.kind == "compute"]
    assert sorted(e.name for e in computes) == ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    assert {e.island for e in computes if e.name == "a"} == {0}
    dcn = [e for e in events if e.link == "dcn"]
    assert {(e.src, e.dst) for e in dcn} == {(0, 1), (1, 0)}
    # Actor times are on the controller's clock: a node starts after it was submitted (the
    # offset is measured to within a ping's half round trip, microseconds here).
    for e in events:
        assert e.t_start <= e.t_end
        assert e.t_start >= e.t_submit - 0.05


def test_parallel_dispatch_sends_each_island_a_program_in_one_message(rctl):
    f = figure2(rctl).f

    def messages(mode: str) -> list[dict]:
        rctl.dispatch = mode
        before = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
        y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
        assert y.run.wait(TIMEOUT) and z.wait(TIMEOUT)
        after = [ray.get(i.actor.stats.remote()) for i in rctl.islands]
        return [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]

    messages("parallel")  # compiles on both islands
    # Island 0: upload, a, send x, receive c(x), a. Island 1: receive x, b, c, send c(x).
    assert messages("parallel") == [{"messages": 1, "ops": 5}, {"messages": 1, "ops": 4}]
    # Sequential: a node leaves only once its inputs exist, so island 0 gets one message per
    # node (b and c on island 1 may share one: they become ready together).
    seq = messages("sequential")
    assert seq[0] == {"messages": 5, "ops": 5}
    assert seq[1]["ops"] == 4 and seq[1]["messages"] >= 3
    rctl.dispatch = "parallel"


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_an_eval_on_another_island_between_donating_steps_gets_each_steps_value(rctl, mode):
    # Island 0 sent the parameters to the eval's island only once the step before had run,
    # and by then the next step, issued at once, had consumed them: every eval failed with
    # "Array has been deleted" (the island's sends, ``backends/ray/sending.py``).
    s0, s1 = rctl.slice(2, island=0), rctl.slice(2, island=1)

    def slow(p):
        return jax.lax.fori_loop(0, 2000, lambda i, q: jnp.sin(q) * 0.5 + q * 0.5, p)

    step = pw.function(slow, slice=s0, donate_argnums=0, name="slow_step")
    evaluate = pw.function(jnp.sum, slice=s1, name="evaluate")
    ref_step, ref_eval = jax.jit(slow), jax.jit(jnp.sum)
    rctl.dispatch = mode
    try:
        p, ref = step(np.ones(50_000, np.float32)), ref_step(np.ones(50_000, np.float32))
        evals, expected_evals = [], []
        for _ in range(3):
            evals.append(evaluate(p))
            expected_evals.append(float(ref_eval(ref)))
            p, ref = step(p), ref_step(ref)
    finally:
        rctl.dispatch = "parallel"
    np.testing.assert_allclose(np.asarray(p.result(TIMEOUT)), np.asarray(ref), rtol=1e-6)
    assert [float(e.result(TIMEOUT)) for e in evals] == pytest.approx(expected_evals, rel=1e-5)


def test_values_stay_on_islands_until_asked(rctl):
    f = figure2(rctl).f
    y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
    assert y.wait(TIMEOUT) and z.wait(TIMEOUT)
    handle = y._buffer.value
    assert isinstance(handle, RemoteBuffer)
    assert handle.host.island == 1 and handle.bid in rctl._backend.buffers(1)
    value = y.result()
    assert value.sharding == y.sharding  # a local jax.Array laid out like the future
    # Executables were compiled once per island and cached there.
    f(np.array([5.0, 6.0, 7.0, 8.0]))[1].result(TIMEOUT)
    names = [ray.get(i.actor.executables.remote()) for i in rctl.islands]
    assert len(names[0]) == len(set(names[0])) and any(n.startswith("a-") for n in names[0])
    assert any(n.startswith("b-") for n in names[1]) and any(n.startswith("c-") for n in names[1])


def test_jax_clear_caches_lets_go_of_the_islands_executables(rctl):
    """``jax.clear_caches()`` lets go of what only pwkernel's caches kept, as the local backend
    does: on Ray that is the controller's export of each executable and the executable each
    island compiled from it (both were kept as long as the controller lived, so a function
    called on ever new shapes grew both without bound). The function then computes as before:
    its new executables get keys the islands never held."""
    scale = {"now": 1.0}
    grow = pw.function(lambda x: x * scale["now"], slice=rctl.slice(2, island=0), name="grow")
    for n in range(1, 4):
        assert grow(np.ones(2 * n, np.float32)).result(TIMEOUT).tolist() == [1.0] * 2 * n
    island = rctl.islands[0].actor

    def held() -> list[str]:
        rctl._backend.buffers(0)  # (the frees pending now are sent, and done)
        return [k for k in ray.get(island.executables.remote()) if k.startswith("grow-")]

    before = held()
    assert len(before) == 3
    scale["now"] = 2.0
    jax.clear_caches()
    gc.collect()
    assert held() == []
    assert not any(k.startswith("grow-") for k in rctl._backend.hosts[0].sent)
    assert grow(np.ones(2, np.float32)).result(TIMEOUT).tolist() == [2.0] * 2
    assert len(after := held()) == 1 and after[0] not in before


def test_typed_keys_travel_to_islands_between_them_and_back(rctl):
    """A typed PRNG key (jax.random.key), which NumPy cannot hold, is sent as its key data
    and implementation: put on island 0, split there, one half sent to island 1, fetched."""
    split = pw.function(lambda k: tuple(jax.random.split(k)), slice=rctl.slice(2, island=0))
    draw = pw.function(lambda k: jax.random.normal(k, (4,)), slice=rctl.slice(2, island=1))

    @pw.program
    def two_islands(k):
        a, b = split(k)
        return draw(a), b

    for impl in ("threefry2x32", "rbg"):
        x, b = two_islands(jax.random.key(5, impl=impl))
        want_a, want_b = jax.random.split(jax.random.key(5, impl=impl))
        np.testing.assert_array_equal(np.asarray(x.result(TIMEOUT)),
                                      np.asarray(jax.random.normal(want_a, (4,))))
        got = b.result(TIMEOUT)
        assert got.dtype == want_b.dtype and got.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)),
                                      np.asarray(jax.random.key_data(want_b)))


def test_dropped_futures_free_island_buffers(rctl):
    f = figure2(rctl).f
    y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
    assert y.run.wait(TIMEOUT)
    assert rctl._backend.buffers(0) and rctl._backend.buffers(1)
    del y, z
    gc.collect()
    assert rctl._backend.buffers(0) == {} and rctl._backend.buffers(1) == {}
    assert all(n == 0 for n in rctl.memory().values())


def test_a_cancelled_programs_upload_is_freed_while_messages_are_held(rctl):
    """A program cancelled while another submission holds the islands' messages back (every
    parallel submission does, ``executor.group()``) frees its upload's buffer: the free waits
    for the message that makes the buffer. Before, it went out first, in a message of its own,
    and the island kept the upload for good."""
    rctl.dispatch = "parallel"
    s0 = rctl.slice(2, island=0)
    first = pw.function(lambda x: x + 1, slice=s0, name="first")
    twice = pw.function(lambda x: x * 2, slice=s0, name="twice")
    for fn in (first, twice):
        fn(np.ones(8, np.float32)).result(TIMEOUT)
    gc.collect()
    assert rctl.wait(TIMEOUT)
    before = rctl.executor.buffers(0)
    with rctl.executor.group():
        busy = first(np.ones(8, np.float32))  # launched; its message held: s0 stays busy
        y = twice(np.ones(8, np.float32))  # its upload starts, twice waits for s0
        assert y.run.cancel() == 1
        del y
        gc.collect()
        rctl.executor.sites[0].sync()  # the frees pending now are sent at once
    np.testing.assert_array_equal(busy.result(TIMEOUT), np.full(8, 2.0))
    del busy
    gc.collect()
    assert rctl.wait(TIMEOUT)
    assert rctl.executor.buffers(0) == before


def test_a_gone_array_uploaded_to_an_island_fails_naming_it(rctl):
    """A user's array that was deleted, given to a Ray island (uploaded from the controller),
    fails its futures with the ProgramError that says so and the fix, as locally."""
    a = pw.function(lambda x: x * 2, slice=rctl.slice(2, island=0))
    b = pw.function(lambda x: x + 1, slice=rctl.slice(2, island=1))

    @pw.program
    def two_islands(v):
        return b(a(v)), a(v)

    gone = jax.device_put(np.ones(8, np.float32))
    gone.delete()
    for fut in two_islands(gone):
        with pytest.raises(RuntimeError, match="deleted.*donates it") as info:
            fut.result(TIMEOUT)
        assert isinstance(info.value, pw.ProgramError)
    assert two_islands(np.ones(8, np.float32))[0].result(TIMEOUT).tolist() == [3.0] * 8


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_overlapping_slices_keep_their_values_when_sources_are_freed(rctl, mode):
    rctl.dispatch = mode
    for vs in rctl.slices:  # even device loads, so the chain's slices overlap as planned
        vs.release()
    prog = overlapping_chain(rctl)
    for i in range(5):
        out = prog(np.full(24, i, np.float32))
        np.testing.assert_array_equal(np.asarray(out.result(TIMEOUT)),
                                      np.full(24, 2 * i + 1, np.float32))
    del out
    assert rctl.wait(TIMEOUT)
    gc.collect()
    assert rctl._backend.buffers(0) == {}
    rctl.dispatch = "parallel"


def test_host_callbacks_are_refused_at_submit_with_what_to_do(rctl):
    s = rctl.slice(2, island=0)
    negate = pw.function(lambda x: jax.pure_callback(
        np.negative, jax.ShapeDtypeStruct(x.shape, x.dtype), x), slice=s, name="negate")
    with pytest.raises(pw.ProgramError, match=r"negate calls host callbacks \(jax.pure_callback\), "
                       "which cannot be exported to Ray islands") as info:
        negate(np.ones(4, np.float32))
    assert ".result()" in str(info.value) and "backend='local'" in str(info.value)
    double = pw.function(lambda x: x * 2, slice=s)  # the controller carries on
    assert double(np.ones(4, np.float32)).result(TIMEOUT).tolist() == [2.0] * 4


def test_a_lost_island_fails_its_dependents_and_reattach_restores_it(rctl, expected):
    rctl.dispatch = "parallel"
    fig = figure2(rctl)
    f, a = fig.f, fig.a
    s1 = rctl.slice(2, island=1)
    g = pw.function(lambda x: x - 1, slice=s1, name="g")
    kept = a(np.array([1.0, 2.0]))  # lives on island 0, never fetched
    assert kept.wait(TIMEOUT)
    old = rctl.islands[0].actor
    ray.kill(old)
    wait_dead(old)

    y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
    for fut in (y, z):  # every output depends on island 0's first computation
        with pytest.raises(pw.IslandLostError, match="island 0"):
            fut.result(TIMEOUT)
    assert y.run.wait(TIMEOUT)
    with pytest.raises(pw.IslandLostError, match="island 0"):
        kept.result(TIMEOUT)
    # Island 1 keeps working, and holds nothing for the failed program.
    np.testing.assert_array_equal(g(np.ones(4)).result(TIMEOUT), np.zeros(4))
    del y, z
    gc.collect()
    assert rctl._backend.buffers(1) == {}
    assert rctl.status()["islands"][0]["lost"] is True

    island0 = set(rctl.islands[0].device_ids)
    assert sum(n for d, n in rctl.memory().items() if d.id in island0) > 0  # kept's
    island = rctl.reattach(rctl.islands[0])  # an Island works as well as its id
    assert island.actor is not old and rctl.islands[0].actor is island.actor
    # what lived on the old process is no longer counted (a budget would wait for it)
    assert sum(n for d, n in rctl.memory().items() if d.id in island0) == 0, rctl.memory()
    got = run_twice(f)
    for g_, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g_, e)
    with pytest.raises(pw.IslandLostError):  # the old generation's buffer stays lost
        kept.result()


def test_notebook_attach_ray_hosts_a_ray_controller(rctl, capsys):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pwkernel")
    try:
        with pytest.raises(UsageError, match="not a list of positive ints"):
            shell.run_line_magic("pathways", "attach ray --islands 0")
        shell.run_line_magic("pathways", "attach ray --islands 2,2")
        assert "attached ray: island 0: 2 cpu, island 1: 2 cpu" in capsys.readouterr().out
        ctl = pw.controller()
        assert ctl.backend == "ray" and all(isinstance(i, RayIsland) for i in ctl.islands)
        double = pw.function(lambda x: x * 2, slice=ctl.slice(2, island=1))
        np.testing.assert_array_equal(double(np.ones(2)).result(TIMEOUT), [2.0, 2.0])
        # An explicit-axes cell runs on the actors with the layouts JAX gives.
        shell.run_line_magic("pathways", "slice rs 2 --island 0")
        shell.run_cell("import jax, jax.numpy as jnp, numpy as np\nv = np.ones((4, 2), "
                       "np.float32)")
        res = shell.run_cell("%%pathways --slice rs\nw = jax.device_put(v, jax.P('x')) * 2\n"
                             "t = jnp.dot(w, w.T, out_sharding=jax.P(None, 'x'))")
        assert res.error_in_exec is None, res.error_in_exec
        t = shell.user_ns["t"]
        assert t.sharding.spec == jax.P(None, "x") and t.sharding.mesh.axis_types == (
            jax.sharding.AxisType.Explicit,)
        np.testing.assert_array_equal(np.asarray(t.result(TIMEOUT)), np.full((4, 4), 8.0))
    finally:
        shell.run_line_magic("unload_ext", "pwkernel")
    assert ray.is_initialized() and not rctl.closed  # the shared local cluster stays up


def test_island_device_kind_follows_the_cluster_and_the_override(rctl, monkeypatch):
    from pwkernel.backends.ray.backend import _device_kind

    assert ray.cluster_resources().get("GPU", 0) == 0  # this machine: islands on CPU devices
    monkeypatch.delenv("PWKERNEL_RAY_DEVICES", raising=False)
    assert _device_kind((2, 2)) == "cpu"
    monkeypatch.setenv("PWKERNEL_RAY_DEVICES", "gpu")  # refused at once, not after a wait
    with pytest.raises(pw.DeviceSetupError, match="has 0 GPUs and islands=.2, 2. need 4"):
        _device_kind((2, 2))
    monkeypatch.setenv("PWKERNEL_RAY_DEVICES", "tpu")
    with pytest.raises(pw.DeviceSetupError, match="expected auto, cpu or gpu"):
        _device_kind((2, 2))


def test_the_memory_budget_holds_on_ray_islands():
    # Its own controller (a budget is fixed at creation): the fan-in that cannot fit fails
    # with who holds what, uploads are counted (too big: refused), and memory returns to zero.
    from tests.helpers.budget import MiB, check_fan_in_fails_and_says_who_holds_the_memory

    with pw.Controller(backend="ray", islands=(4, 4), memory_budget=4 * MiB) as ctl:
        check_fan_in_fails_and_says_who_holds_the_memory(ctl)
        first = pw.function(lambda x: x[:2], slice=ctl.slice(2, island=1))
        with pytest.raises(pw.MemoryBudgetError, match="copy host.*memory budget is 4194304"):
            first(np.ones(4 * MiB, np.float32)).result(timeout=TIMEOUT)
        assert first(np.ones(4, np.float32)).result(timeout=TIMEOUT).tolist() == [1.0, 1.0]


def test_close_leaves_no_processes(rctl, caplog):
    """Nor the cluster's session directory, unless an island's actor died meanwhile: then its
    logs (which say why) are kept, and the warning says where."""
    pids = [ray.get(i.actor.info.remote())["pid"] for i in rctl.islands]
    before = cluster_processes()
    assert any("raylet" in p.name() or "gcs_server" in p.name() for p in before)
    session = session_dir(before)
    actor = rctl.islands[1].actor
    ray.kill(actor)
    wait_dead(actor)
    with pytest.raises(pw.IslandLostError, match="island 1"):  # (how the loss is seen)
        pw.function(lambda x: x + 1, slice=rctl.slice(1, island=1))(np.ones(2)).result(TIMEOUT)
    with caplog.at_level(logging.WARNING, logger="pwkernel"):
        rctl.close()
    assert not ray.is_initialized()
    _, alive = psutil.wait_procs(before, timeout=60)
    assert alive == [], f"processes left after close(): {[p.name() for p in alive]}"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids)
    try:
        assert session.is_dir(), "the logs of a cluster whose island died were removed"
        assert f"its logs are kept in {session}" in caplog.text, caplog.text
    finally:
        shutil.rmtree(session, ignore_errors=True)
    with pytest.raises(pw.ControllerClosedError):
        rctl.slice(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_joins_a_running_cluster_by_address_and_leaves_it_running():
    """`ray start --head` (as docs/ray.md tells users), then ray_address="host:port": token
    authentication on both sides, the cluster keeps running after close(). The cluster is ended
    by its session (`ray start` runs in one of its own): Ray's agents rename themselves and
    outlive a killed raylet, so their command lines do not find them."""
    assert not ray.is_initialized()
    port = _free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # bind 127.0.0.1 only
    since = time.time()
    start = subprocess.Popen([ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1",
                              "--port", str(port), "--num-cpus", "1", "--include-dashboard",
                              "false", "--disable-usage-stats"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)

    def cluster_processes() -> list[psutil.Process]:
        return pool_head.session_processes(start.pid, since)

    try:
        out, _ = start.communicate(timeout=TIMEOUT)
        assert start.returncode == 0, out[-3000:]
        with pytest.raises(pw.DeviceSetupError, match="could not connect"):
            pw.Controller(backend="ray", islands=(1,), ray_address=f"127.0.0.1:{_free_port()}")
        ctl = pw.Controller(backend="ray", islands=(2, 2), ray_address=f"127.0.0.1:{port}")
        try:
            assert ctl._backend.status()["token_auth"] is True
            assert ray.get_runtime_context().gcs_address == f"127.0.0.1:{port}"
            f = figure2(ctl).f
            y, z = f(np.array([1.0, 2.0, 3.0, 4.0]))
            np.testing.assert_array_equal(y.result(TIMEOUT), [3.0, 5.0, 7.0, 9.0])
            np.testing.assert_array_equal(z.result(TIMEOUT), [2.0, 4.0, 6.0, 8.0])
        finally:
            ctl.close()
        assert not ray.is_initialized()  # this process disconnected...
        assert any("gcs_server" in p.name() for p in cluster_processes())  # ...it runs on
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        procs = cluster_processes()
        for p in procs:
            p.kill()
        psutil.wait_procs(procs, timeout=60)
        left = [f"{p.pid} {p.name()}" for p in cluster_processes()]
        for made in Path(tempfile.gettempdir(), "ray").glob(f"session_*_{start.pid}"):
            shutil.rmtree(made, ignore_errors=True)  # (the head's: Ray names it by its pid)
        current = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")  # `ray stop` would
        if current.exists() and current.read_text().strip() == f"127.0.0.1:{port}":
            current.unlink()
    assert left == [], f"processes of the test's cluster left running after the cleanup: {left}"

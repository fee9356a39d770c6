"""The benchmarks run end to end in their tiny configuration and write the promised JSON.

No speed assertions: these prove the harness and every benchmark work, not how fast they are.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from PIL import Image

from pwkernel.bench import harness, runner
from pwkernel.bench.harness import TARGETS

EXPECTED = {
    "dispatch": {"opbyop_vs_jax", "chained_vs_jax_opbyop", "fused_vs_jax_fused",
                 "cpu_us_per_node_opbyop", "cpu_us_per_node_chained", "breakeven_us",
                 "chained_vs_jax_at_1ms", "opbyop_vs_jax_at_1ms", "host_cpu_growth",
                 "cpu_chained_vs_jax_call", "cpu_opbyop_vs_jax_call"},
    "parallel-dispatch": {"parallel_vs_sequential"},
    "pipeline": {"pipeline_vs_spmd"},
    "multitenancy": {"multitenant_vs_single", "share_error"},
    "dcn": {"two_islands_vs_one"},
    "tracing": {"tracing_overhead", "tracing_and_view_cpu"},
    "sim-paper": {"sim_breakeven_error_pct", "sim_prediction_error_pct", "sim_share_error"},
    "train": {"train_spmd_vs_jax", "train_spmd_packed_vs_jax", "train_pipeline_vs_spmd",
              "train_two_islands_vs_one", "train_1f1b_vs_gpipe_peak_memory"},
    "pool": {"pool_aggregate_vs_alone_1", "pool_aggregate_vs_alone_2",
             "pool_aggregate_vs_alone_4", "pool_share_error", "pool_reclaim_s"},
}


def _finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def check_tiny_payload(payload: dict, name: str) -> dict:
    result = payload["benchmarks"][name]
    assert set(result["ratios"]) == EXPECTED[name]
    ratios = {k: v for k, v in result["ratios"].items()
              if not (k == "breakeven_us" and v is None)}  # a tiny sweep may never get there
    assert all(_finite(v) and v == v for v in ratios.values()), result["ratios"]
    assert result["rows"], "a benchmark reports the rows its ratios come from"
    assert payload["machine"]["devices"] == 8
    assert set(payload["verdicts"]) == EXPECTED[name]
    json.dumps(payload, default=str)  # the payload is JSON-serializable
    return result


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"pool"}))
def test_benchmark_runs_tiny(name):
    check_tiny_payload(runner.run_benchmarks([name], mode="tiny"), name)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


def test_pool_runs_tiny_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PWKERNEL_POOL_DIR", str(tmp_path))
    result = check_tiny_payload(runner.run_benchmarks(["pool"], mode="tiny"), "pool")
    shares = result["shares"]
    assert shares["overlaps"] == 0, shares  # the island's one order: no two tenants at once
    tenants = shares["tenants"]
    assert [t["weight"] for t in tenants.values()] == [1, 2, 4, 8], tenants
    # what the island's share policy is for: weight 8 got more device time than weight 1
    assert tenants["w8"]["achieved_pct"] > 2 * tenants["w1"]["achieved_pct"], tenants
    freed = result["reclaim"]
    assert freed["bytes_freed"] >= freed["holding"], freed
    assert freed["dropped_s"] <= freed["reclaim_s"], freed
    assert [r["variant"] for r in result["rows"][:4]] == ["dedicated", "1 tenants",
                                                         "2 tenants", "4 tenants"], result["rows"]
    assert list(tmp_path.iterdir()) == []  # the pool stopped: its files went
    mark = f"bench-{os.getpid()}"
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(mark in part for part in p.info["cmdline"] or ())]
    assert left == [], left  # the pool's Ray processes and its tenants
    ours = [c for c in psutil.Process().children(recursive=True)
            if "pwkernel.bench.pool_tenant" in _cmdline(c)]
    assert ours == [], ours  # the dedicated client too


def test_pool_benchmark_ended_by_sigterm_stops_its_pool_and_tenants(tmp_path):
    """``timeout`` or a job scheduler ends a run with SIGTERM: the CLI stops what it started
    (the pool's Ray cluster, the tenant processes) on the way out, as on Ctrl-C."""
    env = dict(os.environ, PWKERNEL_POOL_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "pwkernel.bench", "pool", "--tiny"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    mark, seen = f"bench-{proc.pid}", []
    try:
        for line in proc.stderr:  # its phases; tenants attached and compiled: all is running
            seen.append(line)
            if "processes ready" in line:
                break
        assert seen and "processes ready" in seen[-1], "".join(seen)[-3000:]  # (not at EOF)
        assert any(mark in " ".join(p.info["cmdline"] or ())
                   for p in psutil.process_iter(["cmdline"]))  # its tenants run now
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=600)  # (its stop takes a minute or two at most)
        assert proc.returncode == 128 + signal.SIGTERM, rest[-3000:]
        assert list(tmp_path.iterdir()) == []  # the pool stopped: its files went
        left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                if any(mark in part for part in p.info["cmdline"] or ())]
        assert left == [], left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        proc.stderr.close()
        if any(tmp_path.iterdir()):  # (a failure left it running: stop it, as a user would)
            subprocess.run([sys.executable, "-m", "pwkernel.pool", "stop", "--name", mark],
                           env=env, capture_output=True, timeout=300)


def test_dispatch_rows_have_every_variant_and_slice_and_the_steps_sweep():
    result = runner.run_one("dispatch", "tiny")
    assert {r["devices"] for r in result.rows} == {1, 2}
    for row in result.rows:
        assert set(row["steps_per_s"]) == {"pw_opbyop", "jax_opbyop", "pw_chained",
                                           "pw_fused", "jax_fused"}
        assert all(s["median"] > 0 for s in row["steps_per_s"].values())
    assert set(result.extra["by_devices"]["opbyop_vs_jax"]) == {"1", "2"}
    # the steps sweep (issue 25): every way, both slices, and its keys finite and positive
    steps = result.extra["steps"]["rows"]
    assert {r["devices"] for r in steps} == {1, 2}  # tiny: one step size on 1 and 2 devices
    for row in steps:
        assert set(row["steps_per_s"]) == set(row["cpu_us_per_step"]) == {
            "pw_opbyop", "pw_chained", "jax_opbyop"}
        assert all(s["median"] > 0 for s in row["steps_per_s"].values())
        assert all(s["median"] > 0 for s in row["cpu_us_per_step"].values())
        assert row["jax_step_ms"] > 0 and row["batch"] % (8 * row["devices"]) == 0
    for key in ("chained_vs_jax_at_1ms", "opbyop_vs_jax_at_1ms", "host_cpu_growth",
                "cpu_chained_vs_jax_call", "cpu_opbyop_vs_jax_call"):
        value = result.ratios[key]
        assert _finite(value) and value > 0, (key, value)
    cpu = result.extra["cpu_us_per_node"]
    assert result.ratios["cpu_opbyop_vs_jax_call"] == pytest.approx(
        cpu["pw_opbyop"] / cpu["jax_opbyop"], rel=1e-2)


def test_multitenancy_shares_cover_every_weight():
    result = runner.run_one("multitenancy", "tiny")
    clients = result.extra["shares"]["clients"]
    assert [c["weight"] for c in clients.values()] == [1, 2, 4, 8]
    # what the share policy is for: weight 8 got more device time than weight 1 (each had the
    # same backlog, so under FIFO or a broken policy the two would be about even)
    heavy, light = clients["w8"], clients["w1"]
    assert heavy["achieved_pct"] > 2 * light["achieved_pct"], clients


def test_a_share_client_that_fails_says_so_and_holds_no_other_back():
    """A client of the share measurement that raises (here: a weight ctl.client refuses)
    fails the measurement with its error as the cause, at once: before, the others waited at
    the barrier for two minutes and the run ended in max() of an empty sequence."""
    import pwkernel as pw
    from pwkernel.bench import multitenancy

    cfg = dict(multitenancy.CONFIGS["tiny"], weights=(1, -1))
    ctl = pw.Controller(islands=(4, 4))
    try:
        with pytest.raises(RuntimeError, match=r"failed \['w-1'\]") as info:
            multitenancy._shares(ctl, cfg)
        assert "weight" in str(info.value.__cause__)
    finally:
        ctl.close()


def test_parallel_dispatch_skips_the_ray_row_in_tiny_mode():
    result = runner.run_one("parallel-dispatch", "tiny")
    ray = [r for r in result.rows if r["backend"] == "ray"]
    assert ray and ray[0]["status"] == "skipped"
    assert "parallel_vs_sequential_ray" not in result.ratios


def test_sim_paper_fits_only_the_break_even_points_and_predicts_every_other_result():
    result = runner.run_one("sim-paper", "tiny")
    kinds = {r["result"]: r["kind"] for r in result.rows}
    fit = [r for r in result.rows if r["kind"] == "fit"]
    assert [r["result"] for r in fit] == ["dispatch break-even at 16 hosts",
                                          "dispatch break-even at 512 hosts"]
    assert all(abs(r["error_pct"]) < 15 for r in fit), fit
    for topic in ("Fused matches", "Chained matches", "parallel / sequential", "multi-tenancy",
                  "proportional share", "3B decoder, 4 stages", "3B decoder, 16 stages",
                  "two islands over DCN"):
        assert any(k.startswith(topic) and v == "prediction" for k, v in kinds.items()), topic
    assert sorted(result.extra["fit"]["params"]) == ["client_per_program",
                                                     "program_fanout_per_host"]
    assert "prediction" in result.extra["table"] and "fit" in result.extra["table"]


def test_tracing_reports_the_live_view_row():
    result = runner.run_one("tracing", "tiny")
    live = [r for r in result.rows if r["variant"] == "trace_on+live_view"]
    assert live and (live[0]["status"] == "ok" or live[0]["status"].startswith("not available"))


def test_train_reports_both_memory_measures_and_every_comparison():
    result = runner.run_one("train", "tiny")
    memory = result.extra["memory"]
    for schedule in ("gpipe", "1f1b"):
        assert memory[schedule]["sampled"] > 0 and memory[schedule]["sampled_parallel"] > 0
        assert 0 < memory[schedule]["bubble"] < 1
    # the trace-derived peak is the schedule's: stage 0 holds M microbatches' residuals under
    # GPipe, 2 (the number of stages) under 1F1B
    r0, r1 = memory["residual_bytes_per_microbatch"]
    m = memory["microbatches"]
    assert memory["gpipe"]["trace"] == m * max(r0, r1)
    assert memory["1f1b"]["trace"] == max(2 * r0, r1)
    assert {r["comparison"] for r in result.rows} == {
        "train_spmd_vs_jax", "train_spmd_packed_vs_jax", "train_pipeline_vs_spmd",
        "train_two_islands_vs_one"}
    assert all(r["jax_step_ms"] > 0 for r in result.rows if r["comparison"].startswith(
        "train_spmd"))
    assert result.extra["packed_state_futures"] < result.extra["state_futures"]


def test_cli_writes_json_with_every_ratio_key_and_a_plot(tmp_path: Path):
    out, png = tmp_path / "all.json", tmp_path / "dispatch.png"
    proc = subprocess.run([sys.executable, "-m", "pwkernel.bench", "all", "--tiny",
                           "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads(out.read_text())
    # every headline key (the Ray row is not run in tiny mode: its cluster takes ~20 s; the
    # pool benchmark is not in `all`: it is run by name, below)
    assert set(payload["ratios"]) == set(TARGETS) - {"parallel_vs_sequential_ray"} - EXPECTED[
        "pool"]
    assert set(payload["benchmarks"]) == set(EXPECTED) - set(runner.NOT_IN_ALL)
    assert {"cpu", "usable_cores", "device_kinds", "versions"} <= set(payload["machine"])
    assert payload["command"].startswith("python -m pwkernel.bench all --tiny")
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 300


def test_every_headline_key_is_explained_in_the_docs():
    """Each key of the ``ratios`` object (scripts read them) is named, in backquotes, in
    docs/benchmarks.md or, for the pool's, docs/pool.md: what it measures and its target."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "benchmarks.md").read_text() + (docs / "pool.md").read_text()
    assert sorted(set(TARGETS) - set(re.findall(r"`(\w+)`", text))) == []


def test_cli_rejects_an_unknown_benchmark():
    proc = subprocess.run([sys.executable, "-m", "pwkernel.bench", "dispach", "--tiny"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown benchmark 'dispach'" in proc.stderr and "dispatch" in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["sim-paper", "--plot", "x.png"], "--plot draws the dispatch benchmark"),
    (["dispatch", "--islands", "16"], "needs 16 devices; JAX has 8"),
    (["dispatch", "--islands", "abc"], "device counts per island"),
    (["parallel-dispatch", "--json", "/proc/no/x.json"], "cannot make its folder"),
    (["sim-paper", "--json", "."], "--json . is a folder"),
    (["dispatch", "--plot", "."], "--plot . is a folder")])
def test_cli_refuses_what_would_fail_before_running_anything(args, says, capsys):
    """Refused at once (exit 2) with what to fix, not after minutes of measuring."""
    from pwkernel.bench.__main__ import main

    with pytest.raises(SystemExit) as done:
        main([*args, "--tiny"])
    seen = capsys.readouterr()
    assert done.value.code == 2 and says in seen.err
    assert "running" not in seen.out and not Path("x.png").exists()  # nothing was measured


def test_harness_interleaves_and_pairs_rounds():
    calls: list[str] = []

    def variant(name: str, value: float):
        def f():
            calls.append(name)
            return value
        return f

    samples = harness.interleave({"a": variant("a", 3.0), "b": variant("b", 1.5)}, rounds=4,
                                 warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert samples == {"a": [3.0] * 4, "b": [1.5] * 4}
    assert harness.paired_ratio(samples, "a", "b") == 2.0
    assert harness.summarize([1.0, 5.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 5.0, "n": 3}


def test_harness_rejects_bad_input():
    with pytest.raises(ValueError, match="mode must be one of"):
        harness.check_mode("fast")
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        harness.interleave({"a": lambda: 1.0}, rounds=0)
    with pytest.raises(ValueError, match="dispatch benchmark's result"):
        from pwkernel.bench.plot import dispatch_png
        dispatch_png({"name": "dcn", "rows": []}, "x.png")


def test_verdicts_follow_each_target_direction():
    assert harness.verdict("opbyop_vs_jax", 0.9) == "meets"
    assert harness.verdict("opbyop_vs_jax", 0.5) == "misses"
    assert harness.verdict("share_error", 2.0) == "meets"
    assert harness.verdict("tracing_overhead", 7.0) == "misses"
    assert harness.verdict("pipeline_vs_spmd", None) == "n/a"


def test_breakeven_is_where_chained_and_fused_reach_95_percent_and_stay():
    from pwkernel.bench.dispatch import breakeven

    def row(devices, us, chained, fused):
        return {"devices": devices, "size": int(us * 100), "computation_us": us,
                "chained_vs_jax_opbyop": chained, "fused_vs_jax_fused": fused}

    rows = [row(2, 1, 0.5, 0.6), row(2, 10, 0.96, 0.9), row(2, 100, 0.97, 0.96),
            row(2, 1000, 0.99, 0.99),
            row(4, 1, 0.5, 0.5), row(4, 10, 0.96, 0.97), row(4, 100, 0.94, 0.98),  # a dip
            row(4, 1000, 0.99, 0.96)]
    value, how = breakeven(rows, [2, 4])
    assert how["2"] == {"us": 100, "reached": True}  # fused gets there last, at 100 us
    assert how["4"] == {"us": 1000, "reached": True}  # chained dips at 100: only 1000 stays
    assert value == 1000
    never = [row(2, 1, 0.5, 0.5), row(2, 10, 0.9, 0.99)]
    assert breakeven(never, [2]) == (None, {"2": {"us": 10, "reached": False}})


def test_dispatch_reports_the_controllers_own_cost():
    result = runner.run_one("dispatch", "tiny")
    cpu = result.extra["cpu_us_per_node"]
    assert set(cpu) == {"pw_opbyop", "pw_chained", "jax_opbyop"} and min(cpu.values()) > 0
    assert result.ratios["cpu_us_per_node_opbyop"] == cpu["pw_opbyop"]
    assert set(result.extra["breakeven"]) == {"2"}


def _entry(seq, tenant, devices, t0, t1, kind="compute"):
    return {"seq": seq, "tenant": tenant, "name": f"f{seq}", "kind": kind, "devices": devices,
            "t_launch": t0, "t_start": t0, "t_end": t1, "ok": True}


def test_pool_helpers_read_an_islands_launch_log():
    from pwkernel.bench.pool import busy_window_device_time, overlaps, schedule_columns

    log = [_entry(0, "a", [0, 1], 0.0, 1.0), _entry(1, "b", [1, 2], 1.0, 2.0),
           _entry(2, "a", [3], 1.5, 2.5),  # beside b's, on another device: allowed
           _entry(3, "a", [0], 2.0, 3.0), _entry(4, "b", [2], 2.5, 4.0),
           _entry(5, "b", [0], 0.5, 0.7, kind="put")]  # a copy takes no device
    assert overlaps(log) == []
    clash = [*log, _entry(6, "b", [3], 2.0, 2.2)]  # b on device 3 while a's #2 runs there
    assert overlaps(clash) == [(2, 6)]
    # both busy from b's first start (1.0) to a's last end (3.0)
    busy = busy_window_device_time(log, ["a", "b"])
    assert busy == {"a": pytest.approx(1.0 + 1.0), "b": pytest.approx(2.0 + 0.5)}
    cols = schedule_columns({0: log[:2], 1: [_entry(0, "c", [1], 5.0, 6.0)]}, {0: 0, 1: 4},
                            t0=1.0)
    assert cols["device"] == [0, 1, 1, 2, 5] and cols["tenant"] == ["a", "a", "b", "b", "c"]
    assert cols["left"][-1] == 4.0 and cols["top"][-1] == pytest.approx(5.4)


def test_ab_runs_two_checkouts_in_one_process_and_reports_every_figure():
    """bench/ab.py against this checkout itself (imported a second time as pwkernel_base):
    every workload reports both sides beside JAX; a bad base or workload is refused."""
    root = Path(__file__).resolve().parents[2]
    tool = [sys.executable, str(root / "bench" / "ab.py")]
    done = subprocess.run([*tool, "--base", str(root), "--rounds", "1"], capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    for side in ("base", "this"):
        assert out["cpu"][f"cpu_us_per_node_{side}_chained"] > 0
        assert out["cpu"][f"cpu_opbyop_vs_jax_call_{side}"] > 0
        for work in ("leaf", "leaf1", "train"):
            assert out[work][f"{side}_wall_us_per_step"] > 0
            assert out[work][f"{side}_vs_jax_wall"] > 0
            assert f"{side}_extra_thread_cpu_us_per_step" in out[work]
        for way in ("opbyop", "chained"):
            assert out["steps"][f"{side}_{way}_vs_jax_wall"] > 0
    assert out["steps"]["jax_wall_us_per_step"] > 0
    bad = subprocess.run([*tool, "--base", "/nonexistent"], capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert bad.returncode != 0 and "no pwkernel package there" in bad.stderr
    wrong = subprocess.run([*tool, "--base", str(root), "speed"], capture_output=True,
                           text=True, timeout=120, cwd=root)
    assert wrong.returncode != 0 and "unknown workload 'speed'" in wrong.stderr


def test_profile_script_puts_every_runtime_module_in_a_part():
    """bench/profile_dispatch.py shares CPU time out by parts of the runtime: a module that
    joins the runtime without a part would be lumped with JAX's glue, unseen."""
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path.insert(0, 'bench'); import profile_dispatch; "
            "print(profile_dispatch.unmatched_modules())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_spy_train_reports_the_timed_loop_per_step_and_runs_its_loop(tmp_path):
    """bench/spy_train.py: ``report`` keeps the main thread's samples under the timed loop
    (not start-up's), leaves JAX's dispatch and waits out unless asked, and gives
    microseconds per step; ``loop`` runs both ways and prints its step count."""
    root = Path(__file__).resolve().parents[2]
    pre = "thread (1): MainThread;<module> (spy_train.py:9);sampled (spy_train.py:60)"
    raw = tmp_path / "spy.txt"
    raw.write_text("\n".join([
        "thread (1): MainThread;<module> (spy_train.py:9);_compile (program.py:3) 50",
        f"{pre};SPMD.step (pwkernel/train/spmd.py:1);Dispatcher.submit (d.py:2) 30",
        f"{pre};SPMD.step (pwkernel/train/spmd.py:1) 10",
        f"{pre};SPMD.step (pwkernel/train/spmd.py:1);Compiled.__call__ (stages.py:890) 40",
        f"{pre};wait (state.py:1);Event.wait (threading.py:629) 20",
        "thread (7): pw-island0-watch-0.1;_run (executor.py:5) 5", ""]))
    sys.path.insert(0, str(root / "bench"))
    try:
        import spy_train
    finally:
        sys.path.remove(str(root / "bench"))
    out = spy_train.report(str(raw), steps=10, rate=1000.0, keep_waits=False, top=10)
    # one sample = 1e6 / 1000 / 10 = 100 us a step; start-up's 50 samples are not the loop's
    assert out["main_thread_us_per_step"] == 4000.0
    by = out["main_thread_by_function"]
    assert by["SPMD.step (pwkernel/train/spmd.py)"] == 4000.0
    assert by["Dispatcher.submit (d.py)"] == 3000.0 and "sampled (spy_train.py)" not in by
    assert out["thread_samples_us_per_step"] == {"MainThread": 10000.0,
                                                  "pw-island0-watch-0.1": 500.0}
    kept = spy_train.report(str(raw), steps=10, rate=1000.0, keep_waits=True, top=10)
    assert kept["main_thread_us_per_step"] == 10000.0
    for way in ("pw", "jax"):
        done = subprocess.run([sys.executable, str(root / "bench" / "spy_train.py"), "loop",
                               "--way", way, "--seconds", "0.5"], capture_output=True,
                              text=True, timeout=600, cwd=root)
        assert done.returncode == 0, done.stderr[-3000:]
        assert re.match(rf"{way}: \d+ steps, [\d.]+ ms a step", done.stdout), done.stdout


def test_a_benchmark_that_raises_is_reported_and_the_others_still_run(monkeypatch):
    """A failure part-way through a run keeps what the other benchmarks measured."""
    monkeypatch.setenv("PWKERNEL_BENCH_ISLANDS", "abc")  # dispatch's controller refuses it
    payload = runner.run_benchmarks(["dispatch", "sim-paper"], mode="tiny")
    assert payload["failed"] == ["dispatch"]
    failed = payload["benchmarks"]["dispatch"]
    assert failed["error"].startswith("DeviceSetupError: PWKERNEL_BENCH_ISLANDS='abc'")
    assert "Traceback" in failed["traceback"]
    check_tiny_payload(payload, "sim-paper")  # measured after the failure, all of it
    assert "running" not in payload


def test_cli_writes_the_json_and_exits_1_when_a_benchmark_fails(tmp_path, monkeypatch, capsys):
    """The CLI writes every finished benchmark, names the failed one, skips its plot and exits
    1, instead of losing the run (or calling a benchmark's own error a usage error)."""
    from pwkernel.bench.__main__ import main

    # a benchmark whose module cannot be imported: fails inside the run, not in the CLI's checks
    monkeypatch.setitem(runner.BENCHMARKS, "dispatch", "no_such_benchmark_module")
    out, png = tmp_path / "out.json", tmp_path / "d.png"
    code = main(["dispatch", "sim-paper", "--tiny", "--json", str(out), "--plot", str(png)])
    seen = capsys.readouterr()
    assert code == 1
    assert "failed: dispatch" in seen.err and "no plot" in seen.err and not png.exists()
    payload = json.loads(out.read_text())
    assert payload["failed"] == ["dispatch"]
    assert "ModuleNotFoundError" in payload["benchmarks"]["dispatch"]["error"]
    assert set(payload["ratios"]) == EXPECTED["sim-paper"] == set(payload["verdicts"])


def test_cli_ended_by_sigterm_writes_what_finished(tmp_path):
    """``timeout`` (bench/gpu.sh's deadline) ends a run with SIGTERM: the benchmarks that
    finished are in the JSON, with what was running when it stopped."""
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-m", "pwkernel.bench", "sim-paper", "dispatch",
                             "--tiny", "--json", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("running dispatch"):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    payload = json.loads(out.read_text())
    assert payload["interrupted"] == {"by": "SystemExit", "during": "dispatch"}
    assert list(payload["benchmarks"]) == ["sim-paper"]
    assert set(payload["ratios"]) == EXPECTED["sim-paper"]


def test_islands_from_the_environment_are_checked_before_running(monkeypatch, capsys):
    from pwkernel.bench.__main__ import main

    monkeypatch.setenv("PWKERNEL_BENCH_ISLANDS", "16")
    with pytest.raises(SystemExit) as done:
        main(["dispatch", "--tiny"])
    seen = capsys.readouterr()
    assert done.value.code == 2 and "PWKERNEL_BENCH_ISLANDS" in seen.err
    assert "needs 16 devices; JAX has 8" in seen.err and "running" not in seen.out


def test_json_is_standard_json_with_no_nan(tmp_path):
    """A ratio with no samples is NaN in Python; the file says null (jq and JavaScript
    refuse NaN)."""
    path = harness.write_json(tmp_path / "r.json", {
        "ratios": {"a": float("nan"), "b": 1.5}, "rows": [{"x": float("inf")}, (2.0,)]})

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "ratios": {"a": None, "b": 1.5}, "rows": [{"x": None}, [2.0]]}


@pytest.mark.parametrize("script, args, says", [
    ("thread_cpu.py", ["--rounds", "0"], "--rounds must be at least 1"),
    ("thread_cpu.py", ["--seconds", "0"], "--ms and --seconds must be above 0"),
    ("thread_cpu.py", ["--devices", "8"], "--devices must be 1 to 4"),
    ("packed_state.py", ["--steps", "0"], "--steps must be at least 1"),
    ("packed_state.py", ["--rounds", "0"], "--rounds must be at least 1")])
def test_bench_scripts_refuse_bad_flags_before_measuring(script, args, says):
    """A bad flag is a usage error at once, not a KeyError or ZeroDivisionError after the
    calibration or compilation."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "bench" / script), *args],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]


def test_plot_of_one_slice_shows_every_variant_in_its_legend(tmp_path):
    """With one island of one device (``--islands 1``, bench/gpu.sh on one GPU) the figure
    has one panel; its legend still shows all five variants."""
    from pwkernel.bench.plot import COLORS, MARGIN, PANEL_H, dispatch_png

    rows = [{"devices": 1, "computation_us": us,
             "steps_per_s": {v: {"median": 1e5 / us * (i + 1)} for i, v in enumerate(COLORS)}}
            for us in (1.0, 10.0, 100.0)]
    path = dispatch_png({"name": "dispatch", "rows": rows}, tmp_path / "one.png")
    with Image.open(path) as img:
        legend = img.convert("RGB").crop((0, PANEL_H + MARGIN + 40, img.width, img.height))
        seen = {color for _, color in legend.getcolors(maxcolors=1 << 16)}
    assert [v for v, color in COLORS.items() if color not in seen] == []

def test_the_multitenancy_measurements_give_their_slice_back():
    """Tutorial 05 calls ``throughput`` on the kernel's controller: each call (each rerun of
    the cell) left one more slice of island 0 held, so the controller's slices grew with every
    rerun and island 0's devices counted one more slice each time they were placed on."""
    import pwkernel as pw
    from pwkernel.bench import multitenancy

    cfg = dict(multitenancy.CONFIGS["tiny"], programs=1, backlog=2, share_size=4096)
    ctl = pw.Controller(islands=(4, 4))
    try:
        for _ in range(3):  # the cell run again
            multitenancy.throughput(ctl, cfg)
            multitenancy._shares(ctl, cfg)
        assert ctl.slices == ()
        ctl.policy = "fifo"
        assert ctl.slice(4).device_ids == (0, 1, 2, 3)  # island 0 carries nothing now
    finally:
        ctl.close()

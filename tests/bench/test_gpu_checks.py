"""``bench/gpu_checks.py``: the correctness checks ``bench/gpu.sh`` runs on a real accelerator
before its benchmarks, run here on the host CPU (where they also pass), also on one island of
one device (what one GPU gives), and a failing check reported as failed; and
``bench/host_leaves.py`` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_checks.py"
NAMES = {"function_matches_jit", "chained_program_matches_jit", "donation_only_when_asked",
         "a_failure_stays_in_its_future", "spmd_training_matches_plain_jax",
         "memory_given_back"}


@pytest.mark.parametrize("islands, sizes", [(None, [4, 4]), ("1", [1])])
def test_every_check_passes_on_the_host_cpu(tmp_path, islands, sizes):
    """On the default (4, 4) of host devices, and on one island of one device: the islands a
    machine with one GPU gives (``islands=None``: the accelerators grouped by host), which
    ``pw.Controller()``'s default (4, 4) would refuse there."""
    out = tmp_path / "checks.json"
    env = {k: v for k, v in os.environ.items() if k != "PWKERNEL_ISLANDS"}
    if islands is not None:
        env["PWKERNEL_ISLANDS"] = islands
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["machine"]["platform"] == "cpu"
    assert report["machine"]["islands"] == sizes
    assert set(report["checks"]) == NAMES
    assert all(c["ok"] for c in report["checks"].values()), report["checks"]
    losses = report["checks"]["spmd_training_matches_plain_jax"]
    assert losses["devices"] == sizes[0]
    assert len(losses["losses"]) == 5 and losses["losses"][-1] < losses["losses"][0]
    assert report["checks"]["memory_given_back"]["arrays_left"] == []
    assert "cpu: 6 of 6 checks passed" in done.stdout


def test_a_failing_check_is_reported_and_fails_the_run(tmp_path):
    out = tmp_path / "checks.json"
    code = (f"import runpy, sys; m = runpy.run_path({str(SCRIPT)!r}, run_name='checks')\n"
            "def off_by_a_percent(ctl):\n"
            "    m['close']([1.01], [1.0], 1e-3)\n"
            "kept = []\n"
            "def keeps_a_result(ctl):\n"
            "    vs, x, w = m['inputs'](ctl, m['np'].float32)\n"
            "    kept.append(m['pw'].function(m['step'], slice=vs)(x, w).result())\n"
            "    return {}\n"
            "m['CHECKS'][:] = [m['function_matches_jit'], off_by_a_percent, keeps_a_result]\n"
            f"sys.exit(m['run']({str(out)!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    checks = json.loads(out.read_text())["checks"]
    assert checks["function_matches_jit"]["ok"]
    assert not checks["off_by_a_percent"]["ok"]
    assert "largest relative difference 0.01 > 0.001" in checks["off_by_a_percent"]["error"]
    # (an array still alive after ctl.close(): the memory is not given back, on CPU too)
    assert checks["keeps_a_result"]["ok"] and not checks["memory_given_back"]["ok"]
    assert checks["memory_given_back"]["arrays_left"] == ["float32[512, 256]"]
    assert "failed: off_by_a_percent, memory_given_back" in done.stdout


def test_a_difference_near_zero_is_measured_against_the_largest_value():
    """Two GPU compilations of a matmul may differ in their last bits: an element near zero
    must not make that a large relative difference (bfloat16 would fail 1e-2 at random)."""
    import runpy

    m = runpy.run_path(str(SCRIPT), run_name="checks")
    assert m["close"]([1.0, 1e-4 + 1e-5], [1.0, 1e-4], 1e-3) == pytest.approx(1e-5)


def test_the_host_leaves_script_runs_both_ways():
    """``bench/host_leaves.py`` (docs/benchmarks.md): a call of 3 host leaves both ways."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "host_leaves.py"), "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("leaves     3  pw.function"), done.stdout


def test_gpu_sh_dry_run_of_one_gpu_writes_its_files(tmp_path):
    """``BENCH_PLAN_GPUS=1``: what ``bench/gpu.sh`` runs on one GPU, on one host CPU device:
    the checks on one island of one device, dispatch and multitenancy with ``--islands 1``,
    then ``bench/packed_state.py``; every file in the output folder (a lent machine gives back
    8 at most), none of them empty, and a JSON each that says what ran."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PWKERNEL_ISLANDS", "OUT")}
    env.update(BENCH_MODE="tiny", BENCH_PLAN_GPUS="1", BENCH_PYTHON=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == {"machine.txt", "run.log", "checks.json", "results.json",
                          "dispatch.png", "packed_state.json"}, sorted(files)
    assert all(p.stat().st_size for p in files.values())
    log = files["run.log"].read_text()
    assert "dry run (BENCH_PLAN_GPUS=1)" in log and "cpu: 6 of 6 checks passed" in log
    assert "stopped" not in log and "exited with status" not in log, log[-3000:]
    assert json.loads(files["checks.json"].read_text())["machine"]["islands"] == [1]
    results = json.loads(files["results.json"].read_text())
    assert set(results["benchmarks"]) == {"dispatch", "multitenancy"}
    assert not results.get("failed")
    assert json.loads(files["packed_state.json"].read_text())["config"]["devices"] == [0]


@pytest.mark.parametrize("variable, value, says", [
    ("BENCH_BUDGET", "10", "BENCH_BUDGET must be a whole number of seconds, at least 60"),
    ("BENCH_PLAN_GPUS", "two", "BENCH_PLAN_GPUS must be a GPU count from 1 to 8")])
def test_gpu_sh_refuses_bad_settings_before_running(tmp_path, variable, value, says):
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(tmp_path / "out")],
                          env={**os.environ, variable: value}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()

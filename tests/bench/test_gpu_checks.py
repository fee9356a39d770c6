"""``bench/gpu_checks.py``: the correctness checks ``bench/gpu.sh`` runs on a real accelerator
before its benchmarks, run here on the host CPU (where they also pass), and a failing check
reported as failed; and ``bench/host_leaves.py`` runs."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_checks.py"
NAMES = {"function_matches_jit", "chained_program_matches_jit", "donation_only_when_asked",
         "a_failure_stays_in_its_future", "spmd_training_matches_plain_jax"}


def test_every_check_passes_on_the_host_cpu(tmp_path):
    out = tmp_path / "checks.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["machine"]["platform"] == "cpu"
    assert set(report["checks"]) == NAMES
    assert all(c["ok"] for c in report["checks"].values()), report["checks"]
    losses = report["checks"]["spmd_training_matches_plain_jax"]
    assert len(losses["losses"]) == 5 and losses["losses"][-1] < losses["losses"][0]
    assert "cpu: 5 of 5 checks passed" in done.stdout


def test_a_failing_check_is_reported_and_fails_the_run(tmp_path):
    out = tmp_path / "checks.json"
    code = (f"import runpy, sys; m = runpy.run_path({str(SCRIPT)!r}, run_name='checks')\n"
            "def off_by_a_percent(ctl):\n"
            "    m['close']([1.01], [1.0], 1e-3)\n"
            "m['CHECKS'][:] = [m['function_matches_jit'], off_by_a_percent]\n"
            f"sys.exit(m['run']({str(out)!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    checks = json.loads(out.read_text())["checks"]
    assert checks["function_matches_jit"]["ok"]
    assert not checks["off_by_a_percent"]["ok"]
    assert "largest relative difference 0.00999 > 0.001" in checks["off_by_a_percent"]["error"]
    assert "failed: off_by_a_percent" in done.stdout


def test_the_host_leaves_script_runs_both_ways():
    """``bench/host_leaves.py`` (docs/benchmarks.md): a call of 3 host leaves both ways."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "host_leaves.py"), "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("leaves     3  pw.function"), done.stdout

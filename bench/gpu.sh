#!/usr/bin/env bash
# Run the pwkernel benchmarks a machine's NVIDIA GPUs can show; keep the results in one folder.
#
#   bash bench/gpu.sh [OUT_DIR]        # default OUT_DIR: $OUT, else bench-results/<date>
#   BENCH_MODE=tiny bash bench/gpu.sh  # seconds instead of minutes (checks the script itself)
#   BENCH_BUDGET=300 bash bench/gpu.sh # seconds for the whole run (default 570): a lent GPU
#                                      # whose time is short (the full sweep fills what is left)
#   BENCH_MODE=tiny BENCH_PLAN_GPUS=1 bash bench/gpu.sh   # no GPU here: what one GPU would
#                                      # run, on one virtual CPU device (a dry run)
#   BENCH_PYTHON=path/to/python        # this Python, not .venv's / python3
#
# What runs depends on the GPUs JAX sees (every benchmark is pwkernel beside bare JAX on the
# same devices):
#   8 or more GPUs: every benchmark on islands (4, 4) of GPUs (`all`).
#   1 to 7 GPUs:    what an island of ONE GPU can show: the dispatch sweep (OpByOp, Chained,
#                   Fused against JAX on that GPU, host and device running in parallel) and
#                   multi-tenancy (clients time-sharing that GPU, proportional share).
#                   The others need more devices and are skipped, each with its reason:
#                   parallel-dispatch and dcn need two islands, pipeline an island of 4, tracing
#                   a 2-device slice.
#   no GPU:         every benchmark on the host CPU (virtual devices), said so in run.log.
#
# Python: the project's .venv if its JAX sees a GPU; else, when nvidia-smi lists GPUs,
# bench/.venv-gpu with jax[cuda12] and this project; else the project's .venv on the CPU.
# Budget: BENCH_BUDGET seconds, under 10 minutes by default (the --quick runs, then the full
# dispatch sweep if time is left).
# Writes checks.json, results.json, dispatch.png, run.log, machine.txt, and with time left
# packed_state.json, dispatch-full.json, dispatch-full.png: 8 files at most.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$ROOT/bench-results/$(date +%Y%m%d-%H%M%S)}}"
MODE="${BENCH_MODE:-quick}"
[[ "$MODE" == quick || "$MODE" == tiny ]] || {
  echo "BENCH_MODE must be quick (the default) or tiny, got '$MODE'" >&2; exit 2; }
BUDGET="${BENCH_BUDGET:-570}"   # (570: 30 s of the 10 minutes left for set-up slack)
[[ "$BUDGET" =~ ^[0-9]+$ ]] && (( BUDGET >= 60 )) || {
  echo "BENCH_BUDGET must be a whole number of seconds, at least 60, got '$BUDGET'" >&2; exit 2; }
PLAN="${BENCH_PLAN_GPUS:-}"
[[ -z "$PLAN" || "$PLAN" =~ ^[1-8]$ ]] || {
  echo "BENCH_PLAN_GPUS must be a GPU count from 1 to 8 (a dry run on CPU), got '$PLAN'" >&2; exit 2; }
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
DEADLINE=$((SECONDS + BUDGET))
CHECKS_S=$(( BUDGET / 3 < 180 ? BUDGET / 3 : 180 ))

say() { echo "$*" | tee -a "$LOG"; }
has_gpu() { "$1" -c 'import jax, sys; sys.exit(0 if any(d.platform == "gpu" for d in jax.devices()) else 1)' >/dev/null 2>&1; }
nvidia_gpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; }

PY="${BENCH_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"
if ! has_gpu "$PY"; then
  if (( $(nvidia_gpus) > 0 )); then
    VENV="$ROOT/bench/.venv-gpu"
    if [[ ! -x "$VENV/bin/python" ]]; then
      say "creating $VENV with jax[cuda12]"
      if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --upgrade pip &&
             "$VENV/bin/pip" install -q "jax[cuda12]" pillow &&
             "$VENV/bin/pip" install -q -e "$ROOT"; }; then
        rm -rf "$VENV"   # (half made: the next run tries again)
        say "could not make $VENV (no package index here?): give a Python whose JAX sees the GPUs as BENCH_PYTHON"
        exit 1
      fi
    fi
    PY="$VENV/bin/python"
    has_gpu "$PY" || { say "nvidia-smi lists GPUs but JAX sees none even with jax[cuda12]: check the driver"; exit 1; }
  else
    export JAX_PLATFORMS=cpu   # no GPU here: the CPU fallback
  fi
fi

{
  echo "date: $(date -Is)"; echo "python: $PY"; echo "mode: $MODE"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  "$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
} > "$OUT_DIR/machine.txt" 2>&1
tee -a "$LOG" < "$OUT_DIR/machine.txt"

cd "$ROOT"
# (bench/*.py scripts import pwkernel from this checkout, also with a Python that has no
# pwkernel installed: an accelerator machine's own, whose JAX already sees its GPUs)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
NGPU=$("$PY" -c 'import jax; print(sum(d.platform == "gpu" for d in jax.devices()))')
if [[ -n "$PLAN" ]] && (( NGPU == 0 )); then
  say "dry run (BENCH_PLAN_GPUS=$PLAN): what $PLAN GPU(s) would run, on host CPU devices"
  NGPU=$PLAN
  export PWKERNEL_ISLANDS=$(( PLAN >= 8 ? 8 : PLAN ))   # (the checks: one island, as one host)
fi
say "correctness on these devices first (bench/gpu_checks.py: pwkernel against jax.jit)"
timeout "$CHECKS_S" "$PY" bench/gpu_checks.py --json "$OUT_DIR/checks.json" 2>&1 | tee -a "$LOG" \
  || say "a check failed or stopped (see checks.json); the benchmarks run anyway"
ARGS=(--"$MODE" --json "$OUT_DIR/results.json" --plot "$OUT_DIR/dispatch.png")
if (( NGPU >= 8 )); then
  say "$NGPU GPUs: every benchmark on islands (4, 4) of GPUs"
  BENCH=(all)
elif (( NGPU >= 1 )); then
  say "$NGPU GPU(s): an island of one GPU: dispatch and multitenancy, beside bare JAX on it"
  say "skipped (need more devices): parallel-dispatch and dcn (two islands), pipeline (an island of 4), tracing (a 2-device slice)"
  BENCH=(dispatch multitenancy)
  ARGS+=(--islands 1)
else
  say "no GPU: every benchmark on the host CPU (virtual devices), not on a GPU"
  BENCH=(all)
fi
# (a benchmark that fails, or the deadline, ends this run but not the script: results.json
# then holds what finished, with `failed` or `interrupted`; the steps below still run)
timeout $((DEADLINE - SECONDS)) "$PY" -m pwkernel.bench "${BENCH[@]}" "${ARGS[@]}" 2>&1 \
  | tee -a "$LOG" || say "the benchmarks exited with status $? (see run.log and results.json)"

LEFT=$((DEADLINE - SECONDS))
if (( NGPU >= 1 && LEFT > 120 )); then   # (at most half of what is left)
  say "a packed training state against a future per leaf and bare JAX (bench/packed_state.py)"
  SIZE=(--batch 32 --rounds 9)
  [[ "$MODE" == tiny ]] && SIZE=(--batch 4 --rounds 1 --steps 2)
  PWKERNEL_BENCH_ISLANDS=$(( NGPU >= 8 ? 4 : 1 )) timeout $(( LEFT / 2 < 180 ? LEFT / 2 : 180 )) \
    "$PY" bench/packed_state.py --devices $(( NGPU >= 8 ? 4 : 1 )) "${SIZE[@]}" \
    > "$OUT_DIR/packed_state.json" 2>>"$LOG" || say "packed_state stopped (see run.log)"
fi

LEFT=$((DEADLINE - SECONDS))
if [[ "$MODE" == quick ]] && (( LEFT > 240 )); then
  say "full dispatch sweep with ${LEFT}s left"
  FULL=(--json "$OUT_DIR/dispatch-full.json" --plot "$OUT_DIR/dispatch-full.png")
  (( NGPU >= 1 && NGPU < 8 )) && FULL+=(--islands 1)
  timeout "$LEFT" "$PY" -m pwkernel.bench dispatch "${FULL[@]}" 2>&1 | tee -a "$LOG" \
    || say "full sweep stopped at the deadline"
fi
say "results in $OUT_DIR"

#!/usr/bin/env bash
# Run every pwkernel benchmark on a machine with NVIDIA GPUs and keep the results in one folder.
#
#   bash bench/gpu.sh [OUT_DIR]        # default OUT_DIR: $OUT, else bench-results/<date>
#
# Uses the project's .venv if its JAX already sees a GPU; otherwise creates bench/.venv-gpu with
# jax[cuda12] and this project installed. Budget: under 10 minutes (the --quick sweep, then the
# full dispatch sweep if time is left). Writes results.json, dispatch.png, run.log, machine.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$ROOT/bench-results/$(date +%Y%m%d-%H%M%S)}}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
DEADLINE=$((SECONDS + 570))   # leave 30 s of the 10 minutes for set-up slack

has_gpu() { "$1" -c 'import jax, sys; sys.exit(0 if any(d.platform == "gpu" for d in jax.devices()) else 1)' >/dev/null 2>&1; }

PY="$ROOT/.venv/bin/python"
if [[ ! -x "$PY" ]] || ! has_gpu "$PY"; then
  VENV="$ROOT/bench/.venv-gpu"
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with jax[cuda12]" | tee -a "$LOG"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "jax[cuda12]" pillow
    "$VENV/bin/pip" install -q -e "$ROOT"
  fi
  PY="$VENV/bin/python"
  has_gpu "$PY" || { echo "JAX sees no GPU even with jax[cuda12]: check nvidia-smi and the driver" | tee -a "$LOG"; exit 1; }
fi

{
  echo "date: $(date -Is)"; echo "python: $PY"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  "$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
} > "$OUT_DIR/machine.txt" 2>&1
cat "$OUT_DIR/machine.txt" | tee -a "$LOG"

cd "$ROOT"
# Every benchmark builds pw.Controller(islands=(4, 4)): 8 devices. The local backend takes
# accelerators when there are any and cannot split one GPU into virtual devices, so with fewer
# than 8 GPUs the run falls back to the host CPU and says so in machine.txt and run.log.
NGPU=$("$PY" -c 'import jax; print(sum(d.platform == "gpu" for d in jax.devices()))')
if (( NGPU < 8 )); then
  echo "only $NGPU GPU(s): islands=(4, 4) needs 8; running on the host CPU instead" \
    | tee -a "$LOG" "$OUT_DIR/machine.txt"
  export JAX_PLATFORMS=cpu
fi
timeout $((DEADLINE - SECONDS)) "$PY" -m pwkernel.bench all --quick \
  --json "$OUT_DIR/results.json" --plot "$OUT_DIR/dispatch.png" 2>&1 | tee -a "$LOG"

LEFT=$((DEADLINE - SECONDS))
if (( LEFT > 240 )); then
  echo "full dispatch sweep with ${LEFT}s left" | tee -a "$LOG"
  timeout "$LEFT" "$PY" -m pwkernel.bench dispatch --json "$OUT_DIR/dispatch-full.json" \
    --plot "$OUT_DIR/dispatch-full.png" 2>&1 | tee -a "$LOG" || echo "full sweep stopped at the deadline" | tee -a "$LOG"
fi
echo "results in $OUT_DIR" | tee -a "$LOG"

#!/usr/bin/env bash
# Evaluation-step measurements (tests/data/eval_step.jsonl): after two training steps, one
# validation forward + loss in model.eval(), under torch.no_grad() ("eval") or without it
# ("eval-grad"). From the repo root:   OUT=/some/dir bash tools/run_eval_on_device.sh
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
timeout -k 5 "${LIMIT:-300}" "$PY" crates/device/runners/torch_runner.py measure "${CONFIGS:-tools/eval_configs.jsonl}" > "$OUT/eval_step.jsonl" 2> "$OUT/eval_step.log"
echo "eval rc=$? lines=$(wc -l < "$OUT/eval_step.jsonl")"

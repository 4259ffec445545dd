#!/usr/bin/env bash
# QLoRA / bitsandbytes-optimizer measurements (tests/data/qlora.jsonl): bnb 4-bit / LLM.int8
# base layers under peft 0.21, bnb AdamW8bit / PagedAdamW8bit / PagedAdamW32bit. From the repo
# root:   OUT=/some/dir bash tools/run_qlora_on_device.sh
# RUNNER=path/to/torch_runner.py overrides the runner (a copy carried to the device, with
# torch_qlora.py beside it); bitsandbytes must be importable (the carried 0.50.2 wheel).
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
RUNNER="${RUNNER:-crates/device/runners/torch_runner.py}"
CONFIGS="${CONFIGS:-tools/qlora_configs.jsonl}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import sys; sys.path.insert(0, '$(dirname "$RUNNER")'); import torch_qlora; print(torch_qlora.sources())" > "$OUT/bnb_sources.txt" 2>&1
timeout -k 5 "${LIMIT:-400}" "$PY" "$RUNNER" measure "$CONFIGS" > "$OUT/qlora.jsonl" 2> "$OUT/qlora.log"
echo "qlora rc=$? lines=$(wc -l < "$OUT/qlora.jsonl")"

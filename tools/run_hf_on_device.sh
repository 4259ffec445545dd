#!/usr/bin/env bash
# Measurements of the Hugging Face config.json import (tests/data/hf_import*.jsonl) and the
# trainer-loop set of presets (tests/data/loop_presets.jsonl). From the repo root:
#     OUT=/some/dir bash tools/run_hf_on_device.sh
# About 4 minutes on an H200 (PyTorch 2.11, transformers 5.17).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
S=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" crates/device/runners/torch_runner.py --env > "$OUT/env.json" 2>/dev/null
for part in hf_import:tools/hf_import_configs.jsonl:420 hf_import_neox:tools/hf_import_neox_configs.jsonl:120 \
            loop_presets:tools/loop_presets_configs.jsonl:90; do
    IFS=: read -r name file limit <<< "$part"
    timeout -k 5 "$limit" "$PY" crates/device/runners/torch_runner.py measure "$file" > "$OUT/$name.jsonl" 2> "$OUT/$name.log"
    echo "$name rc=$? lines=$(wc -l < "$OUT/$name.jsonl") at $(( $(date +%s) - S ))s"
done

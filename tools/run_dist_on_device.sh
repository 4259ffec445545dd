#!/usr/bin/env bash
# Distributed measurements (tests/data/distributed.jsonl) on one GPU: FSDP2 as rank 0 of a
# world of N under the fake process group, DDP at world size 1 with NCCL.
# From the repo root:   OUT=/some/dir bash tools/run_dist_on_device.sh
set -u -o pipefail
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
timeout -k 5 "${LIMIT_FSDP:-300}" "$PY" tools/dist_runner.py fsdp "${FSDP_CONFIGS:-tools/dist_fsdp_configs.jsonl}" > "$OUT/fsdp.jsonl" 2> "$OUT/fsdp.log"
echo "fsdp rc=$? lines=$(wc -l < "$OUT/fsdp.jsonl")"
timeout -k 5 "${LIMIT_DDP:-120}" "$PY" tools/dist_runner.py ddp "${DDP_CONFIGS:-tools/dist_ddp_configs.jsonl}" > "$OUT/ddp.jsonl" 2> "$OUT/ddp.log"
echo "ddp rc=$? lines=$(wc -l < "$OUT/ddp.jsonl")"

#!/usr/bin/env bash
# Distributed measurements (tests/data/distributed.jsonl) on one GPU: FSDP2 as rank 0 of a
# world of N under the fake process group, DDP at world size 1 with NCCL.
# PyTorch's ZeRO-1 (DDP + ZeroRedundancyOptimizer, tools/dist_zero_configs.jsonl) as rank 0 of
# a world of N under the fake process group, one process per config: ZERO1_ONLY=1 runs only it.
# From the repo root:   OUT=/some/dir bash tools/run_dist_on_device.sh
# tests/data/distributed.jsonl = run 1 (tools/dist_fsdp_configs.jsonl; rows that asked for a
# MixedPrecisionPolicy / no reshard ran defaults, see "relabelled") + run 2
# (FSDP_CONFIGS=tools/dist_fsdp_configs2.jsonl, and the DDP configs, one process each).
set -u -o pipefail
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
run_each() {  # MODE CONFIGS OUTNAME: one process per config (a DDP reducer outlives its model)
  : > "$OUT/$3.jsonl"; : > "$OUT/$3.log"
  local i=0
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    printf '%s\n' "$line" > "$OUT/one.jsonl"
    timeout -k 5 "${LIMIT_DDP_ONE:-60}" "$PY" crates/device/runners/dist_runner.py "$1" "$OUT/one.jsonl" \
        < /dev/null 2>> "$OUT/$3.log" \
      | sed "s/^{\"index\": 0,/{\"index\": $i,/" >> "$OUT/$3.jsonl"
    i=$((i + 1))
  done < "$2"
  rm -f "$OUT/one.jsonl"
  echo "$3 lines=$(wc -l < "$OUT/$3.jsonl")"
}
if [ -n "${ZERO1_ONLY:-}" ]; then
  run_each zero1 "${ZERO1_CONFIGS:-tools/dist_zero_configs.jsonl}" zero1
  exit 0
fi
timeout -k 5 "${LIMIT_FSDP:-300}" "$PY" crates/device/runners/dist_runner.py fsdp "${FSDP_CONFIGS:-tools/dist_fsdp_configs.jsonl}" > "$OUT/fsdp.jsonl" 2> "$OUT/fsdp.log"
echo "fsdp rc=$? lines=$(wc -l < "$OUT/fsdp.jsonl")"
# DDP: one process per config (a DDP model's reducer outlives it in the process: the next
# row's memory would carry the previous model's buckets).
: > "$OUT/ddp.jsonl"; : > "$OUT/ddp.log"
i=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  printf '%s\n' "$line" > "$OUT/ddp_one.jsonl"
  timeout -k 5 "${LIMIT_DDP_ONE:-60}" "$PY" crates/device/runners/dist_runner.py ddp "$OUT/ddp_one.jsonl" \
      < /dev/null 2>> "$OUT/ddp.log" \
    | sed "s/^{\"index\": 0,/{\"index\": $i,/" >> "$OUT/ddp.jsonl"
  i=$((i + 1))
done < "${DDP_CONFIGS:-tools/dist_ddp_configs.jsonl}"
rm -f "$OUT/ddp_one.jsonl"
echo "ddp lines=$(wc -l < "$OUT/ddp.jsonl")"
run_each zero1 "${ZERO1_CONFIGS:-tools/dist_zero_configs.jsonl}" zero1

#!/usr/bin/env bash
# Session 27's H200 call (on an H100: the allocator histories of c26-06 at b44 and b45 instead, below).
# Phase 1, together: issue 31's Lightning callback run in a process of its own
# (lab/device/python_callbacks_on_device.py --runs lightning) and issue 30's untouched rows
# again on the H200 (`lab/run grid30_h200`, LIMIT G30_LIMIT, default 270 s, PAR 4). Phase 2,
# alone: issue 29's quantized / device_map rows as grid29c_h200 (`lab/run grid29c`, three
# lanes of up to ~30 GB, in the time left: all ends by TOTAL, default 540 s). One archive back,
# $OUT/all.tgz.
#     OUT=dir bash lab/device/session27b.sh      (carry .whl)
set -u
FINAL="$OUT"
W=/tmp/s27b
rm -rf "$W"; mkdir -p "$W/py31" "$W/g30h" "$W/g29h"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$W/nvidia-smi.csv"
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    # Not an H200: issue 26's capped max-batch row c26-06 instead (Llama-2-7b LoRA r8
    # all-linear, checkpointed, bf16, seq 1024, cap 48 GiB: b44 ran, b45 ran out of memory),
    # whose planned max batch passes 44 once the module arguments' references are planned
    # (lab/wip/holds27.patch): the allocator's history of b44 and of b45, one process each.
    C='{"model": "tests/data/grid26/configs/Llama-2-7b-hf.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 8, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "c26-06", "batch": '
    for b in ${C2606_BATCHES:-44 45}; do
        timeout ${SNAP_TIMEOUT:-200} python3 lab/device/snapshot_step.py --config "$C$b}" --cap-gib 48 \
            --out "/tmp/c2606_b$b.pickle" > "$W/c2606_b${b}_measure.jsonl" 2> "$W/c2606_b$b.log"
        gzip -c "/tmp/c2606_b$b.pickle" > "$W/c2606_b$b.pickle.gz"
        tail -n 2 "$W/c2606_b$b.log"
    done
    tar -C "$W" -czf "$FINAL/all.tgz" .
    ls -la "$FINAL"
    exit 0
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
t0=$SECONDS
(PYTHONPATH=/tmp/vsite timeout 240 python3 lab/device/python_callbacks_on_device.py --out "$W/py31" \
    --runs lightning > "$W/py31/log.txt" 2>&1; nvidia-smi >> "$W/py31/log.txt") &
(OUT="$W/g30h" LIMIT=${G30_LIMIT:-270} PAR=4 timeout $(( ${G30_LIMIT:-270} + 40 )) lab/run grid30_h200 \
    > "$W/g30h.log" 2>&1) &
wait
echo "phase 1: $((SECONDS - t0)) s"
LIM=$(( ${TOTAL:-540} - (SECONDS - t0) ))
if [ "$LIM" -gt 60 ]; then
    OUT="$W/g29h" GRID=grid29c_h200 LANES=3 LIMIT=$LIM timeout $((LIM + 30)) lab/run grid29c > "$W/g29h.log" 2>&1
fi
echo "phase 2 ended at $((SECONDS - t0)) s"
tar -C "$W" -czf "$FINAL/all.tgz" .
ls -la "$FINAL"
tail -n 5 "$W"/*.log "$W/py31/log.txt"

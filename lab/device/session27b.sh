#!/usr/bin/env bash
# Session 27's H200 call (on an H100 it stops at once: every part needs an H200).
# Phase 1, together: issue 31's Lightning callback run in a process of its own
# (lab/device/python_callbacks_on_device.py --runs lightning) and issue 30's untouched rows
# again on the H200 (`lab/run grid30_h200`, LIMIT G30_LIMIT, default 270 s, PAR 4). Phase 2,
# alone: issue 29's quantized / device_map rows as grid29c_h200 (`lab/run grid29c`, three
# lanes of up to ~30 GB, in the time left: all ends by 540 s). One archive back, $OUT/all.tgz.
#     OUT=dir bash lab/device/session27b.sh      (carry .whl)
set -u
FINAL="$OUT"
W=/tmp/s27b
rm -rf "$W"; mkdir -p "$W/py31" "$W/g30h" "$W/g29h"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$W/nvidia-smi.csv"
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "not an H200: nothing run"; exit 3
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
t0=$SECONDS
(PYTHONPATH=/tmp/vsite timeout 240 python3 lab/device/python_callbacks_on_device.py --out "$W/py31" \
    --runs lightning > "$W/py31/log.txt" 2>&1; nvidia-smi >> "$W/py31/log.txt") &
(OUT="$W/g30h" LIMIT=${G30_LIMIT:-270} PAR=4 timeout $(( ${G30_LIMIT:-270} + 40 )) lab/run grid30_h200 \
    > "$W/g30h.log" 2>&1) &
wait
echo "phase 1: $((SECONDS - t0)) s"
LIM=$(( 540 - (SECONDS - t0) ))
if [ "$LIM" -gt 60 ]; then
    OUT="$W/g29h" GRID=grid29c_h200 LANES=3 LIMIT=$LIM timeout $((LIM + 30)) lab/run grid29c > "$W/g29h.log" 2>&1
fi
echo "phase 2 ended at $((SECONDS - t0)) s"
tar -C "$W" -czf "$FINAL/all.tgz" .
ls -la "$FINAL"
tail -n 5 "$W"/*.log "$W/py31/log.txt"

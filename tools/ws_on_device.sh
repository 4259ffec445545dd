#!/usr/bin/env bash
# Convolution workspace measurements and a new holdout set on the GPU machine, in parallel:
#   tools/conv_workspace.py over tools/conv_configs.jsonl (every CNN/segmentation config measured)
#   crates/device/runners/torch_runner.py measure over tools/holdout4_configs.jsonl
#   allocator traces of two CNN configs with the largest reserved misses
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 560 python3 tools/conv_workspace.py tools/conv_configs.jsonl > "$OUT/conv_ws.jsonl" 2> "$OUT/conv_ws.log" &
timeout 400 python3 crates/device/runners/torch_runner.py measure tools/holdout4_configs.jsonl > "$OUT/holdout4.jsonl" 2> "$OUT/holdout4.log"
mkdir -p "$OUT/t"
timeout 60 python3 tools/trace.py memory --config '{"model":"resnet18","batch":256,"image":224,"precision":"fp32","optimizer":"adamw"}' > "$OUT/t/mem_resnet18_fp32_b256.json" 2>> "$OUT/t/trace.log"
timeout 60 python3 tools/trace.py memory --config '{"model":"unet","batch":16,"image":256,"precision":"fp32","optimizer":"adamw"}' > "$OUT/t/mem_unet_fp32_b16.json" 2>> "$OUT/t/trace.log"
wait
tar czf "$OUT/traces.tgz" -C "$OUT" t && rm -rf "$OUT/t"
gzip -f "$OUT/conv_ws.jsonl"

#!/usr/bin/env bash
# Calibration diagnostics on the GPU machine: saved tensors and allocator traces.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
: > "$OUT/saved.jsonl"
for c in \
  '{"model":"bert-base-uncased","batch":2,"seq":128,"precision":"amp-bf16"}' \
  '{"model":"vit_b_16","batch":2,"precision":"amp-bf16"}' \
  '{"model":"vit_b_16","batch":2,"precision":"bf16"}' \
  '{"model":"gpt2","batch":2,"seq":128,"precision":"amp-bf16"}' \
  '{"model":"TinyLlama-1.1B","batch":1,"seq":256,"precision":"fp32"}' \
  '{"model":"TinyLlama-1.1B","batch":1,"seq":256,"precision":"bf16","attention":"eager"}' \
  '{"model":"resnet18","batch":4,"image":64,"precision":"fp32"}' \
  '{"model":"convnext_tiny","batch":2,"precision":"amp-bf16"}' \
  '{"model":"gpt2","batch":2,"seq":128,"precision":"fp32"}' \
  '{"model":"TinyLlama-1.1B","batch":1,"seq":256,"precision":"amp-bf16"}' ; do
  timeout 60 python3 tools/trace.py saved --config "$c" >> "$OUT/saved.jsonl" 2>> "$OUT/trace.log" || echo "failed $c" >> "$OUT/trace.log"
done
timeout 90 python3 tools/trace.py memory --config '{"model":"resnet18","batch":128,"precision":"fp32","optimizer":"adamw"}' > "$OUT/mem_resnet18.json" 2>> "$OUT/trace.log"
timeout 90 python3 tools/trace.py memory --config '{"model":"unet","batch":16,"precision":"fp32","optimizer":"adamw"}' > "$OUT/mem_unet.json" 2>> "$OUT/trace.log"
timeout 90 python3 tools/trace.py memory --config '{"model":"bert-base-uncased","batch":8,"seq":512,"precision":"amp-bf16","optimizer":"adamw"}' > "$OUT/mem_bert.json" 2>> "$OUT/trace.log"
timeout 150 python3 crates/device/runners/torch_runner.py measure tools/holdout2_configs.jsonl > "$OUT/holdout2.jsonl" 2>> "$OUT/trace.log"
ls -la "$OUT"; tail -5 "$OUT/trace.log"

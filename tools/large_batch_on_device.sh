#!/usr/bin/env bash
# Large-batch diagnostics on the GPU machine: allocator traces (tools/trace.py memory) of
# configurations where the planner missed at large batch, and phase readings
# (crates/device/runners/torch_runner.py measure) over batch sizes. Results under $OUT/t, tarred.
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT/t"
export PYTHONUNBUFFERED=1
trace() { timeout 150 python3 tools/trace.py memory --config "$2" > "$OUT/t/mem_$1.json" 2>> "$OUT/t/trace.log" || echo "failed $1" >> "$OUT/t/trace.log"; }
trace gpt2_b76 '{"model":"gpt2","batch":76,"seq":1024,"precision":"amp-bf16","optimizer":"adamw"}'
trace gpt2_b16 '{"model":"gpt2","batch":16,"seq":1024,"precision":"amp-bf16","optimizer":"adamw"}'
trace resnet50_fp32_b128 '{"model":"resnet50","batch":128,"precision":"fp32","optimizer":"adamw"}'
trace resnet50_bf16_b128 '{"model":"resnet50","batch":128,"precision":"amp-bf16","optimizer":"adamw"}'
trace deeplab_bf16_b16 '{"model":"deeplabv3_resnet50","batch":16,"precision":"amp-bf16","optimizer":"adamw"}'
trace unet_fp32_b16 '{"model":"unet","batch":16,"precision":"fp32","optimizer":"adamw"}'
trace fcn_fp32_b8 '{"model":"fcn_resnet50","batch":8,"precision":"fp32","optimizer":"adamw"}'
: > "$OUT/t/configs.jsonl"
for b in 64 256 1024 2006; do echo "{\"model\":\"vit_b_16\",\"batch\":$b,\"precision\":\"amp-bf16\",\"optimizer\":\"adamw\"}" >> "$OUT/t/configs.jsonl"; done
for b in 8 32 64 76; do echo "{\"model\":\"gpt2\",\"batch\":$b,\"seq\":1024,\"precision\":\"amp-bf16\",\"optimizer\":\"adamw\"}" >> "$OUT/t/configs.jsonl"; done
timeout 200 python3 crates/device/runners/torch_runner.py measure "$OUT/t/configs.jsonl" > "$OUT/t/large_batch.jsonl" 2>> "$OUT/t/trace.log"
tar czf "$OUT/traces.tgz" -C "$OUT" t && rm -rf "$OUT/t"

#!/usr/bin/env bash
# Runs vramlab's GPU work on a CUDA machine: device profile, native and PyTorch sweeps
# for a CNN, a ViT and an LM, and the GPU tests. Binaries are built elsewhere and
# carried in .device/ (vramlab, gpu-tests). Results go to $OUT (default ./bench-out).
set -u
OUT=${OUT:-./bench-out}
B=.device/vramlab
mkdir -p "$OUT/runs"
chmod +x .device/* 2>/dev/null
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
  $B gpus
} > "$OUT/runs/env.txt" 2>&1
PART=${PART:-all}
[ "$PART" != torch ] && $B profile --json > "$OUT/runs/profile.json" 2> "$OUT/runs/profile.err"
run() { # name engine args...
  local name=$1 engine=$2; shift 2
  local t0=$(date +%s)
  timeout "${TRIAL_TIMEOUT:-150}" $B bench --engine "$engine" "$@" --steps 3 --out "$OUT/runs/$name-$engine.json" \
    > "$OUT/runs/$name-$engine.txt" 2> "$OUT/runs/$name-$engine.err"
  echo "$name $engine rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/runs/summary.txt"
}
sweeps() {
  run resnet50 "$1" --model resnet50 --precision amp-bf16 --optimizer adamw --sweep
  run vit_b_16 "$1" --model vit_b_16 --precision amp-bf16 --optimizer adamw --sweep
  run gpt2 "$1" --model gpt2 --seq 1024 --precision amp-bf16 --optimizer adamw --sweep
}
# GEMM-heavy steps at fixed batches: native TFLOP/s vs the cuBLAS peak, native vs PyTorch time.
lists() {
  run llama7b "$1" --model Llama-2-7b-hf --precision bf16 --seq 2048 --batch 1,2,4
  run gpt2xl "$1" --model gpt2-xl --seq 1024 --precision amp-bf16 --batch 4,8
}
[ "$PART" != torch ] && { sweeps native; lists native; }
if [ "$PART" != torch ] && [ -x .device/gpu-tests ]; then
  timeout 200 .device/gpu-tests --ignored --nocapture --test-threads=1 > "$OUT/runs/gpu-tests.txt" 2>&1
  echo "gpu-tests rc=$?" >> "$OUT/runs/summary.txt"
fi
[ "$PART" != native ] && { lists torch; sweeps torch; }
tar czf "$OUT/runs-$PART.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"

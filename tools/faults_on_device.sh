#!/usr/bin/env bash
# GPU fault checks on the device: the GPU tests (OOM storm, cancel, PyTorch runner crash
# and kill) and the CLI with the GPU hidden or Python missing. Output: $OUT/faults.txt
set -u
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
chmod +x .device/* 2>/dev/null
B=.device/vramlab
{
  echo "== GPU tests"; timeout 400 .device/gpu-tests --ignored --nocapture --test-threads=1 2>&1; echo "rc=$?"
  echo "== GPU hidden (CUDA_VISIBLE_DEVICES=''), native"; CUDA_VISIBLE_DEVICES= $B bench --engine native --model gpt2 --batch 1 2>&1; echo "rc=$?"
  echo "== GPU hidden, torch"; CUDA_VISIBLE_DEVICES= $B bench --engine torch --model gpt2 --batch 1 2>&1; echo "rc=$?"
  echo "== Python missing"; $B bench --engine torch --python /nonexistent/python3 --model gpt2 --batch 1 2>&1; echo "rc=$?"
  echo "== profile with the GPU hidden"; CUDA_VISIBLE_DEVICES= $B profile 2>&1; echo "rc=$?"
} > "$OUT/faults.txt"

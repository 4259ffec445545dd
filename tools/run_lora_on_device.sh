#!/usr/bin/env bash
# LoRA measurements (tests/data/lora.jsonl): peft 0.21 adapters on GPT-2 and a Llama-style
# config. From the repo root:   OUT=/some/dir bash tools/run_lora_on_device.sh
# RUNNER=path/to/torch_runner.py overrides the runner (a copy carried to the device).
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
RUNNER="${RUNNER:-crates/device/runners/torch_runner.py}"
CONFIGS="${CONFIGS:-tools/lora_configs.jsonl}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -c 'import inspect, peft; from peft.tuners.lora import layer; print(peft.__version__); print(inspect.getsource(layer.Linear.forward)); print(inspect.getsource(layer.LoraLayer._cast_input_dtype))' > "$OUT/peft_forward.txt" 2>&1
timeout -k 5 "${LIMIT:-420}" "$PY" "$RUNNER" measure "$CONFIGS" > "$OUT/lora.jsonl" 2> "$OUT/lora.log"
echo "lora rc=$? lines=$(wc -l < "$OUT/lora.jsonl")"

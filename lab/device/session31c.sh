#!/usr/bin/env bash
# Session 31's third call: `vramlab export --format transformers` of `--quant int8
# --device-map auto --fp32-cpu-offload` pasted and run as a user runs it (session 30 left it
# unchecked). A random Llama-3.2-1B cut to 4 layers (lab/device/s31_export/model/config.json,
# tests/data/hf_configs_device/Llama-3.2-1B-L4.json) is saved with `save_pretrained` in bf16,
# then each exported script runs with `python3` in a fresh process:
#   run_700MiB.py: max_memory {0: 700MiB}, planned 1 of 4 layers on GPU 0 (3 and the norm on cpu)
#   run_820MiB.py: max_memory {0: 820MiB}, planned all on GPU 0
# The scripts were written here by
#   vramlab export --format transformers --model lab/device/s31_export/model --gpu h100 --step generate \
#     --seq 256 --new-tokens 16 --batch 2 --quant int8 --device-map auto --max-gpu-memory M --fp32-cpu-offload
#     OUT=dir bash lab/device/session31c.sh      (carry .whl)
# Session 32 wrote the scripts again with the fixed export (`"cpu"` in `max_memory`) into
# lab/device/s32_export (same model, same commands); run those with
#     OUT=dir bash lab/device/session31c.sh lab/device/s32_export
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
D=${1:-lab/device/s31_export}
D="$D" python3 - <<'PY' > "$OUT/save.log" 2>&1
import os, torch, transformers
d = os.environ["D"] + "/model"
c = transformers.AutoConfig.from_pretrained(d)
torch.manual_seed(0)
m = transformers.AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16)
m.save_pretrained(d)
print("saved", sum(p.numel() for p in m.parameters()), "parameters")
PY
tail -n 2 "$OUT/save.log"
for m in 700MiB 820MiB; do
    echo "== run_$m.py"
    timeout 200 python3 "$D/run_$m.py" > "$OUT/run_$m.out" 2>&1; echo "rc=$?"
    grep -v "^\[transformers\]" "$OUT/run_$m.out" | tail -n 6
    python3 -c "
import torch, transformers
print(transformers.__version__, torch.__version__, torch.cuda.get_device_name(0))" >> "$OUT/run_$m.out" 2>&1
done
python3 -c "import accelerate, bitsandbytes; print('accelerate', accelerate.__version__, 'bitsandbytes', bitsandbytes.__version__)" > "$OUT/versions.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/versions.txt"
cat "$OUT/versions.txt"

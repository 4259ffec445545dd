#!/usr/bin/env bash
# Session 30b: bitsandbytes-quantized weights under device_map="auto" (issue 29's last open
# item), measured as lab/run grid29c measures (one process per row, 3 lanes, the random-weight
# checkpoint saved by a process of its own):
#   1. quant_device_maps.jsonl: transformers 5.17's own maps of quantized meta-device models
#      (lab/device/quant_device_maps.py: _get_device_map with the quantizer, with and without
#      llm_int8_enable_fp32_cpu_offload; seconds, no GPU memory);
#   2. grid30q.jsonl / grid30q_untouched.jsonl: the 6 + 3 pre-registered rows of
#      lab/grids/grid30q_configs.jsonl and grid30q_untouched_configs.jsonl (drawn by
#      lab/grids/make_grid30q.py before anything ran), each with hf_device_map, the offloaded
#      parameters' classes and dtypes, and the peaks;
#   3. refusal.json: one row loaded without llm_int8_enable_fp32_cpu_offload (transformers'
#      ValueError, raised before any weight loads).
# No row starts after DEADLINE_S (200 s); LIMIT per lane run as grid29c_lanes.py reads it.
# Output: one archive, $OUT/all.tgz (rows, logs, nvidia-smi, pip.log).
#     OUT=dir bash lab/device/session30b.sh      (carry .whl: the bitsandbytes 0.50.2 wheel)
set -u
FINAL="$OUT"; W=/tmp/s30b; rm -rf "$W"; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site30b \
    .whl/bitsandbytes-0.50.2-*.whl > "$W/pip.log" 2>&1 \
    && export PYTHONPATH="/tmp/site30b${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/nvidia-smi.csv" 2>&1
T0=$SECONDS

# 1. the reference maps (CPU work beside the CUDA context)
timeout 120 python3 lab/device/quant_device_maps.py --out "$W/quant_device_maps.jsonl" \
    > "$W/quant_device_maps.log" 2>&1
echo "quant_device_maps rc=$? $(wc -l < "$W/quant_device_maps.jsonl" 2>/dev/null) rows ($((SECONDS - T0)) s)" >> "$W/summary.txt"

# 2. the grid: both files, one process per row, 3 lanes
ALL="$W/grid30q_all.jsonl"
CONFIGS="lab/grids/grid30q_configs.jsonl lab/grids/grid30q_untouched_configs.jsonl" \
    LANES=3 LIMIT="${DEADLINE_S:-200}" DEVICE=cuda PY=python3 \
    timeout 420 python3 lab/device/grid29c_lanes.py "$ALL" "$W" >> "$W/summary.txt" 2>&1
cat "$W"/runner_*.log > "$W/runner.log" 2>/dev/null; rm -f "$W"/runner_*.log
python3 - "$ALL" "$W" <<'PY' >> "$W/summary.txt" 2>&1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for split, name in (("fit", "grid30q.jsonl"), ("untouched", "grid30q_untouched.jsonl")):
    with open(f"{sys.argv[2]}/{name}", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["split"] == split)
print(len(rows), "rows measured;", sum(1 for r in rows if "error" in r), "with an error")
for r in rows:
    print(r["id"], r.get("error", "")[:160] or
          f"alloc {r.get('peak_allocated')} reserved {r.get('peak_reserved')} "
          f"map {len(r.get('hf_device_map') or {})} entries {r.get('offloaded_params')}")
PY

# 3. the refusal without llm_int8_enable_fp32_cpu_offload (the quickest fit row's checkpoint)
timeout 120 python3 - "$W/refusal.json" <<'PY' >> "$W/summary.txt" 2>&1
import json, sys
sys.path.insert(0, "lab/device")
import infer_runner as ir
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
rows = [json.loads(l) for l in open("lab/grids/grid30q_configs.jsonl") if l.strip()]
row = min(rows, key=lambda r: r["estimate_s"])  # the quickest checkpoint to save
folder = ir.checkpoint(row, "cuda")
dtype = ir.DTYPES[row["precision"]]
qc = (BitsAndBytesConfig(load_in_8bit=True) if row["quant"] == "int8" else
      BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=row["quant"],
                         bnb_4bit_use_double_quant=bool(row.get("double_quant", True)),
                         bnb_4bit_compute_dtype=dtype))
out = {"id": row["id"], "max_gpu_memory": row["max_gpu_memory"]}
try:
    AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, quantization_config=qc,
        device_map="auto", max_memory={0: row["max_gpu_memory"], "cpu": "200GiB"})
    out["refused"] = None
except Exception as e:
    out["refused"] = f"{type(e).__name__}: {e}"
out["allocated_after"] = torch.cuda.memory_allocated()
json.dump(out, open(sys.argv[1], "w"))
print("refusal:", (out["refused"] or "none")[:200])
PY

echo "done in $((SECONDS - T0)) s" >> "$W/summary.txt"
cat "$W/summary.txt" | cut -c1-240
tar -C "$W" -czf /tmp/all30b.tgz . && mv /tmp/all30b.tgz "$FINAL/all.tgz"

#!/usr/bin/env bash
# Session 25's first device call: issue 31's Lightning callback run (own process), session 24's
# pre-registered Gemma 2 SDPA grid (lab/grids/gemma2_s24_configs.jsonl, one process a row, 3 at
# once), the Gemma 2 SDPA probe, and an allocator trace plus a plain measurement of c26b-04
# (Mistral-7B QLoRA, checkpointed, trainer loop, batch 8) whose reserved is planned 15-20 % high;
# then the pre-registered Gemma 2 inference grid (lab/grids/make_gemma2_infer_s25.py).
#     OUT=dir bash lab/device/session25.sh      (carry .whl)
set -u
mkdir -p "$OUT/gm24" "$OUT/py31" "$OUT/c26b04"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv"
nvidia-smi > "$OUT/nvidia-smi.txt"; cat "$OUT/nvidia-smi.csv"
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
(PYTHONPATH=/tmp/vsite timeout 300 python3 lab/device/python_callbacks_on_device.py --out "$OUT/py31" \
    --runs lightning > "$OUT/py31/log.txt" 2>&1; nvidia-smi > "$OUT/py31/nvidia-smi_after.txt") &
timeout 150 python3 lab/device/probe_gemma2_sdpa.py > "$OUT/probe_gemma2.txt" 2>&1 &
C26='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 16, "lora_targets": "attn", "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "c26b-04", "split": "fit", "batch": 8}'
(PYTHONPATH=/tmp/bnb timeout 200 python3 crates/device/runners/torch_runner.py measure --config "$C26" \
    --out "$OUT/c26b04/measure.jsonl" > "$OUT/c26b04/measure.log" 2>&1
 PYTHONPATH=/tmp/bnb timeout 200 python3 lab/device/trace.py memory --config "$C26" 2> "$OUT/c26b04/trace.log" \
    | gzip > "$OUT/c26b04/trace.json.gz") &
tr '\n' '\0' < lab/grids/gemma2_s24_configs.jsonl | xargs -0 -P3 -I{} sh -c 'id=$(echo "$1" | python3 -c "import json,sys;print(json.load(sys.stdin)[\"grid_id\"])"); PYTHONPATH=/tmp/bnb timeout 240 python3 crates/device/runners/torch_runner.py measure --config "$1" --out "$OUT/gm24/$id.jsonl" > "$OUT/gm24/$id.log" 2>&1' _ {}
wait
# session 25's pre-registered Gemma 2 inference calls (lab/grids/make_gemma2_infer_s25.py)
TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
BUDGET=$(( TOTAL_MIB > 100000 ? 110 : 60 ))
OUT="$OUT/gi25" GRID=gemma2_infer_s25 BUDGET_GB=$BUDGET LIMIT=${GI25_LIMIT:-200} lab/run grid29_lanes \
    > "$OUT/gi25.log" 2>&1
ls -R "$OUT" | head -60
tail -5 "$OUT/py31/log.txt"
for f in "$OUT"/gm24/*.jsonl "$OUT"/c26b04/measure.jsonl; do echo "$f"; tail -c 300 "$f"; echo; done
# the device tool brings back at most 8 files: everything but the trace in one archive
mv "$OUT/c26b04/trace.json.gz" "$OUT/trace_c26b04.json.gz" 2>/dev/null
(cd "$OUT" && tar czf all.tgz gm24 py31 c26b04 gi25 gi25.log probe_gemma2.txt nvidia-smi.txt && rm -rf gm24 py31 c26b04 gi25 gi25.log probe_gemma2.txt)
ls -la "$OUT"

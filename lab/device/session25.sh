#!/usr/bin/env bash
# Session 25's device call, one call for what is left (the device gave few starts):
# - always: issue 31's Lightning callback run in a process of its own; session 24's
#   pre-registered Gemma 2 SDPA training grid (lab/grids/gemma2_s24_configs.jsonl, one process
#   a row, one at a time);
# - on an H200: issue 29's quantized and device_map rows (grid29c, measured before on an H100
#   only) as grid29c_h200, three lanes;
# - on an H100 (grid29c_h200 would repeat session 20): the Gemma 2 probe, an allocator trace
#   and a plain measurement of c26b-04 (Mistral-7B QLoRA, checkpointed, trainer loop, batch 8;
#   its reserved is planned 15-20 % high), and the pre-registered Gemma 2 inference grid.
#     OUT=dir bash lab/device/session25.sh      (carry .whl)
set -u
mkdir -p "$OUT/gm24" "$OUT/py31"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv"
nvidia-smi > "$OUT/nvidia-smi.txt"; cat "$OUT/nvidia-smi.csv"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
(PYTHONPATH=/tmp/vsite timeout 300 python3 lab/device/python_callbacks_on_device.py --out "$OUT/py31" \
    --runs lightning > "$OUT/py31/log.txt" 2>&1; nvidia-smi > "$OUT/py31/nvidia-smi_after.txt") &
(while IFS= read -r c; do
    id=$(echo "$c" | python3 -c "import json,sys;print(json.load(sys.stdin)['grid_id'])")
    PYTHONPATH=/tmp/bnb timeout 120 python3 crates/device/runners/torch_runner.py measure --config "$c" \
        --out "$OUT/gm24/$id.jsonl" > "$OUT/gm24/$id.log" 2>&1
done < lab/grids/gemma2_s24_configs.jsonl) &
PARTS="gm24 py31"
case "$NAME" in
*H200*)
    OUT="$OUT/g29h" GRID=grid29c_h200 LANES=3 LIMIT=${G29_LIMIT:-420} lab/run grid29c > "$OUT/g29h.log" 2>&1
    PARTS="$PARTS g29h g29h.log"
    ;;
*)
    mkdir -p "$OUT/c26b04"
    timeout 150 python3 lab/device/probe_gemma2_sdpa.py > "$OUT/probe_gemma2.txt" 2>&1
    C26='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 16, "lora_targets": "attn", "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "c26b-04", "split": "fit", "batch": 8}'
    PYTHONPATH=/tmp/bnb timeout 200 python3 crates/device/runners/torch_runner.py measure --config "$C26" \
        --out "$OUT/c26b04/measure.jsonl" > "$OUT/c26b04/measure.log" 2>&1
    PYTHONPATH=/tmp/bnb timeout 200 python3 lab/device/trace.py memory --config "$C26" 2> "$OUT/c26b04/trace.log" \
        | gzip > "$OUT/trace_c26b04.json.gz"
    OUT="$OUT/gi25" GRID=gemma2_infer_s25 BUDGET_GB=45 LIMIT=${GI25_LIMIT:-200} lab/run grid29_lanes \
        > "$OUT/gi25.log" 2>&1
    PARTS="$PARTS c26b04 gi25 gi25.log probe_gemma2.txt"
    ;;
esac
wait
tail -5 "$OUT/py31/log.txt"
for f in "$OUT"/gm24/*.jsonl; do echo "$f"; tail -c 300 "$f"; echo; done
# the device tool brings back at most 8 files
# shellcheck disable=SC2086
(cd "$OUT" && tar czf all.tgz $PARTS nvidia-smi.txt && rm -rf $PARTS)
ls -la "$OUT"

#!/usr/bin/env bash
# Session 25's second device call: on any card, the allocator history of c26b-04 (Mistral-7B
# QLoRA, checkpointed, trainer loop, batch 8; reserved planned 12-20 % high) by
# lab/device/snapshot_step.py; on an H200 also issue 31's Lightning callback run in a process of
# its own and issue 29's quantized / device_map rows (grid29c, measured before on an H100 only)
# as grid29c_h200.
#     OUT=dir bash lab/device/session25b.sh              (carry .whl)
#     G29_LIMIT=0 OUT=dir bash lab/device/session25b.sh  (no grid29c: about 90 s on an H200)
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv"
cat "$OUT/nvidia-smi.csv"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
C26='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 16, "lora_targets": "attn", "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "c26b-04", "split": "fit", "batch": 8}'
(PYTHONPATH=/tmp/bnb timeout 240 python3 lab/device/snapshot_step.py --config "$C26" \
    --out /tmp/c26b04.pickle > "$OUT/c26b04_measure.jsonl" 2> "$OUT/c26b04.log"
 gzip -c /tmp/c26b04.pickle > "$OUT/c26b04_snapshot.pickle.gz") &
case "$NAME" in
*H200*)
    mkdir -p "$OUT/py31"
    (PYTHONPATH=/tmp/vsite timeout 240 python3 lab/device/python_callbacks_on_device.py --out "$OUT/py31" \
        --runs lightning > "$OUT/py31/log.txt" 2>&1; nvidia-smi >> "$OUT/py31/log.txt") &
    if [ "${G29_LIMIT:-330}" != 0 ]; then
        OUT="$OUT/g29h" GRID=grid29c_h200 LANES=3 LIMIT=${G29_LIMIT:-330} lab/run grid29c > "$OUT/g29h.log" 2>&1
    fi
    ;;
esac
wait
ls -la "$OUT"
tail -3 "$OUT/c26b04.log"

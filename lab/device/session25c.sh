#!/usr/bin/env bash
# Session 25's last device call (little device time left): on an H200 issue 31's Lightning
# callback run in a process of its own; on any card c26b-04's allocator history
# (lab/device/snapshot_step.py).
#     OUT=dir bash lab/device/session25c.sh      (carry .whl)
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv"
cat "$OUT/nvidia-smi.csv"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
case "$NAME" in
*H200*)
    (PYTHONPATH=/tmp/vsite timeout 170 python3 lab/device/python_callbacks_on_device.py --out "$OUT" \
        --runs lightning > "$OUT/lightning_log.txt" 2>&1; nvidia-smi >> "$OUT/lightning_log.txt") &
    ;;
esac
C26='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 16, "lora_targets": "attn", "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "c26b-04", "split": "fit", "batch": 8}'
PYTHONPATH=/tmp/bnb timeout 170 python3 lab/device/snapshot_step.py --config "$C26" \
    --out /tmp/c26b04.pickle > "$OUT/c26b04_measure.jsonl" 2> "$OUT/c26b04.log"
gzip -c /tmp/c26b04.pickle > "$OUT/c26b04_snapshot.pickle.gz"
wait
ls -la "$OUT"

#!/usr/bin/env bash
# Session 26's device call. On any card: the caching allocator's history of one training step
# (lab/device/snapshot_step.py) of the two checkpointed-LoRA rows whose reserved bytes the
# planner misses most: c26b-04 (Mistral-7B QLoRA, trainer loop, b8: planned 13-20 % high)
# and g26-38 (Qwen2.5-0.5B LoRA all-linear, trainer loop, b1: planned 12.2 % low). On an H200
# also issue 31's Lightning callback run in a process of its own and issue 29's quantized /
# device_map rows (grid29c, measured before on an H100 only) as grid29c_h200 (LIMIT
# G29_LIMIT, default 330 s; 0 = none). Packed so that it all comes back: snapshots in 15 MiB
# parts (snap_ID.part-NN), everything else in all.tgz.
#     OUT=dir bash lab/device/session26.sh      (carry .whl; SNAPS=0: no snapshots; ARCHIVE: the
#     archive's name, all.tgz)
set -u
FINAL="$OUT"
W=/tmp/s26
rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/nvidia-smi.csv"
cat "$W/nvidia-smi.csv"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
C26='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 16, "lora_targets": "attn", "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "c26b-04", "split": "fit", "batch": 8}'
G38='{"model": "tests/data/hf_configs/Qwen2.5-0.5B.json", "batch": 1, "seq": 512, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "lora", "lora_rank": 16, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "g26-38", "split": "untouched"}'
snap() {  # ID CONFIG
    PYTHONPATH=/tmp/bnb timeout 200 python3 lab/device/snapshot_step.py --config "$2" \
        --out "/tmp/$1.pickle" > "$W/$1_measure.jsonl" 2> "$W/$1.log"
    gzip -c "/tmp/$1.pickle" > "/tmp/$1.pickle.gz" && split -b 15M -d "/tmp/$1.pickle.gz" "$FINAL/snap_$1.part-"
}
if [ "${SNAPS:-1}" != 0 ]; then (snap c26b04 "$C26"; snap g2638 "$G38") & fi
case "$NAME" in
*H200*)
    mkdir -p "$W/py31"
    (PYTHONPATH=/tmp/vsite timeout 240 python3 lab/device/python_callbacks_on_device.py --out "$W/py31" \
        --runs lightning > "$W/py31/log.txt" 2>&1; nvidia-smi >> "$W/py31/log.txt") &
    if [ "${G29_LIMIT:-330}" != 0 ]; then
        OUT="$W/g29h" GRID=grid29c_h200 LANES=3 LIMIT=${G29_LIMIT:-330} lab/run grid29c > "$W/g29h.log" 2>&1
    fi
    ;;
esac
wait
tar -C "$W" -czf "$FINAL/${ARCHIVE:-all.tgz}" .
ls -la "$FINAL"
tail -n 3 "$W"/*.log

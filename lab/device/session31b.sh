#!/usr/bin/env bash
# Session 31's second call (issue 26): c26-09 (Llama-2-7B LoRA r64 attn, checkpointed, bf16,
# seq 1024) under its 80 GiB cap, each batch alone in a fresh process (session31.sh found b93,
# which ran in the search's process after six cache flushes, out of memory in a fresh one):
# a bisection between the planned 85 and 93 for the largest batch that runs fresh. H200 only.
#     OUT=dir bash lab/device/session31b.sh
set -u
R="$OUT"; T0=$SECONDS
C='{"model": "tests/data/grid26/configs/Llama-2-7b-hf.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "c26-09", "batch": BATCH}'
run() {
    timeout 100 python3 crates/device/runners/torch_runner.py measure --cap-gib 80 --config "${C/BATCH/$1}" \
        >> "$R/c2609_fresh.jsonl" 2>> "$R/c2609_fresh.log"
    tail -n 1 "$R/c2609_fresh.jsonl" | grep -q '"oom": false'
}
lo=85; hi=93   # lo: planned (assumed to run, checked), hi: out of memory fresh
run $lo && echo "b$lo ran at $((SECONDS - T0)) s" || { echo "b$lo out of memory"; hi=$lo; lo=0; }
while [ $((hi - lo)) -gt 1 ] && [ $lo -gt 0 ] && [ $((SECONDS - T0)) -lt ${TOTAL:-200} ]; do
    mid=$(( (lo + hi) / 2 ))
    if run $mid; then lo=$mid; echo "b$mid ran at $((SECONDS - T0)) s"; else hi=$mid; echo "b$mid out of memory at $((SECONDS - T0)) s"; fi
done
echo "largest that ran fresh: $lo; smallest out of memory: $hi"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"

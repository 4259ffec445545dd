#!/usr/bin/env bash
# Session 30's first call (issue 26): session 29's pre-registered fresh-process rows
# (lab/device/session29.sh, lab/grids/fresh29_configs.jsonl), then the allocator history of
# c26-01 at b13 under its 24 GiB cap, alone in a fresh process (it ran out of memory there in
# session 28; lab/wip/cublas29b.patch plans 13): `lab/device/snapshot_step.py`, PyTorch's
# default `_record_memory_history` options but Python stacks.
# On an H200 (an 80 GiB cap needs more than an H100's 79.2 GiB), in the time left (TOTAL,
# default 560 s): the histories of the two 80 GiB searches planned below what ran, c26-09 at
# b93 (Llama-2-7B LoRA r64 attn, checkpointed, bf16; planned 85) and c26b-02 at b54 (TinyLlama
# LoRA all-linear, checkpointed, AMP bf16; planned 50), each alone under its cap.
# Output: one archive, $OUT/all.tgz: fresh29.tgz (session29.sh's archive), $OUT/c2601_b13.pickle.gz, its row and log.
#     OUT=dir bash lab/device/session30.sh      (carry .whl)
set -u
FINAL="$OUT"; W=/tmp/s30; R="$W/r"; rm -rf "$W"; mkdir -p "$W/f29" "$R"
pack() { tar -C "$R" -czf "$FINAL/all.tgz" .; }
T0=$SECONDS
OUT="$W/f29" bash lab/device/session29.sh > "$R/session29.log" 2>&1
cp "$W/f29/all.tgz" "$R/fresh29.tgz"; pack
echo "fresh rows done at $((SECONDS - T0)) s"; tail -n 16 "$R/session29.log"
C='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_dropout": 0.05, "grid_id": "c26-01", "batch": 13}'
export PYTHONPATH=/tmp/site
timeout "${SNAP_S:-200}" python3 lab/device/snapshot_step.py --config "$C" --cap-gib 24 \
    --out "$W/c2601_b13.pickle" > "$R/c2601_b13_measure.jsonl" 2> "$R/c2601_b13.log"
echo "c26-01 b13 rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/c2601_b13.log"
gzip -c "$W/c2601_b13.pickle" > "$R/c2601_b13.pickle.gz"; pack
snap80() {  # id batch config
    if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then return; fi
    left=$(( ${TOTAL:-560} - (SECONDS - T0) ))
    if [ "$left" -lt 100 ]; then echo "$1: no time ($left s)"; return; fi
    timeout "$((left - 10))" python3 lab/device/snapshot_step.py --config "$3" --cap-gib 80 \
        --out "$W/$1_b$2.pickle" > "$R/$1_b$2_measure.jsonl" 2> "$R/$1_b$2.log"
    echo "$1 b$2 rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/$1_b$2.log"
    [ -f "$W/$1_b$2.pickle" ] && gzip -c "$W/$1_b$2.pickle" > "$R/$1_b$2.pickle.gz"; pack
}
snap80 c2609 93 '{"model": "tests/data/grid26/configs/Llama-2-7b-hf.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_dropout": 0.05, "grid_id": "c26-09", "batch": 93}'
snap80 c26b02 54 '{"model": "tests/data/grid26/configs/TinyLlama-1.1B.json", "seq": 2048, "precision": "amp-bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 16, "lora_targets": "all-linear", "lora_dropout": 0.05, "grid_id": "c26b-02", "batch": 54}'
pack; ls -la "$R" "$FINAL"

#!/usr/bin/env bash
# Session 31's device call (issue 26):
#   1. session 30's four fresh-process histories (`lab/device/session30d.sh`), on any card;
#   2. on an H200 only (an 80 GiB cap cannot be emulated on an H100's 79.2 GiB), the allocator histories (`snapshot_step.py`, PyTorch's `_record_memory_history`) of the
#      two 80 GiB max-batch searches the planner stops furthest short of, each at the largest
#      batch that ran, alone on the GPU in a fresh process under its cap: c26-09 (Llama-2-7B
#      LoRA r64 attn, checkpointed, bf16) b93, planned 85; c26b-02 (TinyLlama LoRA r16
#      all-linear, checkpointed, amp-bf16, seq 2048) b54, planned 50. Where one runs out of
#      memory, the next batch down that the planner's answer leaves open is run too.
# Output: one archive, $OUT/all.tgz.
#     OUT=dir bash lab/device/session31.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"; W=/tmp/s31; R="$W/r"; rm -rf "$W"; mkdir -p "$R"
pack() { tar -C "$R" -czf "$FINAL/all.tgz" .; }
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"
C2609='{"model": "tests/data/grid26/configs/Llama-2-7b-hf.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "c26-09", "batch": BATCH}'
C26b02='{"model": "tests/data/grid26/configs/TinyLlama-1.1B.json", "seq": 2048, "precision": "amp-bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 16, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "c26b-02", "batch": BATCH}'
hist() {  # name config batch
    local cfg="${2/BATCH/$3}" n="$1_b$3"
    timeout "${HIST_S:-150}" python3 lab/device/snapshot_step.py --cap-gib 80 --config "$cfg" \
        --out "$W/$n.pickle" > "$R/$n-measure.jsonl" 2> "$R/$n.log"
    echo "$n rc=$? at $((SECONDS - T0)) s"; tail -n 2 "$R/$n.log" | cut -c1-300
    [ -f "$W/$n.pickle" ] && gzip -c "$W/$n.pickle" > "$R/$n.pickle.gz"
    pack
    grep -q '"oom": false' "$R/$n-measure.jsonl"
}
mkdir -p "$W/s30d"
OUT="$W/s30d" SNAP_S=${SNAP_S:-170} bash lab/device/session30d.sh > "$R/s30d.log" 2>&1
cp "$W/s30d/all.tgz" "$R/s30d.tgz"; tail -n 8 "$R/s30d.log" | cut -c1-200; pack
echo "fresh histories done at $((SECONDS - T0)) s"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    HIST_S=$(( (${TOTAL:-560} - (SECONDS - T0)) / 2 - 5 ))
    [ "$HIST_S" -gt 60 ] && { hist c2609 "$C2609" 93 || true; }
    HIST_S=$(( ${TOTAL:-560} - (SECONDS - T0) - 10 ))
    [ "$HIST_S" -gt 60 ] && { hist c26b02 "$C26b02" 54 || true; }
fi
pack; ls -la "$R"

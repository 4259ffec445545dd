#!/usr/bin/env bash
# Session 30's device call, both parts in one lease:
#   1. issue 26: session 29's pre-registered fresh-process rows (lab/device/session29.sh,
#      lab/grids/fresh29_configs.jsonl), four lanes, alone on the GPU;
#   2. then together: issue 29's quantized device maps (lab/device/session30b.sh: grid30q, the
#      maps transformers computes, the refusal) and the allocator history of c26-01 at b13
#      under its 24 GiB cap in a fresh process (lab/device/session30.sh's second part);
#   3. on an H200 with time left (TOTAL, default 560 s): session30.sh's 80 GiB histories.
# Output: one archive, $OUT/all.tgz (f29/, s30b/, the histories).
#     OUT=dir bash lab/device/session30c.sh      (carry .whl)
set -u
FINAL="$OUT"; W=/tmp/s30c; R="$W/r"; rm -rf "$W"; mkdir -p "$W/f29" "$R/s30b"
pack() { tar -C "$R" -czf "$FINAL/all.tgz" .; }
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"
OUT="$W/f29" bash lab/device/session29.sh > "$R/session29.log" 2>&1
cp "$W/f29/all.tgz" "$R/fresh29.tgz"; pack
echo "fresh rows done at $((SECONDS - T0)) s"; tail -n 14 "$R/session29.log" | cut -c1-200
(OUT="$R/s30b" DEADLINE_S="${DEADLINE_30B:-150}" timeout 330 bash lab/device/session30b.sh > "$R/s30b.log" 2>&1) &
C='{"model": "tests/data/hf_configs/Mistral-7B-v0.3.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_dropout": 0.05, "grid_id": "c26-01", "batch": 13}'
(PYTHONPATH=/tmp/site timeout 200 python3 lab/device/snapshot_step.py --config "$C" --cap-gib 24 \
    --out "$W/c2601_b13.pickle" > "$R/c2601_b13_measure.jsonl" 2> "$R/c2601_b13.log"
 echo "c26-01 b13 rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$R/c2601_b13.log" | cut -c1-300
 [ -f "$W/c2601_b13.pickle" ] && gzip -c "$W/c2601_b13.pickle" > "$R/c2601_b13.pickle.gz") &
wait
echo "part 2 done at $((SECONDS - T0)) s"; tail -n 20 "$R/s30b.log" | cut -c1-220
pack
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ $(( ${TOTAL:-560} - (SECONDS - T0) )) -gt 120 ]; then
    left=$(( ${TOTAL:-560} - (SECONDS - T0) - 10 ))
    PYTHONPATH=/tmp/site timeout "$left" python3 lab/device/snapshot_step.py --cap-gib 80 --out "$W/c2609_b93.pickle" \
        --config '{"model": "tests/data/grid26/configs/Llama-2-7b-hf.json", "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_dropout": 0.05, "grid_id": "c26-09", "batch": 93}' \
        > "$R/c2609_b93_measure.jsonl" 2> "$R/c2609_b93.log"
    echo "c26-09 b93 rc=$? at $((SECONDS - T0)) s"
    [ -f "$W/c2609_b93.pickle" ] && gzip -c "$W/c2609_b93.pickle" > "$R/c2609_b93.pickle.gz"
    pack
fi
ls -la "$R" "$FINAL"

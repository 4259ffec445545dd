#!/usr/bin/env bash
# Session 33's device call:
#   1. issue 26: the allocator histories (`snapshot_step.py`, PyTorch's `_record_memory_history`)
#      of the five fit-split rows of grid26 whose reserved the planner misses most (the untouched
#      third is not recorded): g26-64 Qwen3-0.6B LoRA r8 attn amp-bf16 (+9.9 %), g26-26
#      Qwen3-0.6B QLoRA r64 all-linear fp32 (+7.5 %), g26-24 GPT-2 QLoRA r8 all-linear amp-bf16
#      checkpointed (−8.4 %), g26-27 GPT-2 QLoRA r64 fp32 accum4 checkpointed trainer (−7.0 %),
#      g26-43 Gemma-2-2B LoRA r64 attn bf16 reentrant accum2 trainer (−5.1 %).
#   2. issue 29 follow-up: the fixed export pasted and run (session31c.sh lab/device/s32_export).
# Output: $OUT/all.tgz (histories), $OUT/export.tgz.
#     OUT=dir bash lab/device/session33.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"; W=/tmp/s33; R="$W/r"; rm -rf "$W"; mkdir -p "$R"
pack() { tar -C "$R" -czf "$FINAL/all.tgz" .; }
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"
hist() {  # name config (skipped past HIST_UNTIL s, default 220: the export's run comes after)
    [ $((SECONDS - T0)) -gt ${HIST_UNTIL:-220} ] && { echo "$1 skipped at $((SECONDS - T0)) s"; return; }
    timeout 90 python3 lab/device/snapshot_step.py --config "$2" \
        --out "$W/$1.pickle" > "$R/$1-measure.jsonl" 2> "$R/$1.log"
    echo "$1 rc=$? at $((SECONDS - T0)) s"; tail -n 1 "$R/$1.log" | cut -c1-300
    [ -f "$W/$1.pickle" ] && gzip -c "$W/$1.pickle" > "$R/$1.pickle.gz"
    pack
}
hist g26-64 '{"model": "tests/data/hf_configs/Qwen3-0.6B.json", "batch": 4, "seq": 512, "precision": "amp-bf16", "optimizer": "adamw", "accum": 1, "checkpointing": false, "attention": "sdpa", "loop": "plain", "finetune": "lora", "lora_rank": 8, "lora_targets": "attn", "lora_alpha": 16.0, "lora_dropout": 0.05, "grid_id": "g26-64"}'
hist g26-26 '{"model": "tests/data/hf_configs/Qwen3-0.6B.json", "batch": 8, "seq": 256, "precision": "fp32", "optimizer": "adamw", "accum": 1, "checkpointing": false, "attention": "sdpa", "loop": "plain", "finetune": "qlora", "lora_rank": 64, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "g26-26"}'
hist g26-24 '{"model": "presets/models/gpt2.json", "batch": 2, "seq": 512, "precision": "amp-bf16", "optimizer": "adamw", "accum": 1, "checkpointing": true, "attention": "sdpa", "loop": "plain", "finetune": "qlora", "lora_rank": 8, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.0, "quant": "nf4", "double_quant": true, "grid_id": "g26-24"}'
hist g26-27 '{"model": "presets/models/gpt2.json", "batch": 8, "seq": 1024, "precision": "fp32", "optimizer": "adamw", "accum": 4, "checkpointing": true, "attention": "sdpa", "loop": "trainer", "finetune": "qlora", "lora_rank": 64, "lora_targets": "all-linear", "lora_alpha": 16.0, "lora_dropout": 0.05, "quant": "nf4", "double_quant": true, "grid_id": "g26-27"}'
hist g26-43 '{"model": "tests/data/hf_configs/gemma-2-2b.json", "batch": 2, "seq": 1024, "precision": "bf16", "optimizer": "adamw", "accum": 2, "checkpointing": true, "checkpoint_reentrant": true, "attention": "sdpa", "loop": "trainer", "finetune": "lora", "lora_rank": 64, "lora_targets": "attn", "lora_alpha": 16.0, "lora_dropout": 0.1, "grid_id": "g26-43"}'
echo "histories done at $((SECONDS - T0)) s"
mkdir -p "$W/export"
OUT="$W/export" timeout 170 bash lab/device/session31c.sh lab/device/s32_export > "$W/export/session.log" 2>&1
tail -n 20 "$W/export/session.log"
tar -C "$W/export" -czf "$FINAL/export.tgz" .
pack; ls -la "$R"; echo "done at $((SECONDS - T0)) s"

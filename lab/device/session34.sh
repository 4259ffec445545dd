#!/usr/bin/env bash
# Session 34: the pre-registered fresh-process grid (lab/grids/make_grid34.py). Each row of
# lab/grids/grid34_fresh_configs.jsonl and grid34_fresh_untouched_configs.jsonl runs alone in a
# fresh process (`torch_runner.py measure --config`), as a user's training script starts: the
# cuBLAS workspaces are made where the step first needs them, not kept from an earlier
# configuration (most rows of tests/data ran after others in one process).
# QLoRA rows are built as a user's from_pretrained(quantization_config=...) loads them
# (`"qlora_build": "as-loaded"`, crates/device/runners/torch_qlora.py load_quantized): the
# runner's default builds the fp32 model on the GPU first, whose freed segments the quantized
# weights then fill (docs/accuracy.md, f29-09), which no user's load does.
# Two lanes (two rows at a time fit an H100's 78 GiB by the grid's constraint), the large
# models dealt first; no row starts after DEADLINE_S (420 s); each ends by TRIAL_S (150 s).
# Output: $OUT/all.tgz — grid34_fresh.jsonl and grid34_fresh_untouched.jsonl (each row with
# its grid_id and split), one log per row, summary.txt, skipped.txt.
# The body of `lab/run grid34`, which puts the card's nvidia-smi line in OUT and the carried
# bitsandbytes wheel (.whl: QLoRA and 8-bit Adam) on PYTHONPATH first:
#     OUT=dir lab/run grid34
#     DRY_RUN=1 OUT=dir bash lab/device/session34.sh   (lists what each lane would run)
set -u
PY="${PY:-python3}"
FINAL="$OUT"; W=/tmp/s34; rm -rf "$W"; mkdir -p "$W"
T0=$SECONDS
LANES=2
lane() {  # lane index 0..LANES-1
    python3 - "$1" "$LANES" <<'PY' | while IFS= read -r line; do
import json, sys
rows = []
for f in ("lab/grids/grid34_fresh_configs.jsonl", "lab/grids/grid34_fresh_untouched_configs.jsonl"):
    rows += [json.loads(l) for l in open(f) if l.strip()]
big = lambda r: any(s in r["model"].lower() for s in ("7b", "8b"))
rows.sort(key=lambda r: (not big(r), r["grid_id"]))
lane, lanes = int(sys.argv[1]), int(sys.argv[2])
for r in rows[lane::lanes]:
    if r.get("finetune") == "qlora":
        r["qlora_build"] = "as-loaded"  # loaded as from_pretrained(quantization_config=...) loads
    print(json.dumps(r))
PY
        id=$(echo "$line" | python3 -c "import json,sys; print(json.load(sys.stdin)['grid_id'])")
        if [ $((SECONDS - T0)) -gt "${DEADLINE_S:-420}" ]; then echo "deadline: $id" >> "$W/skipped.txt"; continue; fi
        if [ -n "${DRY_RUN:-}" ]; then echo "lane $1: $id" >> "$W/summary.txt"; continue; fi
        timeout "${TRIAL_S:-150}" "$PY" crates/device/runners/torch_runner.py measure --config "$line" \
            > "$W/$id.out" 2> "$W/$id.log"
        rc=$?
        # the runner's row with the grid's id and split (the runner ignores keys it does not use)
        python3 - "$line" "$W/$id.out" "$rc" >> "$W/rows.jsonl" <<'PY'
import json, sys
cfg = json.loads(sys.argv[1])
out = [json.loads(l) for l in open(sys.argv[2]) if l.strip().startswith("{")]
row = out[-1] if out else {"index": 0, "error": f"no output (exit {sys.argv[3]})"}
row.update({"grid_id": cfg["grid_id"], "split": cfg["split"]})
print(json.dumps(row))
PY
        echo "$id rc=$rc $(tail -c 160 "$W/$id.out" | tr -d '\n')" >> "$W/summary.txt"
    done
}
for i in $(seq 0 $((LANES - 1))); do lane "$i" & done
wait
if [ -f "$W/rows.jsonl" ]; then
    grep '"split": "fit"' "$W/rows.jsonl" > "$W/grid34_fresh.jsonl"
    grep '"split": "untouched"' "$W/rows.jsonl" > "$W/grid34_fresh_untouched.jsonl"
fi
echo "done in $((SECONDS - T0)) s"; cat "$W/summary.txt" "$W/skipped.txt" 2>/dev/null | cut -c1-160
tar -C "$W" -czf "$FINAL/all.tgz" .

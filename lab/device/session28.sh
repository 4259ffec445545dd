#!/usr/bin/env bash
# Session 28: issue 26's capped max-batch rows one batch past the in-process search's answer,
# each in a fresh process (`torch_runner.py measure --cap-gib`), as a user starts a run. grid26's
# searches ran every trial in one process, where what earlier trials left in the pool decides the
# last batch (c26-06: 44 in-process, 45 fresh). Rows: lab/device/s28_fresh_caps.jsonl. Two lanes:
# the 24 GiB rows and the 48 GiB rows (72 GiB together, under an H100's 79.2); on an H200 the
# 80 GiB rows follow the 24 GiB ones. Each trial ends
# by TRIAL_S (150 s); no trial starts after DEADLINE_S (480 s). LANES="48.0" runs those caps only.
# Output: $OUT/fresh_caps.jsonl (one row per trial, oom true/false), summary.txt, logs.tgz.
#     OUT=dir bash lab/device/session28.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"
OUT=/tmp/s28; rm -rf "$OUT"; mkdir -p "$OUT"   # the call brings back a few files only: one archive
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.csv"
T0=$SECONDS
lane() {  # cap
    python3 - "$1" <<'PY' | while IFS= read -r line; do
import json, sys
for l in open("lab/device/s28_fresh_caps.jsonl"):
    r = json.loads(l)
    if r["cap_gib"] == float(sys.argv[1]):
        print(json.dumps(r["config"]))
PY
        if [ $((SECONDS - T0)) -gt "${DEADLINE_S:-480}" ]; then echo "deadline: skipped $line" >> "$OUT/skipped.txt"; continue; fi
        id=$(echo "$line" | python3 -c "import json,sys; c=json.load(sys.stdin); print(f\"{c['grid_id']}_b{c['batch']}\")")
        timeout "${TRIAL_S:-150}" python3 crates/device/runners/torch_runner.py measure --config "$line" --cap-gib "$1" \
            > "$OUT/$id.jsonl" 2> "$OUT/$id.log"
        echo "$id rc=$? $(tail -c 300 "$OUT/$id.jsonl" | tr -d '\n' | cut -c1-200)" >> "$OUT/summary.txt"
    done
}
# The 80 GiB rows (c26b-02, c26-09) need more than an H100's 79.2 GiB: on an H200 only, after
# the 24 GiB lane (48 + 80 GiB together stay under its 139 GiB).
if [ -n "${LANES:-}" ]; then
    for l in $LANES; do lane "$l" & done
elif nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    (lane 24.0; lane 80.0) &
    lane 48.0 &
else
    lane 24.0 &
    lane 48.0 &
fi
wait
cat "$OUT"/c26*.jsonl > "$OUT/fresh_caps.jsonl" 2>/dev/null
echo "done in $((SECONDS - T0)) s"; cat "$OUT/summary.txt"
cp "$OUT/fresh_caps.jsonl" "$OUT/summary.txt" "$FINAL/"; tar -C "$OUT" -czf "$FINAL/logs.tgz" .

#!/usr/bin/env bash
# Session 28's second call: the pre-registered capped searches of lab/grids/caps28_configs.jsonl
# (issue 26; all untouched), each `torch_runner.py max-batch` in its own process, three lanes
# (caps of at most 24 GiB: 72 GiB together, under an H100's 79.2). No search starts after
# TOTAL (200 s); each ends by TOTAL + 60. Output: $OUT/caps28.jsonl (the runner's lines, with
# the search's grid_id), $OUT/logs.tgz.
#     OUT=dir bash lab/device/session28b.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"; W=/tmp/s28b; rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/nvidia-smi.csv"
T0=$SECONDS
lane() {  # lane index 0..2
    python3 - "$1" <<'PY' | while IFS= read -r line; do
import json, sys
rows = [json.loads(l) for l in open("lab/grids/caps28_configs.jsonl") if l.strip()]
for r in rows[int(sys.argv[1])::3]:
    print(json.dumps(r))
PY
        left=$(( ${TOTAL:-200} - (SECONDS - T0) ))
        if [ "$left" -lt 20 ]; then echo "skipped $line" >> "$W/skipped.txt"; continue; fi
        id=$(echo "$line" | python3 -c "import json,sys; print(json.load(sys.stdin)['grid_id'])")
        cap=$(echo "$line" | python3 -c "import json,sys; print(json.load(sys.stdin)['cap_gib'])")
        cfg=$(echo "$line" | python3 -c "import json,sys; r=json.load(sys.stdin); [r.pop(k) for k in ('cap_gib','split')]; print(json.dumps(r))")
        timeout $((left + 60)) python3 crates/device/runners/torch_runner.py max-batch --config "$cfg" \
            --cap-gib "$cap" --limit 128 > "$W/$id.jsonl" 2> "$W/$id.log"
        echo "$id rc=$? $(grep max_batch "$W/$id.jsonl" | cut -c1-120)" >> "$W/summary.txt"
    done
}
lane 0 & lane 1 & lane 2 &
wait
cat "$W"/c28-*.jsonl > "$FINAL/caps28.jsonl" 2>/dev/null
cp "$W/summary.txt" "$FINAL/" 2>/dev/null
tar -C "$W" -czf "$FINAL/logs.tgz" .
echo "done in $((SECONDS - T0)) s"; cat "$W/summary.txt" "$W/skipped.txt" 2>/dev/null

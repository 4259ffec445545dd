#!/usr/bin/env bash
# Session 29: is the cuBLAS workspace's placement a fresh process's (lab/wip/cublas29.patch)?
# Each row of lab/grids/fresh29_configs.jsonl runs alone in a fresh process
# (`torch_runner.py measure --config`), as a user starts a run; the committed rows they come
# from were measured after other configs in the same process (index > 0), where the workspaces
# already existed. Rows f29-00..07: the eight single-GPU H200 rows whose reserved moves most
# between main and cublas29; f29-08..10: three it moves most below what was measured; then
# c28-07 at b20 under its 12 GiB cap (planned 20, 19 ran in the search's process).
# Four lanes; no trial starts after DEADLINE_S (150 s); each ends by TRIAL_S (90 s).
# Output: one archive, $OUT/all.tgz (rows, logs, nvidia-smi).
#     OUT=dir bash lab/device/session29.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"; W=/tmp/s29; rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/nvidia-smi.csv"
T0=$SECONDS
lane() {  # lane index 0..3
    python3 - "$1" <<'PY' | while IFS= read -r line; do
import json, sys
rows = [json.loads(l) for l in open("lab/grids/fresh29_configs.jsonl") if l.strip()]
for r in rows[int(sys.argv[1])::4]:
    print(json.dumps(r))
PY
        if [ $((SECONDS - T0)) -gt "${DEADLINE_S:-150}" ]; then echo "deadline: $line" >> "$W/skipped.txt"; continue; fi
        id=$(echo "$line" | python3 -c "import json,sys; print(json.load(sys.stdin)['grid_id'])")
        cap=$(echo "$line" | python3 -c "import json,sys; c=json.load(sys.stdin).get('cap_gib'); print(f'--cap-gib {c}' if c else '')")
        cfg=$(echo "$line" | python3 -c "import json,sys; r=json.load(sys.stdin); [r.pop(k, None) for k in ('cap_gib', 'from_file', 'from_index')]; print(json.dumps(r))")
        timeout "${TRIAL_S:-90}" python3 crates/device/runners/torch_runner.py measure --config "$cfg" $cap \
            > "$W/$id.jsonl" 2> "$W/$id.log"
        echo "$id rc=$? $(tail -c 200 "$W/$id.jsonl" | tr -d '\n')" >> "$W/summary.txt"
    done
}
lane 0 & lane 1 & lane 2 & lane 3 &
wait
cat "$W"/f29-*.jsonl "$W"/c28-*.jsonl > "$W/fresh29.jsonl" 2>/dev/null
echo "done in $((SECONDS - T0)) s"; cat "$W/summary.txt" "$W/skipped.txt" 2>/dev/null | cut -c1-160
tar -C "$W" -czf "$FINAL/all.tgz" .

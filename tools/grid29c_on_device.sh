#!/usr/bin/env bash
# Issue 29's pre-registered grid of quantized weights and device_map offload on the device
# (tools/make_grid29c.py drew it). Carry .whl (the slimmed bitsandbytes 0.50.2 wheel).
#   LIMIT=480 OUT=/some/dir bash tools/grid29c_on_device.sh
#   DONE=path/to/grid29c_all.jsonl ...   # rows already measured (a previous call) are skipped
# Rows of both files are run sorted by model and dtype, so each random-weight checkpoint is
# saved once; the results are split again by "split" into grid29c.jsonl and
# grid29c_untouched.jsonl.
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
SITE=$(mktemp -d)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/bitsandbytes-0.50.2-*.whl \
    > "$OUT/pip.log" 2>&1 || echo "pip install failed (see pip.log)"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
ALL="$OUT/grid29c_all.jsonl"
[ -n "${DONE:-}" ] && [ -f "$DONE" ] && cp "$DONE" "$ALL"
"$PY" - "$OUT/sorted_configs.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for f in ("tools/grid29c_configs.jsonl", "tools/grid29c_untouched_configs.jsonl")
        for l in open(f) if l.strip()]
rows.sort(key=lambda r: (r["model"], r["precision"], r["id"]))
open(sys.argv[1], "w").writelines(json.dumps(r) + "\n" for r in rows)
PYEOF
"$PY" tools/infer_runner.py --configs "$OUT/sorted_configs.jsonl" --out "$ALL" \
    --time-limit "${LIMIT:-480}" > "$OUT/runner.log" 2>&1
"$PY" - "$ALL" "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for split, name in (("fit", "grid29c.jsonl"), ("untouched", "grid29c_untouched.jsonl")):
    with open(f"{sys.argv[2]}/{name}", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["split"] == split)
print(len(rows), "rows measured;", sum(1 for r in rows if "error" in r), "with an error")
PYEOF
rm -f "$OUT/sorted_configs.jsonl"

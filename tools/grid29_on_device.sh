#!/usr/bin/env bash
# Issue 29's pre-registered inference grid on the device (tools/make_grid29.py drew it).
#   OUT=/some/dir bash tools/grid29_on_device.sh
# Runs the fit rows, then the untouched third, into .device/grid29*.jsonl (kept between
# calls: re-running the same command skips the rows already measured), each call stopping
# before a row would start after LIMIT seconds, and copies both files to $OUT.
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT" .device
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
LIMIT="${LIMIT:-480}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
START=$(date +%s)
"$PY" tools/infer_runner.py --configs tools/grid29_configs.jsonl \
    --out .device/grid29.jsonl --time-limit "$LIMIT" 2> "$OUT/grid29.log"
LEFT=$(( LIMIT - ($(date +%s) - START) ))
if [ "$LEFT" -gt 30 ]; then
    "$PY" tools/infer_runner.py --configs tools/grid29_untouched_configs.jsonl \
        --out .device/grid29_untouched.jsonl --time-limit "$LEFT" 2> "$OUT/grid29_untouched.log"
fi
cp .device/grid29*.jsonl "$OUT/" 2>/dev/null
wc -l tools/grid29_configs.jsonl tools/grid29_untouched_configs.jsonl .device/grid29*.jsonl

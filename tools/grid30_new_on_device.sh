#!/usr/bin/env bash
# Issue 30's three later grids in one call (tools/make_grid30_{bart,encoder,moe}.py drew them,
# committed before any was measured): bart (12 rows), modernbert + deberta-v2 (24),
# deepseek_v3 + gpt_oss (24), one process per row under the card's memory budget
# (tools/grid_sched.py). Rows come back as grid30_new_fit.jsonl / grid30_new_untouched.jsonl
# (each row keeps its grid_id), in one archive.
#   LIMIT=520 OUT=/some/dir bash tools/grid30_new_on_device.sh
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)/crates/device/runners:$(pwd)/tools${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" crates/device/runners/torch_runner.py --env > "$OUT/env.json" 2>/dev/null
LIMIT="${LIMIT:-520}"
S=$(date +%s)
ROWS=""
for g in bart encoder moe; do
    ROWS="$ROWS tools/grid30_${g}_configs.jsonl tools/grid30_${g}_untouched_configs.jsonl"
done
# shellcheck disable=SC2086
"$PY" tools/grid_sched.py "$OUT" $ROWS --prefix grid30_new --deadline "$LIMIT" --par "${PAR:-4}" \
    --skip tests/data/grid30/grid30_new_fit.jsonl tests/data/grid30/grid30_new_untouched.jsonl 2> "$OUT/sched.log"
echo "grid30_new done in $(( $(date +%s) - S ))s"
# (archived outside OUT, then moved in: a tar of the folder it writes into fails "file changed")
ARC=$(mktemp -u /tmp/all.XXXX.tgz)
tar czf "$ARC" -C "$OUT" . ; find "$OUT" -mindepth 1 -delete ; mv "$ARC" "$OUT/all.tgz"

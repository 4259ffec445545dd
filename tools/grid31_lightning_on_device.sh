#!/usr/bin/env bash
# The Lightning loop grid (tools/make_grid31_lightning.py drew it) on the device: every row
# through torch_runner's `loop: "lightning"` (Lightning's closure order) under
# tools/grid_sched.py, then the same rows run by a real Lightning Trainer
# (tools/lightning_real_on_device.py, two processes at a time) to check the emulation.
#   LIMIT=420 OUT=/some/dir bash tools/grid31_lightning_on_device.sh
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)/crates/device/runners:$(pwd)/tools${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" crates/device/runners/torch_runner.py --env > "$OUT/env.json" 2>/dev/null
LIMIT="${LIMIT:-420}"
S=$(date +%s)
ROWS="tools/grid31_lightning_configs.jsonl tools/grid31_lightning_untouched_configs.jsonl"
# shellcheck disable=SC2086
"$PY" tools/grid_sched.py "$OUT" $ROWS --prefix grid31_lightning --deadline "$(( LIMIT / 2 ))" \
    --par "${PAR:-3}" --budget-frac "${BUDGET_FRAC:-0.78}" 2> "$OUT/sched.log"
echo "emulated rows done in $(( $(date +%s) - S ))s"
# The real Lightning runs: two lanes, each a sequence of one-row processes.
split -n l/2 tools/grid31_lightning_configs.jsonl "$OUT/lane."
cat tools/grid31_lightning_untouched_configs.jsonl >> "$OUT/lane.ab"
LEFT=$(( LIMIT - ($(date +%s) - S) - 10 ))
for f in "$OUT"/lane.a?; do
    timeout -k 5 "$LEFT" "$PY" tools/lightning_real_on_device.py "$f" > "$f.real.jsonl" 2> "$f.real.log" &
done
wait
cat "$OUT"/lane.a?.real.jsonl > "$OUT/grid31_lightning_real.jsonl"
rm -f "$OUT"/lane.a? "$OUT"/lane.a?.real.jsonl
echo "all done in $(( $(date +%s) - S ))s"
ARC=$(mktemp -u /tmp/all.XXXX.tgz)
tar czf "$ARC" -C "$OUT" . ; find "$OUT" -mindepth 1 -delete ; mv "$ARC" "$OUT/all.tgz"

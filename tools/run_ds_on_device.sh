#!/usr/bin/env bash
# DeepSpeed ZeRO-1/2/3 per-rank measurements on one GPU (crates/device/runners/ds_runner.py): rank 0 of a world
# of N under PyTorch's fake process group, one process per config (DeepSpeed keeps groups and
# hooks in module globals). The device has no DeepSpeed and no internet: the wheels travel in
# .whl/ds/ (deepspeed 0.19.8 built with DS_BUILD_OPS=0 DS_ACCELERATOR=cuda, and its pure /
# manylinux cp312 dependencies) and are installed into /tmp/dssite.
# From the repo root:   OUT=/some/dir bash tools/run_ds_on_device.sh
#   DS_CONFIGS=...      the configs (default tools/ds_configs.jsonl)
#   LIMIT_DS_ONE=...    seconds per config (default 120)
set -u -o pipefail
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# DeepSpeed picks CUDA itself when torch sees a GPU; say so anyway (no CPU op builders).
export DS_ACCELERATOR=cuda
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/dssite .whl/ds/*.whl > "$OUT/pip.log" 2>&1 || { echo "pip install failed"; cat "$OUT/pip.log"; exit 1; }
  export PYTHONPATH=/tmp/dssite${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import deepspeed, torch; print('deepspeed', deepspeed.__version__, 'torch', torch.__version__)" \
  > "$OUT/versions.txt" 2>&1 || { cat "$OUT/versions.txt"; exit 1; }
cat "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
: > "$OUT/ds.jsonl"; : > "$OUT/ds.log"
i=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  printf '%s\n' "$line" > "$OUT/one.jsonl"
  timeout -k 5 "${LIMIT_DS_ONE:-120}" "$PY" crates/device/runners/ds_runner.py measure "$OUT/one.jsonl" \
      < /dev/null 2>> "$OUT/ds.log" \
    | sed "s/^{\"index\": 0,/{\"index\": $i,/" >> "$OUT/ds.jsonl"
  i=$((i + 1))
done < "${DS_CONFIGS:-tools/ds_configs.jsonl}"
rm -f "$OUT/one.jsonl"
echo "ds lines=$(wc -l < "$OUT/ds.jsonl") of $i"

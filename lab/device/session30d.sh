#!/usr/bin/env bash
# Session 30's second call (issue 26): the allocator histories of four rows of
# lab/grids/fresh29_configs.jsonl, each alone in a fresh process as session30c.sh measured
# them, where lab/wip/cublas29b.patch (the cuBLAS workspaces at each thread's first GEMM)
# still misses: f29-00 (planned +22 %), f29-04 (+22 %), f29-08 (-14.6 %), f29-09 (-13.2 %).
# `lab/device/snapshot_step.py` (PyTorch's `_record_memory_history`, Python stacks), in
# parallel (about 71 GiB together on an H100). Output: one archive, $OUT/all.tgz.
#     OUT=dir bash lab/device/session30d.sh      (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
FINAL="$OUT"; W=/tmp/s30d; R="$W/r"; rm -rf "$W"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"
T0=$SECONDS
for id in ${ROWS:-f29-00 f29-04 f29-08 f29-09}; do
    cfg=$(python3 -c "
import json, sys
for l in open('lab/grids/fresh29_configs.jsonl'):
    r = json.loads(l)
    if r['grid_id'] == '$id':
        [r.pop(k, None) for k in ('cap_gib', 'from_file', 'from_index')]
        print(json.dumps(r))")
    (timeout "${SNAP_S:-170}" python3 lab/device/snapshot_step.py --config "$cfg" --out "$W/$id.pickle" \
        > "$R/$id.jsonl" 2> "$R/$id.log"
     echo "$id rc=$? at $((SECONDS - T0)) s"
     [ -f "$W/$id.pickle" ] && gzip -c "$W/$id.pickle" > "$R/$id.pickle.gz") &
done
wait
tar -C "$R" -czf "$FINAL/all.tgz" .
ls -la "$R"

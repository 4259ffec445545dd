#!/usr/bin/env bash
# Session 26's second call: the caching allocator's history (lab/device/snapshot_step.py) of the
# rows of lab/device/s26_rows.jsonl — rows whose planned reserved bytes moved most when the
# cuBLAS workspaces were placed at each thread's first GEMM — one process each, PAR (2) at a time.
# Snapshots come back gzipped in 15 MiB parts (snap_NAME.part-NN), logs and measurements in
# all.tgz.
#     OUT=dir bash lab/device/session26b.sh      (carry .whl)
set -u
FINAL="$OUT"
W=/tmp/s26b
rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/nvidia-smi.csv"
cat "$W/nvidia-smi.csv"
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
snap() {  # NAME CONFIG
    PYTHONPATH=/tmp/bnb timeout 150 python3 lab/device/snapshot_step.py --config "$2" \
        --out "/tmp/$1.pickle" > "$W/$1_measure.jsonl" 2> "$W/$1.log"
    gzip -c "/tmp/$1.pickle" > "/tmp/$1.pickle.gz" && split -b 15M -d "/tmp/$1.pickle.gz" "$FINAL/snap_$1.part-"
}
i=0
while IFS= read -r line; do
    name=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["name"])' "$line")
    snap "$name" "$line" &
    i=$((i + 1))
    if [ $((i % ${PAR:-2})) = 0 ]; then wait; fi
done < lab/device/s26_rows.jsonl
wait
tar -C "$W" -czf "$FINAL/all.tgz" .
ls -la "$FINAL"
tail -n 2 "$W"/*.log

#!/usr/bin/env bash
# Session 27's device call (an H200 wanted; on an H100 the Lightning part and phase 2 are skipped).
# Phase 1, together (small models): issue 31's Lightning callback run (session26.sh, SNAPS=0,
# G29_LIMIT=0), issue 29's inference bench (bench_infer.sh: the shipped `vramlab bench
# --engine torch --step generate|prefill`), and issue 26's allocator histories of the four rows
# of lab/device/s26_rows.jsonl (session26b.sh). Phase 2, alone (three lanes of up to ~30 GB):
# issue 29's grid29c rows again as grid29c_h200 (LIMIT G29_LIMIT, default 290 s, less
# when phase 1 ran long: all ends by 530 s).
# Everything comes back in one archive, $OUT/all.tgz.
#     OUT=dir bash lab/device/session27.sh      (carry .whl and .device: a stripped release build)
set -u
FINAL="$OUT"
W=/tmp/s27
rm -rf "$W"; mkdir -p "$W"/s26 "$W"/bi "$W"/s26b
python3 -m pip install -q --no-index --no-deps --target /tmp/vsite .whl/py/*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/bnb .whl/bitsandbytes-*.whl
t0=$SECONDS
(SNAPS=0 G29_LIMIT=0 ARCHIVE=s26.tgz OUT="$W/s26" bash lab/device/session26.sh > "$W/s26.log" 2>&1) &
(OUT="$W/bi" bash lab/device/bench_infer.sh > "$W/bi.log" 2>&1) &
(PAR=2 OUT="$W/s26b" bash lab/device/session26b.sh > "$W/s26b.log" 2>&1) &
wait
echo "phase 1: $((SECONDS - t0)) s"
LIM=$(( ${G29_LIMIT:-290} < 530 - (SECONDS - t0) ? ${G29_LIMIT:-290} : 530 - (SECONDS - t0) ))
if [ "$LIM" -gt 60 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    OUT="$W/g29h" GRID=grid29c_h200 LANES=3 LIMIT=$LIM timeout $((LIM + 35)) lab/run grid29c > "$W/g29h.log" 2>&1
fi
echo "phase 2 ended at $((SECONDS - t0)) s"
tar -C "$W" -czf "$FINAL/all.tgz" .
ls -la "$FINAL"
tail -n 4 "$W"/*.log
tail -n 40 "$W/bi.log"

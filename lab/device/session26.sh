#!/usr/bin/env bash
# Session 26's device call: lab/device/session25b.sh (on any card, the allocator history of
# c26b-04 by lab/device/snapshot_step.py; on an H200 also issue 31's Lightning callback run in a
# process of its own and issue 29's grid29c_h200), packed so it all comes back: the snapshot
# in 15 MiB parts (snap.part-*), everything else in all.tgz.
#     OUT=dir bash lab/device/session26.sh        (carry .whl; G29_LIMIT as session25b.sh)
set -u
FINAL="$OUT"
W=/tmp/s26
rm -rf "$W"; mkdir -p "$W"
OUT="$W" bash lab/device/session25b.sh
if [ -f "$W/c26b04_snapshot.pickle.gz" ]; then
    split -b 15M -d "$W/c26b04_snapshot.pickle.gz" "$FINAL/snap.part-"
    rm "$W/c26b04_snapshot.pickle.gz"
fi
tar -C "$W" -czf "$FINAL/all.tgz" .
ls -la "$FINAL"

#!/bin/sh
# Issue 32's snapshot benchmark: writes a 150 MB memory snapshot the way a user gets one
# (lab/cpu/make_big_snapshot.py: a training loop under PyTorch's default
# `_record_memory_history()`, written by `pickle.dump`) unless FILE exists, and times
# opening it with the reader before issue 32 and the current one side by side, in-process
# and as whole processes (crates/core/examples/snapshot_bench.rs). No GPU, no torch:
# python3's standard library. With target/release/vramlab built, its
# `doctor --snapshot FILE --json` is timed too.
#
#     lab/cpu/bench_snapshot.sh [FILE]        (REPS=5 by default)
set -eu
cd "$(dirname "$0")/../.."
FILE=${1:-target/bench/snapshot150.pickle}
mkdir -p "$(dirname "$FILE")"
[ -f "$FILE" ] || python3 lab/cpu/make_big_snapshot.py "$FILE" --mb 150
cargo build --release --locked -p vramlab-core --example snapshot_bench
uptime
set -- "$FILE" --reps "${REPS:-5}"
[ -x target/release/vramlab ] && set -- "$@" --vramlab target/release/vramlab
exec target/release/examples/snapshot_bench "$@"

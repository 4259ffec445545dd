#!/usr/bin/env bash
# The device call carries at most 64 MiB: the tracked repository (about 59 MiB in session 20)
# plus the `carry` paths. A wheel that does not fit beside the repository travels in chunks,
# one per call, to a machine that stays warm between calls (30 s idle):
#   bash lab/cpu/carry_in_chunks.sh /path/to/bitsandbytes-0.50.2-...whl   # writes .whl/c0..cN
# then, back to back, one `run` per chunk with carry [".whl/cK"] and the command
#   mkdir -p /tmp/parts && cp .whl/cK/* /tmp/parts/
# and in the last call, before the work:
#   cat /tmp/parts/chunk* > .whl/NAME.whl && md5sum .whl/NAME.whl
# (compare with the md5 printed here). .whl/ is ignored (.git/info/exclude: /.whl/).
set -euo pipefail
file="$1"
size="${CHUNK_BYTES:-920000}"
cd "$(dirname "$0")/../.."
rm -rf .whl/c[0-9]*
tmp=$(mktemp -d)
split -b "$size" -d -a 2 "$file" "$tmp/chunk"
i=0
for c in "$tmp"/chunk*; do
    mkdir -p ".whl/c$i"
    mv "$c" ".whl/c$i/"
    i=$((i + 1))
done
echo "$i chunks in .whl/c0..c$((i - 1)); name on the device: $(basename "$file")"
md5sum "$file"

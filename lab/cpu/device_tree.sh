#!/usr/bin/env bash
# The device tool sends the checkout's tracked files (and what `carry` names) with every call,
# 64 MiB at most; the tracked tree is about 60 MiB, most of it test fixtures no device job
# reads. This takes those folders out of what travels for the calls in between and puts them
# back after (the files stay on disk; only the index and .git/info/exclude change):
#
#     bash lab/cpu/device_tree.sh slim      # before the device calls (prints the size that travels)
#     bash lab/cpu/device_tree.sh restore   # after them, before any commit
#
# Do not commit while slim: the index then deletes the folders. `restore` is idempotent.
set -eu
cd "$(dirname "$0")/../.."
FOLDERS="tests/data/captured tests/data/captured_cpu tests/data/grid26b/captured_cpu
tests/data/grid26b/captured_gpu tests/data/doctor screenshots crates/gui/tests/snapshots"
EXCLUDE="$(git rev-parse --git-path info/exclude)"
BEGIN="# device_tree.sh slim: begin"
END="# device_tree.sh slim: end"
size() {
    git ls-files -z | python3 -c "import os, sys; print(round(sum(os.path.getsize(f) for f in \
sys.stdin.buffer.read().split(b'\0') if f and os.path.isfile(f)) / 2**20, 1), 'MiB tracked')"
}
case "${1:-}" in
slim)
    bash lab/cpu/device_tree.sh restore > /dev/null
    mkdir -p "$(dirname "$EXCLUDE")"
    echo "$BEGIN" >> "$EXCLUDE"
    for f in $FOLDERS; do
        git rm -r -q --cached --ignore-unmatch "$f"
        echo "/$f/" >> "$EXCLUDE"
    done
    echo "$END" >> "$EXCLUDE"
    size
    ;;
restore)
    for f in $FOLDERS; do git reset -q -- "$f"; done
    if [ -f "$EXCLUDE" ]; then
        sed "/^$BEGIN\$/,/^$END\$/d" "$EXCLUDE" > "$EXCLUDE.tmp"
        mv "$EXCLUDE.tmp" "$EXCLUDE"
    fi
    size
    ;;
*)
    echo "usage: bash lab/cpu/device_tree.sh slim|restore" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Writes tests/data/fit_outputs/cases.jsonl: for every line of cases.tsv (name, TAB, the
# arguments of `vramlab`), the `--json` output (standard output, standard error, exit status)
# of the binary given as $1. Recorded before the fit search and the remedies were made faster
# (issue 32); `tests/cli_outputs.rs` holds the binary to it: same answers, byte for byte.
set -euo pipefail
bin=${1:-target/debug/vramlab}
dir=tests/data/fit_outputs
python3 - "$bin" "$dir" <<'PY'
import json, shlex, subprocess, sys
binary, d = sys.argv[1], sys.argv[2]
with open(f"{d}/cases.tsv") as f, open(f"{d}/cases.jsonl", "w") as out:
    for line in f:
        if not line.strip():
            continue
        name, args = line.rstrip("\n").split("\t")
        argv = shlex.split(args) + ["--json"]
        p = subprocess.run([binary] + argv, capture_output=True, text=True, timeout=600)
        out.write(json.dumps({"name": name, "args": shlex.split(args),
                              "stdout": p.stdout, "stderr": p.stderr,
                              "status": p.returncode}) + "\n")
PY

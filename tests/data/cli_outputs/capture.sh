#!/usr/bin/env bash
# Writes tests/data/cli_outputs/cases.jsonl: for every line of cases.tsv (name, TAB, the
# arguments of `vramlab`), the text and `--json` outputs (standard output, standard error,
# exit status) of the binary given as $1. Run from the repo root before a change to how the
# outputs are assembled; `tests/cli_outputs.rs` compares the binary against it.
set -euo pipefail
bin=${1:-target/debug/vramlab}
dir=tests/data/cli_outputs
python3 - "$bin" "$dir" <<'PY'
import json, shlex, subprocess, sys
binary, d = sys.argv[1], sys.argv[2]
with open(f"{d}/cases.jsonl", "w") as out:
    for line in open(f"{d}/cases.tsv"):
        if not line.strip():
            continue
        name, args = line.rstrip("\n").split("\t")
        args = shlex.split(args)
        row = {"name": name, "args": args}
        for kind, extra in (("text", []), ("json", ["--json"])):
            p = subprocess.run([binary, *args, *extra], capture_output=True, text=True)
            row[kind] = {"status": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
PY

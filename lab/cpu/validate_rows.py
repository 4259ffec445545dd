#!/usr/bin/env python3
"""Every measured row of tests/data planned alone (`vramlab validate` on a one-row file), with
its position in the runner's process (`index`: 0 = the first configuration of a fresh process;
later rows ran after others, with the cuBLAS workspaces and what empty_cache() keeps already
in the pool), so that a change's effect can be read per row and split by process state:

    python3 lab/cpu/validate_rows.py BINARY OUT.json [VAR=VALUE ...]   # plan every row
    python3 lab/cpu/validate_rows.py --compare BEFORE.json AFTER.json   # summaries, largest moves

Reserved error, percent, (planned − measured) / measured; `untouched` files are summarised apart.
"""
import concurrent.futures as cf
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def plan_rows(binary, out, env):
    rows = []
    for f in sorted(glob.glob("tests/data/*.jsonl")):
        for i, line in enumerate(open(f)):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and "peak_reserved" in r and not r.get("oom") and not r.get("error"):
                rows.append((f, i, line, r))
    e = dict(os.environ)
    e.update(env)

    def one(t):
        f, i, line, r = t
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tf:
            tf.write(line)
        try:
            p = subprocess.run([binary, "validate", tf.name], capture_output=True, text=True, env=e)
        finally:
            os.unlink(tf.name)
        m = re.search(r"reserved\s+([\d.]+)/\s*([\d.]+) GiB\s+([+-][\d.]+) %", p.stdout)
        if not m:
            return None
        return {"file": os.path.basename(f), "line": i, "index": r.get("index", 0),
                "err": float(m.group(3)), "model": r.get("model"), "batch": r.get("batch")}

    with cf.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        res = [x for x in ex.map(one, rows) if x]
    with open(out, "w") as fh:
        json.dump(res, fh)
    print(len(res), "rows planned")


def summary(rows, name):
    if not rows:
        return
    e = [r["err"] for r in rows]
    print(f"{name:10s} {len(e):4d} rows  median |error| {statistics.median(abs(x) for x in e):5.2f} %  "
          f"under >5 %: {sum(x < -5 for x in e):3d}  >10 %: {sum(x < -10 for x in e):3d}  "
          f"over >5 %: {sum(x > 5 for x in e):3d}  >10 %: {sum(x > 10 for x in e):3d}  worst under {min(e):+.1f} %")


def compare(paths):
    runs = [json.load(open(p)) for p in paths]
    for p, rows in zip(paths, runs):
        print("==", p)
        summary([r for r in rows if "untouched" not in r["file"]], "all")
        summary([r for r in rows if r["index"] == 0 and "untouched" not in r["file"]], "fresh")
        summary([r for r in rows if r["index"] != 0 and "untouched" not in r["file"]], "warm")
        summary([r for r in rows if "untouched" in r["file"]], "untouched")
    if len(runs) == 2:
        moves = sorted(((b["err"] - a["err"], a, b) for a, b in zip(*runs)), key=lambda t: t[0])
        print("largest moves:")
        for d, a, b in moves[:10] + moves[-10:]:
            print(f"  {d:+6.1f}  {a['err']:+6.1f} -> {b['err']:+6.1f} %  {a['file']}:{a['line'] + 1} "
                  f"(index {a['index']}) {a['model']} b{a['batch']}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--compare":
        compare(sys.argv[2:])
    elif len(sys.argv) >= 3:
        plan_rows(sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:]))
    else:
        sys.exit(__doc__)

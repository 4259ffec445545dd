#!/usr/bin/env python3
"""lab/run grid26b caps: max-batch searches under caps (lane 0 the 80 GiB caps, lanes 1-2 the rest;
LANES=1 one at a time). Reads OUT, PY, LIMIT, ONLY, LANES."""
import json, os, subprocess, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("lab/grids/grid26b_caps.jsonl") if l.strip()]
again = {"c26-00", "c26-01", "c26-04", "c26-10", "c26-11", "c26-13"}
rows += [json.loads(l) for l in open("lab/grids/grid26_cap_configs.jsonl") if l.strip() and json.loads(l)["grid_id"] in again]
ids = os.environ.get("ONLY", "").split()
rows = [r for r in rows if not ids or r["grid_id"] in ids]
# lane 0: the 80 GiB caps; lanes 1, 2: the rest (at most 80 + 48 + 48 < 141 GiB at once);
# LANES=1 (a card under 141 GiB, an H100) runs them one by one
if os.environ.get("LANES") == "1":
    lanes = [rows, [], []]
else:
    lanes = [[r for r in rows if r["cap_gib"] == 80]] + [[r for r in rows if r["cap_gib"] != 80][i::2] for i in range(2)]
t0 = time.time()
def start(k):
    if not lanes[k]:
        return None
    r = lanes[k].pop(0)
    left = limit - (time.time() - t0)
    if left < 30:
        return None
    cfg = {k2: v for k2, v in r.items() if k2 not in ("cap_gib", "split")}
    return subprocess.Popen(["timeout", "-k", "5", str(int(left)), py, "crates/device/runners/torch_runner.py", "max-batch",
                             "--config", json.dumps(cfg), "--cap-gib", str(r["cap_gib"]), "--limit", "96"],
                            stdout=open(f"{out}/cap_{r['grid_id']}.jsonl", "w"),
                            stderr=open(f"{out}/cap_{r['grid_id']}.log", "w"))
procs = [start(k) for k in range(3)]
while any(procs):
    for k, p in enumerate(procs):
        if p is not None and p.poll() is not None:
            procs[k] = start(k)
    time.sleep(1)
print("caps done", round(time.time() - t0), "s")

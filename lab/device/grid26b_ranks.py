#!/usr/bin/env python3
"""lab/run grid26b ranks: issue 26's 30 multi-GPU ranks, one process each, in 3 lanes. Reads OUT, PY, LIMIT, ONLY."""
import json, os, subprocess, sys, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("lab/grids/grid26b_ranks.jsonl") if l.strip()]
ids = os.environ.get("ONLY", "").split()
rows = [r for r in rows if not ids or r["grid_id"] in ids]
mode = {"fsdp2": ("dist_runner.py", "fsdp"), "ddp": ("dist_runner.py", "ddp"),
        "torch-zero1": ("dist_runner.py", "zero1"), "zero1": ("ds_runner.py", "measure"),
        "zero2": ("ds_runner.py", "measure"), "zero3": ("ds_runner.py", "measure")}
t0 = time.time()
lanes = [rows[i::3] for i in range(3)]
procs = [None] * 3
def start(k):
    if not lanes[k]:
        return None
    r = lanes[k].pop(0)
    left = limit - (time.time() - t0)
    if left < 30:
        return None
    one = f"{out}/one_{r['grid_id']}.jsonl"
    open(one, "w").write(json.dumps(r) + "\n")
    script, m = mode[r["strategy"]]
    env = dict(os.environ, MASTER_PORT=str(29600 + k))
    return subprocess.Popen(["timeout", "-k", "5", str(int(min(left, 150))), py, f"crates/device/runners/{script}", m, one],
                            stdout=open(f"{out}/rank_{r['grid_id']}.jsonl", "w"),
                            stderr=open(f"{out}/rank_{r['grid_id']}.log", "w"), env=env, stdin=subprocess.DEVNULL)
for k in range(3):
    procs[k] = start(k)
while any(procs):
    for k, p in enumerate(procs):
        if p is not None and p.poll() is not None:
            procs[k] = start(k)
    time.sleep(0.5)
print("ranks done", round(time.time() - t0), "s")

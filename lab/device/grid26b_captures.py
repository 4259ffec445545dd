#!/usr/bin/env python3
"""lab/run grid26b captures: issue 26's 12 models captured on the GPU host and measured, 4 at a time.
Reads OUT, PY, LIMIT, ONLY."""
import json, os, subprocess, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("lab/grids/grid26b_captures.jsonl") if l.strip()]
ids = os.environ.get("ONLY", "").split()
rows = [r for r in rows if not ids or r["grid_id"] in ids]
os.makedirs(f"{out}/g", exist_ok=True)
t0 = time.time()
def cmd(r):
    a = r["source"].split() + ["--precision", r["precision"], "--loop", r["loop"]]
    if r["checkpointing"]:
        a.append("--checkpointing")
    a += ["--input", r["input"]] if "input" in r else ["--image", str(r["image"])]
    a += ["-o", f"{out}/g/{r['grid_id']}.vramlab-graph.json",
          "--measure", ",".join(map(str, r["measure"])), "--measure-out", f"{out}/g/{r['grid_id']}.measured.jsonl"]
    return [py, "runners/capture.py"] + a
queue = list(rows)
procs = []
while queue or procs:
    while queue and len(procs) < 4 and time.time() - t0 < limit - 40:
        r = queue.pop(0)
        left = limit - (time.time() - t0)
        procs.append(subprocess.Popen(["timeout", "-k", "5", str(int(min(left, 240)))] + cmd(r),
                                      stdout=open(f"{out}/g/{r['grid_id']}.log", "w"), stderr=subprocess.STDOUT))
    if not queue or time.time() - t0 >= limit - 40:
        queue = [] if time.time() - t0 >= limit - 40 else queue
    procs = [p for p in procs if p.poll() is None]
    time.sleep(0.5)
print("captures done", round(time.time() - t0), "s")

#!/usr/bin/env python3
"""lab/run grid29_lanes: a grid drawn by a make_grid29*.py, each row in its own process, started while the
estimated memory of the rows running stays under BUDGET_GB; a row that ran out of memory beside
others runs again alone at the end. Reads OUT, PY, LIMIT, BUDGET_GB, GRID."""
import json, os, subprocess, time
out, py = os.environ["OUT"], os.environ["PY"]
limit, budget = float(os.environ["LIMIT"]), float(os.environ["BUDGET_GB"])
rows = []
grid = os.environ["GRID"]
for split, fn in (("fit", f"lab/grids/{grid}_configs.jsonl"), ("untouched", f"lab/grids/{grid}_untouched_configs.jsonl")):
    rows += [dict(json.loads(l), _file=fn, _sink=f"{out}/r_{split}") for l in open(fn) if l.strip()]
need = lambda r: r["estimate_gb"] * 1.3 + 3.0
t0 = time.time()
queue, running, retry = sorted(rows, key=lambda r: -r["estimate_gb"]), [], []
def launch(r, alone=False):
    sink = r["_sink"] + ("_alone" if alone else "") + f"_{r['id']}.jsonl"
    left = limit - (time.time() - t0)
    p = subprocess.Popen(["timeout", "-k", "5", str(int(max(left, 1))), py, "lab/device/infer_runner.py",
                          "--configs", r["_file"], "--ids", r["id"], "--out", sink],
                         stdout=subprocess.DEVNULL, stderr=open(f"{out}/log_{r['id']}.txt", "a"))
    return (p, r, sink)
while (queue or running) and time.time() - t0 < limit - 20:
    used = sum(need(r) for _, r, _ in running)
    for r in list(queue):
        if (used + need(r) <= budget or not running) and len(running) < 6:
            running.append(launch(r)); used += need(r); queue.remove(r)
    time.sleep(0.5)
    for item in list(running):
        p, r, sink = item
        if p.poll() is not None:
            running.remove(item)
            try:
                res = json.loads(open(sink).read().strip().splitlines()[-1])
                if res.get("oom"):
                    retry.append(r)
            except Exception:
                retry.append(r)
for p, r, _ in running:
    p.wait()
for r in retry:
    if time.time() - t0 > limit - 60:
        break
    p, _, _ = launch(r, alone=True); p.wait()
print(grid, "lanes done", round(time.time() - t0), "s; retried alone:", [r["id"] for r in retry])

#!/usr/bin/env bash
# Issue 29's grid on the device, several rows at once: each row in its own process
# (tools/infer_runner.py --ids), started while the estimated memory of the rows running stays
# under BUDGET_GB of the H200's 141 GB; a row that ran out of memory while others ran is run
# again alone at the end. Memory statistics are per process, so running rows side by side does
# not change what each measures (only their timings, which this grid does not claim).
#   OUT=/some/dir LIMIT=540 bash tools/grid29_lanes_on_device.sh
#   GRID=grid29b BUDGET_GB=40 ...   # another grid drawn by a make_grid29*.py (its two files)
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 OUT PY LIMIT="${LIMIT:-540}" BUDGET_GB="${BUDGET_GB:-120}" GRID="${GRID:-grid29}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" - <<'PYEOF'
import json, os, subprocess, time
out, py = os.environ["OUT"], os.environ["PY"]
limit, budget = float(os.environ["LIMIT"]), float(os.environ["BUDGET_GB"])
rows = []
grid = os.environ["GRID"]
for split, fn in (("fit", f"tools/{grid}_configs.jsonl"), ("untouched", f"tools/{grid}_untouched_configs.jsonl")):
    rows += [dict(json.loads(l), _file=fn, _sink=f"{out}/r_{split}") for l in open(fn) if l.strip()]
need = lambda r: r["estimate_gb"] * 1.3 + 3.0
t0 = time.time()
queue, running, retry = sorted(rows, key=lambda r: -r["estimate_gb"]), [], []
def launch(r, alone=False):
    sink = r["_sink"] + ("_alone" if alone else "") + f"_{r['id']}.jsonl"
    left = limit - (time.time() - t0)
    p = subprocess.Popen(["timeout", "-k", "5", str(int(max(left, 1))), py, "tools/infer_runner.py",
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
PYEOF
ARC=$(mktemp -u /tmp/all.XXXX.tgz)
tar czf "$ARC" -C "$OUT" . ; find "$OUT" -mindepth 1 -delete ; mv "$ARC" "$OUT/all.tgz"
echo "grid29 done"

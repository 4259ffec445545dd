#!/usr/bin/env bash
# Issue 29's pre-registered grid of quantized weights and device_map offload on the device
# (tools/make_grid29c.py drew it). Carry .whl (the slimmed bitsandbytes 0.50.2 wheel).
#   LIMIT=480 OUT=/some/dir bash tools/grid29c_on_device.sh
#   DONE=path/to/grid29c_all.jsonl ...   # rows already measured (a previous call) are skipped
#   CONFIGS="a.jsonl b.jsonl" GRID=grid29d LANES=1 ...   # another grid (outputs named GRID*)
# Rows of both files run one process each, grouped by model and dtype so that each
# random-weight checkpoint is saved once per lane; the results are split again by "split"
# into grid29c.jsonl and grid29c_untouched.jsonl.
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"; export PY
export PYTHONUNBUFFERED=1
SITE=$(mktemp -d)
ls .whl/bitsandbytes-0.50.2-*.whl >/dev/null 2>&1 && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/bitsandbytes-0.50.2-*.whl \
    > "$OUT/pip.log" 2>&1 || echo "pip install failed (see pip.log)"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
GRID="${GRID:-grid29c}"; export GRID
ALL="$OUT/${GRID}_all.jsonl"
[ -n "${DONE:-}" ] && [ -f "$DONE" ] && cp "$DONE" "$ALL"
# Each row in its own process (a process that loaded one model keeps segments reserved that
# the next row's numbers would include), in LANES lanes that split the models between them
# (each lane its own checkpoint folder; at most ~30 GB a row, three lanes fit an 80 GB card).
LANES="${LANES:-3}" LIMIT="${LIMIT:-480}" "$PY" - "$ALL" "$OUT" <<'PYEOF'
import json, os, subprocess, sys, time
all_path, out = sys.argv[1], sys.argv[2]
lanes_n, limit = int(os.environ["LANES"]), float(os.environ["LIMIT"])
files = os.environ.get("CONFIGS", "tools/grid29c_configs.jsonl tools/grid29c_untouched_configs.jsonl")
dev = os.environ.get("DEVICE", "cuda")
rows = [json.loads(l) for f in files.split() for l in open(f) if l.strip()]
done = set()
if os.path.exists(all_path):
    done = {json.loads(l)["id"] for l in open(all_path) if l.strip() and "error" not in json.loads(l)}
rows = [r for r in rows if r["id"] not in done]
rows.sort(key=lambda r: (r["model"], r["precision"], r["id"]))
# whole models to the lane with the least estimated time so far
by_model = {}
for r in rows:
    by_model.setdefault((r["model"], r["precision"]), []).append(r)
lanes = [[] for _ in range(lanes_n)]
load = [0.0] * lanes_n
for key, rs in sorted(by_model.items(), key=lambda kv: -sum(r["estimate_s"] for r in kv[1])):
    k = load.index(min(load))
    lanes[k] += rs
    load[k] += sum(r["estimate_s"] for r in rs)
t0 = time.time()
def start(k):
    if not lanes[k] or time.time() - t0 > limit:
        return None
    r = lanes[k].pop(0)
    one = f"{out}/one_{k}.jsonl"
    open(one, "w").write(json.dumps(r) + "\n")
    env = dict(os.environ, VRAMLAB_CKPT_DIR=f"/tmp/vramlab_ckpt_lane{k}")
    py = os.environ.get("PY", "python3")
    # the random-weight checkpoint is saved by a process of its own: the measured process
    # only loads it, as a user's does
    prep = [py, "-c", "import json, sys; sys.path.insert(0, 'tools'); import infer_runner as ir; "
            "r = json.loads(sys.argv[1]); ('quant' in r or 'device_map' in r) and ir.checkpoint(r, sys.argv[2])",
            json.dumps(r), dev]
    run = [py, "tools/infer_runner.py", "--configs", one, "--out", f"{out}/lane_{k}.jsonl", "--device", dev]
    cmd = " ".join(subprocess.list2cmdline([a]) for a in prep) + " && " + subprocess.list2cmdline(run)
    return subprocess.Popen(["bash", "-c", cmd], env=env,
                            stdout=open(f"{out}/runner_{k}.log", "a"), stderr=subprocess.STDOUT)
procs = [start(k) for k in range(lanes_n)]
while any(procs):
    for k, p in enumerate(procs):
        if p is not None and p.poll() is not None:
            procs[k] = start(k)
    time.sleep(0.5)
with open(all_path, "a") as sink:
    for k in range(lanes_n):
        path = f"{out}/lane_{k}.jsonl"
        if os.path.exists(path):
            sink.write(open(path).read())
            os.remove(path)
        if os.path.exists(f"{out}/one_{k}.jsonl"):
            os.remove(f"{out}/one_{k}.jsonl")
print("rows left unrun:", sum(len(l) for l in lanes), "; lanes took", round(time.time() - t0), "s")
PYEOF
cat "$OUT"/runner_*.log > "$OUT/runner.log" 2>/dev/null; rm -f "$OUT"/runner_*.log
"$PY" - "$ALL" "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
import os
g = os.environ["GRID"]
for split, name in (("fit", f"{g}.jsonl"), ("untouched", f"{g}_untouched.jsonl")):
    with open(f"{sys.argv[2]}/{name}", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["split"] == split)
print(len(rows), "rows measured;", sum(1 for r in rows if "error" in r), "with an error")
PYEOF

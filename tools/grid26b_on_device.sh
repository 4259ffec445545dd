#!/usr/bin/env bash
# Issue 26's second pre-registered grid on the device (tools/make_grid26b.py drew it).
#   PART=ranks    OUT=/some/dir bash tools/grid26b_on_device.sh  # 30 ranks, one process each, 3 lanes
#   PART=captures OUT=/some/dir bash tools/grid26b_on_device.sh  # 12 models: captured on the GPU host and measured
#   PART=caps     OUT=/some/dir bash tools/grid26b_on_device.sh  # max-batch searches under caps
#                 (LANES=1 ONLY="c26b-03 c26b-04": one at a time, on a card under 141 GiB)
# Ranks: FSDP2 / PyTorch ZeRO-1 as rank 0 of a world of N under the fake process group and DDP
# at world 1 under NCCL (crates/device/runners/dist_runner.py), DeepSpeed ZeRO-1/2/3 (crates/device/runners/ds_runner.py, the
# wheels in .whl/ds/). Caps: the grid's 8 new searches and the 6 of tools/grid26_cap_configs.jsonl
# that did not complete in session 11 (three built in fp32 under 24 GiB; three not reached).
# Everything comes back in one archive (the device tool returns a bounded number of files).
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
SITE=$(mktemp -d)
WHEELS=$(ls .whl/bitsandbytes-0.50.2-*.whl .whl/ds/*.whl 2>/dev/null)
[ -n "$WHEELS" ] && { "$PY" -m pip install -q --no-deps --no-compile --target "$SITE" $WHEELS \
    > "$OUT/pip.log" 2>&1 || echo "pip install failed (see pip.log)"; }
export PYTHONPATH="$SITE:$(pwd)/crates/device/runners:$(pwd)/tools${PYTHONPATH:+:$PYTHONPATH}"
export DS_ACCELERATOR=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
LIMIT="${LIMIT:-540}"
export OUT PY LIMIT
case "${PART:-ranks}" in
ranks)
    "$PY" - <<'PYEOF'
import json, os, subprocess, sys, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("tools/grid26b_ranks.jsonl") if l.strip()]
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
PYEOF
    ;;
captures)
    "$PY" - <<'PYEOF'
import json, os, subprocess, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("tools/grid26b_captures.jsonl") if l.strip()]
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
PYEOF
    ;;
caps)
    "$PY" - <<'PYEOF'
import json, os, subprocess, time
out, py, limit = os.environ["OUT"], os.environ["PY"], float(os.environ["LIMIT"])
rows = [json.loads(l) for l in open("tools/grid26b_caps.jsonl") if l.strip()]
again = {"c26-00", "c26-01", "c26-04", "c26-10", "c26-11", "c26-13"}
rows += [json.loads(l) for l in open("tools/grid26_cap_configs.jsonl") if l.strip() and json.loads(l)["grid_id"] in again]
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
PYEOF
    ;;
esac
# archived outside OUT, then moved in (tar of a folder it writes into fails "file changed")
ARC=$(mktemp -u /tmp/all.XXXX.tgz)
tar czf "$ARC" -C "$OUT" . ; find "$OUT" -mindepth 1 -delete ; mv "$ARC" "$OUT/all.tgz"
echo "part ${PART:-ranks} done"

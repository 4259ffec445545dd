#!/usr/bin/env python3
"""lab/run grid29c: the rows of CONFIGS, one process each, in LANES lanes that split the models between
them (each lane its own checkpoint folder). Arguments: the GRID_all.jsonl to append to, the output
folder. Reads LANES, LIMIT, CONFIGS, DEVICE, PY."""
import json, os, subprocess, sys, time
all_path, out = sys.argv[1], sys.argv[2]
lanes_n, limit = int(os.environ["LANES"]), float(os.environ["LIMIT"])
files = os.environ.get("CONFIGS", "lab/grids/grid29c_configs.jsonl lab/grids/grid29c_untouched_configs.jsonl")
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
    prep = [py, "-c", "import json, sys; sys.path.insert(0, 'lab/device'); import infer_runner as ir; "
            "r = json.loads(sys.argv[1]); ('quant' in r or 'device_map' in r) and ir.checkpoint(r, sys.argv[2])",
            json.dumps(r), dev]
    run = [py, "lab/device/infer_runner.py", "--configs", one, "--out", f"{out}/lane_{k}.jsonl", "--device", dev]
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

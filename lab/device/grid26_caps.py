#!/usr/bin/env python3
"""lab/run grid26 caps: issue 26's max-batch searches under caps, two lanes (the 80 GiB caps; the rest),
then the grid's steps an earlier call did not reach. Argument: the output folder. Reads LIMIT, SKIP."""
import json, subprocess, sys, time, os
out = sys.argv[1]
rows = [json.loads(l) for l in open("lab/grids/grid26_cap_configs.jsonl") if l.strip()]
rows = [r for r in rows if r["grid_id"] not in os.environ.get("SKIP", "").split()]
limit = float(os.environ.get("LIMIT", "520"))
t0 = time.time()
lanes = {"a": [r for r in rows if r["cap_gib"] == 80], "b": [r for r in rows if r["cap_gib"] != 80]}
# lane b first measures the grid's steps that the first call did not reach (a crash of a
# shard on an invalid row: gpt2 has 1024 positions, so its seq-2048 rows are dropped)
done = set()
for f in ("tests/data/grid26_lora.jsonl", "tests/data/grid26_lora_untouched.jsonl"):
    if os.path.exists(f):
        done |= {json.loads(l)["grid_id"] for l in open(f) if l.strip()}
rest = [json.loads(l) for f in ("lab/grids/grid26_fit_configs.jsonl", "lab/grids/grid26_untouched_configs.jsonl")
        for l in open(f) if l.strip()]
rest = [r for r in rest if r["grid_id"] not in done and not ("gpt2" in r["model"] and r["seq"] > 1024)]
if rest:
    with open(f"{out}/rest_configs.jsonl", "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rest))
    lanes["b"].insert(0, {"grid_id": "rest"})
procs = {}
def start(lane):
    if not lanes[lane]:
        return None
    r = lanes[lane].pop(0)
    left = limit - (time.time() - t0)
    if left < 20:
        return None
    if r["grid_id"] == "rest":
        return subprocess.Popen(["timeout", "-k", "5", str(int(left)), sys.executable, "crates/device/runners/torch_runner.py",
                                 "measure", f"{out}/rest_configs.jsonl"],
                                stdout=open(f"{out}/rest.jsonl", "w"), stderr=open(f"{out}/rest.log", "w"))
    cfg = {k: v for k, v in r.items() if k not in ("cap_gib",)}
    f = open(f"{out}/cap_{r['grid_id']}.jsonl", "w")
    p = subprocess.Popen(["timeout", "-k", "5", str(int(left)), sys.executable, "crates/device/runners/torch_runner.py", "max-batch",
                          "--config", json.dumps(cfg), "--cap-gib", str(r["cap_gib"]), "--limit", "96"],
                         stdout=f, stderr=open(f"{out}/cap_{r['grid_id']}.log", "w"))
    return p
for lane in lanes:
    procs[lane] = start(lane)
while any(procs.values()):
    for lane, p in list(procs.items()):
        if p is not None and p.poll() is not None:
            procs[lane] = start(lane)
    time.sleep(1)
print("caps done", round(time.time() - t0), "s")
if os.path.exists(f"{out}/rest.jsonl"):
    fo = {"fit": open(f"{out}/grid26_fit_rest.jsonl", "w"), "untouched": open(f"{out}/grid26_untouched_rest.jsonl", "w")}
    for l in open(f"{out}/rest.jsonl"):
        if l.strip():
            fo[json.loads(l).get("split", "fit")].write(l)
    os.remove(f"{out}/rest.jsonl")

#!/usr/bin/env bash
# Issue 26's pre-registered grid on the device (tools/make_grid26.py drew it).
#   PART=steps OUT=/some/dir bash tools/grid26_on_device.sh   # the 72 LoRA/QLoRA steps, 3 shards in parallel
#   PART=caps  OUT=/some/dir bash tools/grid26_on_device.sh   # the 14 max-batch searches under caps
# Rows keep their "grid_id" and "split"; steps come back as one file per split, so the
# untouched third can be set aside without being read. bitsandbytes: the slimmed 0.50.2 wheel
# in .whl/ (see ../shared/STACK.md).
set -u
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
BNB=$(mktemp -d)
"$PY" -m pip install -q --no-deps --target "$BNB" .whl/bitsandbytes-0.50.2-*.whl > "$OUT/bnb_install.log" 2>&1
export PYTHONPATH="$BNB:$(pwd)/crates/device/runners:$(pwd)/tools${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
LIMIT="${LIMIT:-520}"
case "${PART:-steps}" in
steps)
    # parameter counts of the two configs typed for this grid (meta device)
    "$PY" - > "$OUT/grid26_param_counts.jsonl" 2> "$OUT/param_counts.log" <<'PYEOF'
import json, glob, os, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
for p in sorted(glob.glob("tests/data/grid26/configs/*.json")):
    cfg = json.load(open(p))
    for k in ("architectures", "transformers_version", "torch_dtype"):
        cfg.pop(k, None)
    c = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(c)
    print(json.dumps({"config": os.path.basename(p), "class": type(m).__name__,
                      "params": sum(x.numel() for x in m.parameters()),
                      "transformers": transformers.__version__, "torch": torch.__version__}))
PYEOF
    SH=$(mktemp -d)
    cat tools/grid26_fit_configs.jsonl tools/grid26_untouched_configs.jsonl \
        | "$PY" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
big = lambda r: ("7b" in r["model"].lower() or "8b" in r["model"].lower())
rows.sort(key=lambda r: (not big(r), r["grid_id"]))  # the big ones first, dealt round-robin
for i, r in enumerate(rows):
    open(sys.argv[1] + f"/shard{i % 3}.jsonl", "a").write(json.dumps(r) + "\n")
' "$SH"
    for s in 0 1 2; do
        timeout -k 5 "$LIMIT" "$PY" crates/device/runners/torch_runner.py measure "$SH/shard$s.jsonl" > "$SH/out$s.jsonl" 2> "$OUT/shard$s.log" &
    done
    wait
    cat "$SH"/out*.jsonl | "$PY" -c '
import json, sys
out = {"fit": open(sys.argv[1] + "/grid26_fit.jsonl", "w"), "untouched": open(sys.argv[1] + "/grid26_untouched.jsonl", "w")}
n = {"fit": 0, "untouched": 0}
for l in sys.stdin:
    if l.strip():
        r = json.loads(l)
        s = r.get("split", "fit")
        out[s].write(l if l.endswith("\n") else l + "\n")
        n[s] += 1
print("rows", n)
' "$OUT"
    ;;
caps)
    # 24/48 GiB caps two at a time, then the 80 GiB ones two at a time (<= 160 GiB never
    # happens: two 80s are run one after the other beside a 48 at most)
    "$PY" - "$OUT" <<'PYEOF'
import json, subprocess, sys, time, os
out = sys.argv[1]
rows = [json.loads(l) for l in open("tools/grid26_cap_configs.jsonl") if l.strip()]
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
rest = [json.loads(l) for f in ("tools/grid26_fit_configs.jsonl", "tools/grid26_untouched_configs.jsonl")
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
PYEOF
    ;;
esac
# one archive: the device tool brings back a bounded number of files
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . && find "$OUT" -type f ! -name all.tgz -delete
echo "part ${PART:-steps} done"

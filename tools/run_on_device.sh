#!/usr/bin/env bash
# Reference measurements on the GPU machine. Run from the repo root:
#     OUT=/some/dir bash tools/run_on_device.sh
# Writes (JSON lines, one object per config, written as each config finishes so a
# timeout keeps what was done):
#     $OUT/env.json           versions line
#     $OUT/calibration.jsonl  tools/calibration_configs.jsonl
#     $OUT/holdout.jsonl      tools/holdout_configs.jsonl
#     $OUT/maxbatch.jsonl     max-batch searches under --cap-gib 24 (trials + a final {"max_batch": N} line)
#     $OUT/*.log              stderr of each part
# Every part runs under `timeout`; with the defaults the whole script ends within 9 minutes.
# Override with T_CAL / T_HOLD / T_MAX (seconds), CAL / HOLD (config files), PYTHON.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
CAL="${CAL:-tools/calibration_configs.jsonl}"
HOLD="${HOLD:-tools/holdout_configs.jsonl}"
T_CAL="${T_CAL:-320}"     # calibration: most of the time
T_HOLD="${T_HOLD:-110}"   # holdouts
T_MAX="${T_MAX:-28}"      # each of the 3 max-batch searches
export PYTHONUNBUFFERED=1
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }

echo "== versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
timeout 30 "$PY" crates/device/runners/torch_runner.py --env 2> "$OUT/env.log" | tee "$OUT/env.json"

echo "== calibration ($(wc -l < "$CAL") configs, timeout ${T_CAL}s) at $(elapsed)s"
timeout -k 5 "$T_CAL" "$PY" crates/device/runners/torch_runner.py measure "$CAL" > "$OUT/calibration.jsonl" 2> "$OUT/calibration.log"
echo "   rc=$? lines=$(wc -l < "$OUT/calibration.jsonl") at $(elapsed)s"

echo "== holdout ($(wc -l < "$HOLD") configs, timeout ${T_HOLD}s) at $(elapsed)s"
timeout -k 5 "$T_HOLD" "$PY" crates/device/runners/torch_runner.py measure "$HOLD" > "$OUT/holdout.jsonl" 2> "$OUT/holdout.log"
echo "   rc=$? lines=$(wc -l < "$OUT/holdout.jsonl") at $(elapsed)s"

echo "== max-batch under --cap-gib 24 (timeout ${T_MAX}s each) at $(elapsed)s"
: > "$OUT/maxbatch.jsonl"
: > "$OUT/maxbatch.log"
for cfg in \
    '{"model": "resnet50", "precision": "fp32", "optimizer": "adamw"}' \
    '{"model": "gpt2", "precision": "amp-bf16", "optimizer": "adamw", "attention": "sdpa"}' \
    '{"model": "TinyLlama-1.1B", "precision": "bf16", "optimizer": "adamw", "attention": "sdpa"}'; do
    timeout -k 5 "$T_MAX" "$PY" crates/device/runners/torch_runner.py max-batch --config "$cfg" --cap-gib 24 \
        >> "$OUT/maxbatch.jsonl" 2>> "$OUT/maxbatch.log"
    echo "   rc=$? $cfg at $(elapsed)s"
done

echo "== summary at $(elapsed)s"
"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
GiB = 2 ** 30
def rows(name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return []
    r = []
    for line in open(p):
        try:
            r.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return r
for name in ("calibration.jsonl", "holdout.jsonl"):
    r = rows(name)
    ok = [x for x in r if x.get("oom") is False]
    oom = [x for x in r if x.get("oom") is True]
    err = [x for x in r if "error" in x]
    print(f"{name}: {len(r)} lines, {len(ok)} measured, {len(oom)} OOM, {len(err)} errors")
    for x in r:
        tag = "ERROR " + x["error"][:80] if "error" in x else ("OOM" if x.get("oom") else "")
        peak = x.get("peak_allocated")
        print(f"  {x.get('index', '?'):>3} {x.get('model_id', x.get('model', '?')):<20} b={x.get('batch', '?'):<4} "
              f"{x.get('precision', ''):<8} {x.get('optimizer', ''):<12} acc={x.get('accum', '')} "
              f"ckpt={int(bool(x.get('checkpointing')))} {x.get('attention', '') if x.get('seq') else '':<5} "
              f"peak={peak / GiB if peak else 0:7.2f} GiB  step={x.get('step_ms') or 0:8.1f} ms {tag}")
for x in rows("maxbatch.jsonl"):
    if "max_batch" in x:
        print(f"max-batch {json.dumps(x.get('config'))} cap={x.get('cap_gib')} GiB -> {x.get('max_batch')} "
              f"(first OOM {x.get('first_oom_batch')}, {x.get('trials')} trials) {x.get('error', '')}")
EOF
echo "== done in $(elapsed)s; files in $OUT"

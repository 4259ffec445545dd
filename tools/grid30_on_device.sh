#!/usr/bin/env bash
# Issue 30's pre-registered grid on the device (tools/make_grid30.py drew it; NOT MEASURED YET).
#   OUT=/some/dir bash tools/grid30_on_device.sh
# The 60 training steps of olmo2, granite, starcoder2, smollm3 and falcon (layer-cut public
# configs in tests/data/hf_configs_device/), 3 shards in parallel on one H200 (every row's
# rough estimate is <= 60 GB; see make_grid30.py), then the parameter counts of the configs on
# the meta device. Rows keep their "grid_id" and "split"; they come back as one file per
# split (grid30_fit.jsonl, grid30_untouched.jsonl), so the untouched third can be set aside
# without being read. Needs PyTorch 2.11 and transformers 5.17 (the runner's environment).
# Then, on the workstation:
#   cp $OUT/grid30_fit.jsonl tests/data/grid30.jsonl
#   vramlab validate tests/data/grid30.jsonl
# GRID=grid30_moe runs the MoE types' grid instead (deepseek_v3, gpt_oss: tools/make_grid30_moe.py,
# tools/grid30_moe_*configs.jsonl, outputs grid30_moe_*.jsonl); the default is GRID=grid30.
set -u
export GRID="${GRID:-grid30}"
cd "${REPO_ROOT:-$(dirname "$0")/..}"
OUT="${OUT:-./device_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)/crates/device/runners:$(pwd)/tools${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
"$PY" crates/device/runners/torch_runner.py --env > "$OUT/env.json" 2>/dev/null
LIMIT="${LIMIT:-540}"
S=$(date +%s)
# parameter counts of the layer-cut configs (meta device), beside the rows
"$PY" - > "$OUT/${GRID}_param_counts.jsonl" 2> "$OUT/param_counts.log" <<'PYEOF'
import json, glob, os, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
grid = os.environ["GRID"]
rows = [json.loads(l) for f in (f"tools/{grid}_configs.jsonl", f"tools/{grid}_untouched_configs.jsonl")
        for l in open(f) if l.strip()]
for p in sorted({r["model"] for r in rows}):
    cfg = json.load(open(p))
    for k in ("architectures", "transformers_version", "torch_dtype", "_vramlab_source",
              "quantization_config"):
        cfg.pop(k, None)
    c = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(c)
    print(json.dumps({"config": os.path.basename(p), "class": type(m).__name__,
                      "params": sum(x.numel() for x in m.parameters()),
                      "transformers": transformers.__version__, "torch": torch.__version__}))
PYEOF
# One process per row, several at once under a memory budget (tools/grid_sched.py), biggest
# rows first; rows already in tests/data/grid30/ (an earlier call) are skipped, and a call cut
# short keeps the rows it finished.
"$PY" tools/grid_sched.py "$OUT" "tools/${GRID}_configs.jsonl" "tools/${GRID}_untouched_configs.jsonl" \
    --prefix "$GRID" --deadline "$LIMIT" --par "${PAR:-3}" \
    --skip "tests/data/grid30/${GRID}_fit.jsonl" "tests/data/grid30/${GRID}_untouched.jsonl" 2> "$OUT/sched.log"
echo "$GRID done in $(( $(date +%s) - S ))s"
# one archive: the device tool brings back a bounded number of files
# (archived outside OUT, then moved in: a tar of the folder it writes into fails "file changed")
ARC=$(mktemp -u /tmp/all.XXXX.tgz)
tar czf "$ARC" -C "$OUT" . ; find "$OUT" -mindepth 1 -delete ; mv "$ARC" "$OUT/all.tgz"

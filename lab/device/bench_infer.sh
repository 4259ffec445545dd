#!/usr/bin/env bash
# Issue 29's interface line on a GPU: `vramlab bench --engine torch --step generate|prefill`
# (the shipped crates/device/runners/infer_runner.py, one fresh process per trial, measured
# against the inference plan). Three small calls, about a minute on an H100 / H200:
#   gen   Qwen2.5-0.5B's config.json, generate, bf16, sdpa, dynamic cache, prompt 512 + 32 new,
#         batches 1 and 8
#   pre   the same model, prefill (a no_grad forward), prompt 1024, batches 1 and 8
#   stat  TinyLlama-1.1B (a built-in preset: the runner rebuilds its LlamaConfig), generate
#         with a static cache, prompt 256 + 16 new, batch 4
# Each writes $OUT/NAME.json (`--json`: the run record, every trial measured and predicted)
# and $OUT/NAME.err (stderr and the exit code); the tables are printed at the end.
#     OUT=dir bash lab/device/bench_infer.sh      (carry .device/vramlab, a release build)
set -u
OUT=${OUT:-/tmp/bench_infer}
BIN=${VRAMLAB:-.device/vramlab}
mkdir -p "$OUT"
chmod +x "$BIN" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.csv"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tee "$OUT/versions.txt"
"$BIN" --version | tee -a "$OUT/versions.txt"
QWEN=tests/data/hf_configs/Qwen2.5-0.5B.json
bench() {  # NAME ARGS...
    local name=$1
    shift
    local t0=$SECONDS
    timeout 150 "$BIN" bench --engine torch --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "rc=$? (${name}: $((SECONDS - t0)) s)" | tee -a "$OUT/$name.err"
}
bench gen --model "$QWEN" --step generate --seq 512 --new-tokens 32 --precision bf16 --batch 1,8
bench pre --model "$QWEN" --step prefill --seq 1024 --precision bf16 --batch 1,8
bench stat --model TinyLlama-1.1B --step generate --seq 256 --new-tokens 16 --kv-cache static \
    --precision bf16 --batch 4
python3 - "$OUT" <<'EOF'
import json, os, sys

out = sys.argv[1]
gib = lambda b: "—" if b is None else f"{b / 2**30:.3f}"
pct = lambda m, p: "—" if not m or p is None else f"{100 * (p - m) / m:+.2f}%"
pct_ran = pct
for name in ("gen", "pre", "stat"):
    path = os.path.join(out, f"{name}.json")
    try:
        with open(path) as f:
            run = json.loads(f.read().strip().splitlines()[-1])
    except Exception as e:
        print(f"\n{name}: no run ({e}); see {name}.err:")
        print(open(os.path.join(out, f"{name}.err")).read()[-1500:])
        continue
    inf = run.get("inference") or {}
    print(f"\n{name}: {run['model']} · {inf.get('step')} · prompt {inf.get('prompt')} + "
          f"{inf.get('new_tokens')} · {inf.get('precision')} · {inf.get('kv_cache')} · "
          f"{run['device']['name']} · predicted max batch {run.get('predicted_max_batch')}")
    print(f"{'batch':>6} {'outcome':>8} {'alloc':>8} {'pred':>8} {'err':>8}  {'reserved':>8} "
          f"{'pred':>8} {'err':>8}  {'process':>8} {'pred.smi':>8} {'err':>8} {'ms':>8}")
    for t in run["trials"]:
        pct = pct_ran
        p = t.get("predicted") or {}
        o = t["outcome"]["kind"]
        if o != "ran":  # the peaks before an OOM are no prediction's error
            pct = lambda m, p: "—"
        print(f"{t['batch']:>6} {o:>8} {gib(t.get('peak_allocated')):>8} {gib(p.get('allocated')):>8} "
              f"{pct(t.get('peak_allocated'), p.get('allocated')):>8}  {gib(t.get('peak_reserved')):>8} "
              f"{gib(p.get('reserved')):>8} {pct(t.get('peak_reserved'), p.get('reserved')):>8}  "
              f"{gib(t.get('process_bytes')):>8} {gib(p.get('nvidia_smi')):>8} "
              f"{pct(t.get('process_bytes'), p.get('nvidia_smi')):>8} {t.get('step_ms') or '—':>8}")
        if o != "ran":
            print("       ", (t["outcome"].get("message") or "")[:300])
    if run.get("stopped"):
        print("stopped:", run["stopped"])
EOF
ls -la "$OUT"

#!/usr/bin/env bash
# Captures (fake tensors, fake CUDA device) AND measures for real on CUDA the models of
# tests/data/captured.jsonl, in parallel (memory statistics are per process). Run on the
# GPU machine from a folder holding capture.py, capture_example_model.py and the HF configs:
#   OUT=/some/dir bash capture_on_device.sh
# Writes $OUT/measured.jsonl (one row per model and measured batch), $OUT/versions.json,
# $OUT/graphs.tgz (g/*.vramlab-graph.json, logs).
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p g m log
python3 - > "$OUT/versions.json" <<'PY'
import json, subprocess, torch, timm, torchvision, transformers
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps({"device": torch.cuda.get_device_name(0), "nvidia_smi": smi, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "timm": timm.__version__, "torchvision": torchvision.__version__,
                  "transformers": transformers.__version__}))
PY
cat > jobs.txt <<'J'
swin_t|--timm swin_tiny_patch4_window7_224|8,32
deit_s|--timm deit_small_patch16_224|8,32
deit_s_trainer|--timm deit_small_patch16_224 --loop trainer|8,32
deit_s_ckpt|--timm deit_small_patch16_224 --checkpointing|8,32
convnextv2_t|--timm convnextv2_tiny|8,32
regnety_016|--timm regnety_016|8,32
regnety_016_fp32|--timm regnety_016 --precision fp32|8,32
effnetv2_t|--timm efficientnetv2_rw_t|8,32
maxvit_t|--timm maxvit_tiny_tf_224|8,32
coatnet_0|--timm coatnet_0_rw_224|8,32
mixer_s16|--timm mixer_s16_224|8,32
vit_b16|--timm vit_base_patch16_224|8,32
deeplabv3_mnv3|--torchvision deeplabv3_mobilenet_v3_large --image 256|4,16
oddnet|--module capture_example_model.py:build --image 160|8,32
oddnet_trainer|--module capture_example_model.py:build --image 160 --loop trainer|8,32
poolformer_s12|--timm poolformer_s12|8,32
mobilevit_s|--timm mobilevit_s --image 256|8,32
lraspp_mnv3|--torchvision lraspp_mobilenet_v3_large --image 256|4,16
qwen3_06b|--hf Qwen3-0.6B.json --seq 512 --batches 2,3,4|2,8
qwen25_05b|--hf Qwen2.5-0.5B.json --seq 512 --batches 2,3,4|2,8
qwen25_05b_trainer|--hf Qwen2.5-0.5B.json --seq 512 --batches 2,3,4 --loop trainer|2,8
J
run_one() {
  IFS='|' read -r name args meas <<< "$1"
  timeout 170 python3 capture.py $args -o "g/$name.vramlab-graph.json" \
    --measure "$meas" --measure-out "m/$name.jsonl" > "log/$name.log" 2>&1
  echo "$name rc=$?"
}
export -f run_one
t0=$(date +%s)
xargs -P 11 -I{} bash -c 'run_one "$@"' _ {} < jobs.txt
echo "all done in $(( $(date +%s) - t0 )) s"
cat m/*.jsonl > "$OUT/measured.jsonl"
tar czf "$OUT/graphs.tgz" g log
ls -la "$OUT"

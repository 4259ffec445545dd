#!/usr/bin/env python3
"""Pre-registered device grid for the Lightning loop shape (issue 31: the Lightning callback
measured +8 % over a plan made with loop="trainer"). Lightning's automatic optimization runs
`training_step`, then `zero_grad`, then `backward` (lightning 2.x
loops/optimization/automatic.py, `Closure.closure`), so the previous step's gradients live
through the forward; `loop: "lightning"` in crates/device/runners/torch_runner.py runs that
order, and `vramlab plan --loop lightning` plans it.

Drawn at random with a fixed seed BEFORE any row was measured, committed as drawn. A random
third (lab/grids/grid31_lightning_untouched_configs.jsonl) is measured but not looked at while
the planner is fixed; its errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid31_lightning.py [path/to/vramlab]   # writes the two files

Axes: model (GPT-2, Qwen2.5-0.5B and TinyLlama-1.1B from their configs, ResNet-50, ViT-B/16),
precision (fp32, amp-bf16, amp-fp16 with GradScaler, bf16), checkpointing, accumulation
(1, 2), optimizer (AdamW, Adam), batch and sequence / image size. Each row's estimate (for
the scheduler only) is vramlab's planned nvidia-smi figure, and a draw planned over 40 GB is
drawn again (rows run three at a time on one GPU).
"""
import json
import os
import random
import subprocess
import sys

SEED = 31_2026_12_05
N_ROWS = 15
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LMS = {
    "gpt2": "gpt2",
    "qwen2.5-0.5b": "tests/data/hf_configs/Qwen2.5-0.5B.json",
    "tinyllama": "tests/data/grid26/configs/TinyLlama-1.1B.json",
}
VISION = {"resnet50": [16, 32, 64], "vit_b_16": [8, 16, 32]}
PRECISIONS = ["fp32", "amp-bf16", "amp-fp16", "bf16"]


def planned_gb(vramlab, row):
    args = [vramlab, "plan", "--model", row["model"], "--batch", str(row["batch"]),
            "--precision", row["precision"], "--optimizer", row["optimizer"],
            "--accum", str(row["accum"]), "--loop", "lightning", "--gpu", "h100", "--json"]
    if "seq" in row:
        args += ["--seq", str(row["seq"])]
    if row["checkpointing"]:
        args.append("--checkpointing")
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if out.returncode not in (0, 3):
        raise SystemExit(f"{row}: {out.stderr}")
    return json.loads(out.stdout)["nvidia_smi_bytes"] / 1e9


def main():
    vramlab = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "vramlab")
    rng = random.Random(SEED)
    rows = []
    while len(rows) < N_ROWS:
        vision = rng.random() < 0.3
        if vision:
            name = rng.choice(sorted(VISION))
            row = {"model": name, "batch": rng.choice(VISION[name])}
        else:
            name = rng.choice(sorted(LMS))
            row = {"model": LMS[name], "batch": rng.choice([1, 2, 4, 8]),
                   "seq": rng.choice([256, 512, 1024])}
        row.update(precision=rng.choice(PRECISIONS), optimizer=rng.choice(["adamw", "adam"]),
                   accum=rng.choice([1, 1, 2]), checkpointing=rng.random() < 0.4,
                   attention="sdpa", loop="lightning")
        gb = planned_gb(vramlab, row)
        if gb > 40:
            continue
        row["estimate_gb"] = round(gb, 1)
        rows.append(row)
    untouched = set(rng.sample(range(N_ROWS), N_ROWS // 3))
    fit, held = [], []
    for i, r in enumerate(rows):
        r["grid_id"] = f"g31l-{i:02d}"
        r["split"] = "untouched" if i in untouched else "fit"
        (held if i in untouched else fit).append(r)
    for name, part in (("grid31_lightning_configs.jsonl", fit),
                       ("grid31_lightning_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

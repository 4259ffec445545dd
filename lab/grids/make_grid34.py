#!/usr/bin/env python3
"""Pre-registered grid for issue 26, session 34: training steps as a user runs them, each
alone in a fresh process.

Why: 871 of the 1 050 rows in tests/data ran after other configurations in the same runner
process (`index` > 0), where the cuBLAS workspaces an earlier configuration made, and the
segments they sit in, were already in the pool; a user's training script starts fresh. The
planner's reserved error on the two kinds of process differs (docs/accuracy.md, "Most measured
rows did not start in a fresh process"), and the fresh rows so far were chosen as the rows a
patch moved most, not at random. This grid is drawn at random over the axes users combine,
committed BEFORE any of it was measured or planned, and a random third is set aside untouched:
measured, not looked at while the planner is fixed, quoted once at the end as it came out.

    python3 lab/grids/make_grid34.py    # writes lab/grids/grid34_fresh_configs.jsonl and
                                        # lab/grids/grid34_fresh_untouched_configs.jsonl

Axes: model (GPT-2 to 8B, the grid26 models), fine-tuning mode (full for models up to 1.2 B
parameters, LoRA, QLoRA), LoRA rank / targets / dropout, precision (fp32, AMP bf16, AMP fp16
with GradScaler for LoRA and full, pure bf16; QLoRA in fp32 without autocast), optimizer,
checkpointing (off, non-reentrant, reentrant), loop shape, batch x sequence, accumulation.
LoRA and QLoRA rows are drawn by make_grid26.draw_step (the same axes and weights).

The constraint (fixed before drawing; a draw that breaks it is drawn again): the rows run two
at a time on an H100 (78 GiB) or H200, so make_grid26's tokens per micro-batch (<= 16384 below
1B parameters, <= 8192 up to 4B, <= 4096 at 7-8B, <= 2048 at 7-8B with fp32 base weights), and
full fine-tuning only on the small and mid models up to 1.2 B parameters with tokens <= 8192.
lab/device/session34.sh runs them (`torch_runner.py measure --config`, one process per row).
"""
import importlib.util
import json
import os
import random

SEED = 34_2026_12_07
HERE = os.path.dirname(os.path.abspath(__file__))

_spec = importlib.util.spec_from_file_location("make_grid26", os.path.join(HERE, "make_grid26.py"))
g26 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(g26)

FULL_MODELS = [  # (path, weight): up to 1.2 B parameters, so AdamW's fp32 state fits beside one more row
    ("presets/models/gpt2.json", 1.0),
    ("presets/models/gpt2-medium.json", 0.8),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", 1.0),
    ("tests/data/hf_configs/Qwen3-0.6B.json", 1.0),
    ("tests/data/grid26/configs/TinyLlama-1.1B.json", 1.0),
    ("tests/data/hf_configs/Llama-3.2-1B.json", 1.0),
]


def draw_full(rng):
    while True:
        path = g26.pick(rng, [m[0] for m in FULL_MODELS], [m[1] for m in FULL_MODELS])
        batch = g26.pick(rng, [1, 2, 4, 8, 16])
        seq = g26.pick(rng, [256, 512, 1024, 2048])
        if batch * seq > 8192:
            continue
        ckpt = g26.pick(rng, ["off", "on", "reentrant"], [0.4, 0.4, 0.2])
        row = {
            "model": path,
            "batch": batch,
            "seq": seq,
            "precision": g26.pick(rng, ["amp-bf16", "bf16", "amp-fp16", "fp32"], [0.4, 0.25, 0.15, 0.2]),
            "optimizer": g26.pick(rng, ["adamw", "adamw-8bit", "sgd-momentum"], [0.7, 0.15, 0.15]),
            "accum": g26.pick(rng, [1, 2, 4], [0.6, 0.25, 0.15]),
            "checkpointing": ckpt != "off",
            "attention": "sdpa",
            "loop": g26.pick(rng, ["plain", "trainer"]),
            "finetune": "full",
        }
        if ckpt == "reentrant":
            row["checkpoint_reentrant"] = True
        return row


def main():
    rng = random.Random(SEED)
    rows = []
    for _ in range(36):
        if g26.pick(rng, ["full", "adapters"], [0.35, 0.65]) == "full":
            rows.append(draw_full(rng))
        else:
            rows.append(g26.draw_step(rng))
    untouched = set(rng.sample(range(len(rows)), len(rows) // 3))
    for i, r in enumerate(rows):
        r["grid_id"] = f"f34-{i:02d}"
        r["split"] = "untouched" if i in untouched else "fit"

    def write(name, part):
        with open(os.path.join(HERE, name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")

    write("grid34_fresh_configs.jsonl", [r for r in rows if r["split"] == "fit"])
    write("grid34_fresh_untouched_configs.jsonl", [r for r in rows if r["split"] == "untouched"])


if __name__ == "__main__":
    main()

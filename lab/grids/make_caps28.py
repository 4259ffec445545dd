#!/usr/bin/env python3
"""Pre-registered capped max-batch searches for issue 26, session 28: drawn at random with a fixed
seed after the session's allocation-order changes (LlamaRMSNorm, dropout, the frames' references)
were made and BEFORE any of these was measured or planned, committed as drawn. Every row is
untouched: nothing is fixed against them; they are quoted once, as they came out.

    python3 lab/grids/make_caps28.py     # writes lab/grids/caps28_configs.jsonl (deterministic)

Axes: model (small and mid sizes, so that a search runs in about a minute on one GPU), LoRA or
QLoRA, rank, targets, dropout, checkpointing, precision, loop shape, sequence, and the cap of a
common small card (12, 16 or 24 GiB). Run by `lab/device/session28b.sh`: each search in its own
process (`torch_runner.py max-batch`), then the answer and the batch above it alone in fresh
processes.
"""
import json
import os
import random

SEED = 28_2026_12_07
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = [
    "presets/models/gpt2.json",
    "tests/data/hf_configs/Qwen2.5-0.5B.json",
    "tests/data/hf_configs/Qwen3-0.6B.json",
    "tests/data/grid26/configs/TinyLlama-1.1B.json",
    "tests/data/hf_configs/Llama-3.2-1B.json",
]


def draw(rng, i):
    ft = rng.choice(["lora", "lora", "qlora"])
    if ft == "lora":
        precision = rng.choice(["bf16", "amp-bf16", "bf16"])
    else:
        precision = rng.choice(["fp32", "amp-bf16", "bf16"])
    model = rng.choice(MODELS)
    # GPT-2 has 1024 positions.
    seqs = [512, 1024] if "gpt2" in model else [512, 1024, 2048]
    row = {
        "model": model,
        "seq": rng.choice(seqs),
        "precision": precision,
        "optimizer": "adamw",
        "accum": 1,
        "checkpointing": rng.random() < 0.6,
        "attention": "sdpa",
        "loop": rng.choice(["plain", "trainer"]),
        "cap_gib": rng.choice([12, 16, 24]),
        "finetune": ft,
        "lora_rank": rng.choice([8, 16, 64]),
        "lora_targets": rng.choice(["attn", "all-linear"]),
        "lora_dropout": rng.choice([0.0, 0.05, 0.1]),
    }
    if ft == "qlora":
        row["quant"] = "nf4"
        row["double_quant"] = True
    row["grid_id"] = f"c28-{i:02d}"
    row["split"] = "untouched"
    return row


def main():
    rng = random.Random(SEED)
    rows = [draw(rng, i) for i in range(8)]
    with open(os.path.join(ROOT, "lab/grids/caps28_configs.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

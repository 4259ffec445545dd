#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 26 (fine-tuning steps and max batch under caps).

Drawn at random with a fixed seed BEFORE any of it was measured or planned, committed as
drawn; the rows with `"split": "untouched"` (a random third) are measured but not looked at
while fixing the planner: their results go to tests/data/grid26/*untouched*.jsonl and are
quoted once, at the end, as they came out.

    python3 lab/grids/make_grid26.py     # writes lab/grids/grid26_*.jsonl (deterministic)

Axes users combine (LoRA / QLoRA): model family and size, fine-tuning mode, rank, targets,
dropout, checkpointing (non-reentrant and reentrant), precision (fp32-without-autocast
QLoRA, fp16 with GradScaler), loop shape, batch, sequence, accumulation, optimizer.
The one constraint (fixed before drawing, so the rows fit on one H200 beside two other
processes): tokens per micro-batch <= 16384 below 1B parameters, <= 8192 up to 4B, <= 4096
for 7-8B models, and <= 2048 for 7-8B models whose base weights stay in fp32 (lora in
fp32 / amp). A draw that breaks it is drawn again.
"""
import json
import os
import random

SEED = 26_2026_12_04
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = [  # (path, size class, weight)
    ("presets/models/gpt2.json", "small", 1.0),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", "small", 1.0),
    ("tests/data/hf_configs/Qwen3-0.6B.json", "small", 1.0),
    ("tests/data/grid26/configs/TinyLlama-1.1B.json", "mid", 1.5),
    ("tests/data/hf_configs/Llama-3.2-1B.json", "mid", 1.0),
    ("tests/data/hf_configs/gemma-2-2b.json", "mid", 0.7),
    ("tests/data/hf_configs/Phi-3-mini-4k-instruct.json", "mid", 0.8),
    ("tests/data/grid26/configs/Llama-2-7b-hf.json", "large", 1.3),
    ("tests/data/hf_configs/Mistral-7B-v0.3.json", "large", 1.3),
    ("tests/data/hf_configs/Qwen2.5-7B.json", "large", 0.8),
    ("tests/data/hf_configs/Llama-3.1-8B.json", "large", 0.8),
]
TOKENS = {"small": 16384, "mid": 8192, "large": 4096}


def pick(rng, items, weights=None):
    return rng.choices(items, weights=weights, k=1)[0]


def draw_step(rng, forced_precision=None):
    while True:
        path, size, _ = pick(rng, MODELS, [m[2] for m in MODELS])
        ft = "lora" if forced_precision else pick(rng, ["lora", "qlora"], [0.55, 0.45])
        if forced_precision:
            precision = forced_precision
            optimizer = "adamw"
        elif ft == "lora":
            precision = pick(rng, ["amp-bf16", "bf16", "amp-fp16", "fp32"], [0.35, 0.35, 0.15, 0.15])
            optimizer = pick(rng, ["adamw", "adamw-8bit"], [0.85, 0.15])
        else:
            precision = pick(rng, ["fp32", "amp-bf16", "bf16"], [0.35, 0.4, 0.25])
            optimizer = pick(rng, ["adamw", "paged-adamw-8bit"], [0.7, 0.3])
        ckpt = pick(rng, ["off", "on", "reentrant"], [0.4, 0.4, 0.2])
        batch = pick(rng, [1, 2, 4, 8, 16])
        seq = pick(rng, [256, 512, 1024, 2048])
        limit = TOKENS[size]
        if size == "large" and ft == "lora" and precision != "bf16":
            limit = 2048
        if batch * seq > limit:
            continue
        row = {
            "model": path,
            "batch": batch,
            "seq": seq,
            "precision": precision,
            "optimizer": optimizer,
            "accum": pick(rng, [1, 2, 4], [0.6, 0.25, 0.15]),
            "checkpointing": ckpt != "off",
            "attention": "sdpa",
            "loop": pick(rng, ["plain", "trainer"]),
            "finetune": ft,
            "lora_rank": pick(rng, [8, 16, 32, 64]),
            "lora_targets": pick(rng, ["attn", "all-linear"]),
            "lora_dropout": pick(rng, [0.0, 0.05, 0.1]),
        }
        if ckpt == "reentrant":
            row["checkpoint_reentrant"] = True
        if ft == "qlora":
            row["quant"] = "nf4"
            row["double_quant"] = pick(rng, [True, False], [0.8, 0.2])
        return row


CAP_MODELS = [
    ("presets/models/gpt2.json", "small"),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", "small"),
    ("tests/data/grid26/configs/TinyLlama-1.1B.json", "mid"),
    ("tests/data/hf_configs/Llama-3.2-1B.json", "mid"),
    ("tests/data/grid26/configs/Llama-2-7b-hf.json", "large"),
    ("tests/data/hf_configs/Mistral-7B-v0.3.json", "large"),
    ("tests/data/hf_configs/Qwen2.5-7B.json", "large"),
]


def draw_cap(rng, forced_ft=None):
    """A max-batch search under a cap (usable memory of a 24, 48 or 80 GB card)."""
    path, size = pick(rng, CAP_MODELS)
    ft = forced_ft or pick(rng, ["lora", "qlora", "full"], [0.4, 0.4, 0.2])
    if ft == "full" and size == "large":
        ft = "lora"
    if ft == "lora":
        precision = "bf16" if size == "large" else pick(rng, ["amp-bf16", "bf16"])
    elif ft == "qlora":
        precision = pick(rng, ["fp32", "amp-bf16", "bf16"])
    else:
        precision = pick(rng, ["amp-bf16", "bf16", "fp32"])
    row = {
        "model": path,
        "seq": pick(rng, [512, 1024, 2048]),
        "precision": precision,
        "optimizer": "adamw",
        "accum": 1,
        "checkpointing": True if forced_ft else pick(rng, [True, False]),
        "attention": "sdpa",
        "loop": "plain",
        "cap_gib": pick(rng, [24, 48, 80]),
    }
    if ft != "full":
        row.update({"finetune": ft, "lora_rank": pick(rng, [8, 16, 64]),
                    "lora_targets": pick(rng, ["attn", "all-linear"]), "lora_dropout": 0.05})
        if ft == "qlora":
            row.update({"quant": "nf4", "double_quant": True})
    return row


def main():
    rng = random.Random(SEED)
    steps = [draw_step(rng) for _ in range(66)]
    # The 66 free draws happened to hold no amp-fp16 row (p about 0.5 %): six more LoRA rows
    # with fp16 autocast and GradScaler, drawn on the same stream before any split or run.
    steps += [draw_step(rng, "amp-fp16") for _ in range(6)]
    untouched = set(rng.sample(range(len(steps)), len(steps) // 3))
    for i, s in enumerate(steps):
        s["grid_id"] = f"g26-{i:02d}"
        s["split"] = "untouched" if i in untouched else "fit"
    caps = [draw_cap(rng, "lora"), draw_cap(rng, "lora"), draw_cap(rng, "qlora"), draw_cap(rng, "qlora")]
    caps += [draw_cap(rng) for _ in range(10)]
    for i, c in enumerate(caps):
        c["grid_id"] = f"c26-{i:02d}"
    def write(name, rows):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    write("grid26_fit_configs.jsonl", [s for s in steps if s["split"] == "fit"])
    write("grid26_untouched_configs.jsonl", [s for s in steps if s["split"] == "untouched"])
    write("grid26_cap_configs.jsonl", caps)


if __name__ == "__main__":
    main()

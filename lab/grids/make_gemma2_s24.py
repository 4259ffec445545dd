#!/usr/bin/env python3
"""Session 24's check of Gemma 2 under SDPA (issue 26): training steps drawn at random over
the axes users combine, written before any of them is measured. Gemma 2's attention soft-cap
is eager's only (transformers 5.17's SDPA drops it); the planner plans SDPA steps as SDPA since
session 24. Every row is SDPA. A random third is set aside ("untouched"). Full fine-tuning uses
the 3-layer cut of Gemma-2-2B (tests/data/hf_configs_device/gemma-2-2b-L3.json); LoRA and QLoRA
the whole Gemma-2-2B. At most 4096 tokens a step (three rows share an 80 GB card).

    python3 lab/grids/make_gemma2_s24.py > lab/grids/gemma2_s24_configs.jsonl
"""
import json, random

rng = random.Random(2024_12_06)
rows = []
for i in range(9):
    ft = rng.choice(["full", "lora", "qlora"])
    precision = rng.choice(["fp32", "amp-bf16", "bf16"])
    seq = rng.choice([256, 512, 1024, 2048])
    batch = rng.choice([b for b in (1, 2, 4, 8) if b * seq <= 4096])
    r = {
        "model": "tests/data/hf_configs_device/gemma-2-2b-L3.json" if ft == "full"
        else "tests/data/hf_configs/gemma-2-2b.json",
        "batch": batch, "seq": seq, "precision": precision,
        "optimizer": rng.choice(["adamw", "adamw-8bit"]) if ft != "full" else "adamw",
        "accum": 1, "checkpointing": rng.choice([False, True]), "attention": "sdpa",
        "loop": rng.choice(["plain", "trainer"]), "finetune": ft,
    }
    if ft != "full":
        r.update(lora_rank=rng.choice([8, 16, 64]), lora_targets=rng.choice(["attn", "all-linear"]),
                 lora_dropout=rng.choice([0.0, 0.05]))
    if ft == "qlora":
        r.update(quant="nf4", double_quant=rng.choice([True, False]))
    r["grid_id"] = f"gm24-{i:02d}"
    rows.append(r)
untouched = set(rng.sample(range(len(rows)), len(rows) // 3))
for i, r in enumerate(rows):
    r["split"] = "untouched" if i in untouched else "fit"
    print(json.dumps(r))

#!/usr/bin/env python3
"""Pre-registered measurement grid for Gemma 2 inference (session 25: the planner stopped
refusing it; the attention soft-cap is eager attention's only, SDPA drops it).

Drawn at random with a fixed seed BEFORE any of it was measured, committed as drawn. The rows
in lab/grids/gemma2_infer_s25_untouched_configs.jsonl (a random third) are measured but not
looked at while the planner is fixed; their errors are quoted once, as they came out.

    python3 lab/grids/make_gemma2_infer_s25.py
    CONFIGS="lab/grids/gemma2_infer_s25_configs.jsonl lab/grids/gemma2_infer_s25_untouched_configs.jsonl" \
        GRID=gemma2_infer_s25 LANES=2 lab/run grid29c

Axes: model (gemma-2-2b, gemma-2-9b: the public configs, random weights), step generate /
prefill, batch 1-32, prompt 128-8192 (both sides of the 4096 sliding window), new tokens
1-512, precision bf16 / fp16 / fp32, attention sdpa / eager, KV cache dynamic / static,
greedy decoding. Constraints (fixed before drawing; a draw that breaks one is drawn again):
prompt + new tokens <= max_position_embeddings; a rough memory estimate <= 60 GB (an H100
too), a rough time estimate <= 30 s a row.
"""
import json
import math
import os
import random

from make_grid29 import estimate, shape

SEED = 25_2026_12_07
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 12
MODELS = [("tests/data/hf_configs/gemma-2-2b.json", 1.5), ("tests/data/hf_configs/gemma-2-9b.json", 1.0)]
LIMIT_BYTES = 60e9
LIMIT_SECONDS = 30.0


def draw(rng, models):
    while True:
        path, cfg = rng.choices(models, weights=[w for _, _, w in models], k=1)[0][:2]
        s = shape(cfg)
        step = rng.choices(["generate", "prefill"], weights=[0.7, 0.3])[0]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 5),
            "prompt": int(round(math.exp(rng.uniform(math.log(128), math.log(8192))))),
            "new_tokens": 0,
            "precision": rng.choices(["bf16", "fp16", "fp32"], weights=[0.5, 0.25, 0.25])[0],
            "attention": rng.choices(["sdpa", "eager"], weights=[0.6, 0.4])[0],
            "kv_cache": "dynamic",
        }
        if step == "generate":
            row["new_tokens"] = int(round(math.exp(rng.uniform(0.0, math.log(512)))))
            row["kv_cache"] = rng.choices(["dynamic", "static"], weights=[0.6, 0.4])[0]
        if row["prompt"] + row["new_tokens"] > s["maxpos"]:
            continue
        mem, secs = estimate(row, s)
        if row["attention"] == "eager":  # the soft-cap's extra score tensor
            mem += row["batch"] * s["heads"] * row["prompt"] * (row["prompt"] + row["new_tokens"]) * 4
        if mem > LIMIT_BYTES or secs > LIMIT_SECONDS:
            continue
        row["estimate_gb"] = round(mem / 1e9, 1)
        row["estimate_s"] = round(secs, 1)
        return row


def main():
    rng = random.Random(SEED)
    models = []
    for path, w in MODELS:
        with open(os.path.join(ROOT, path)) as f:
            models.append((path, json.load(f), w))
    rows = [draw(rng, models) for _ in range(N_ROWS)]
    untouched = set(rng.sample(range(N_ROWS), N_ROWS // 3))
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"id": f"gi25-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("gemma2_infer_s25_configs.jsonl", fit),
                       ("gemma2_infer_s25_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    print(f"{len(fit)} fit + {len(held)} untouched rows")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min, "
          f"largest {max(r['estimate_gb'] for r in rows)} GB")


if __name__ == "__main__":
    main()

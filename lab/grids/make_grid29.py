#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 29 (inference: generate and prefill).

Drawn at random with a fixed seed BEFORE any of it was measured or planned, committed as
drawn. The rows in lab/grids/grid29_untouched_configs.jsonl (a random third) are measured but not
looked at while the planner is fixed; their errors are quoted once, at the end, as they came
out.

    python3 lab/grids/make_grid29.py      # writes lab/grids/grid29_configs.jsonl and
                                      # lab/grids/grid29_untouched_configs.jsonl (deterministic)
    python3 lab/device/infer_runner.py --configs lab/grids/grid29_configs.jsonl --out $OUT/grid29.jsonl

Axes: model type (llama, qwen2, qwen3, mistral, gemma with MQA, gemma3_text with hybrid
sliding-window layers, phi3 with a sliding window on every layer), step (generate, or a plain
forward = prefill), KV cache (dynamic, static), precision (bf16, fp16, fp32), attention (sdpa,
eager), batch 1-64, prompt 128-16384 tokens, new tokens 1-1024.

The constraints (fixed before drawing; a draw that breaks one is drawn again):
- prompt + new tokens <= the model's max_position_embeddings;
- a rough memory estimate (weights + KV cache + the prefill's largest transients + logits +
  eager attention scores, SDPA's fp32 math-path scores with grouped kv heads, a static
  cache's repeated K/V) <= 100 GB, so that rows fit on one H200 (141 GB);
- a rough time estimate of the two calls (warm-up and measured) <= 60 s, so that the whole
  grid runs in the device's time.
"""
import json
import math
import os
import random

SEED = 29_2026_12_04
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 48

MODELS = [  # (path, weight)
    ("tests/data/hf_configs/Llama-3.2-1B.json", 1.2),
    ("tests/data/hf_configs/Llama-3.1-8B.json", 1.0),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", 1.0),
    ("tests/data/hf_configs/Qwen2.5-7B.json", 0.8),
    ("tests/data/hf_configs/Qwen3-0.6B.json", 1.0),
    ("tests/data/hf_configs/Qwen3-8B.json", 0.8),
    ("tests/data/hf_configs/Mistral-7B-v0.3.json", 1.0),
    ("tests/data/hf_configs/gemma-2b.json", 1.0),
    ("tests/data/hf_configs/gemma-3-1b-pt.json", 1.2),
    ("tests/data/hf_configs/Phi-3-mini-4k-instruct.json", 1.0),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LIMIT_BYTES = 100e9
LIMIT_SECONDS = 60.0


def shape(cfg):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    return dict(h=h, heads=heads, kvh=kvh, hd=hd, layers=cfg["num_hidden_layers"],
                inter=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                tied=cfg.get("tie_word_embeddings", False),
                maxpos=cfg["max_position_embeddings"])


def params(s):
    per_layer = s["h"] * (s["heads"] + 2 * s["kvh"]) * s["hd"] + s["heads"] * s["hd"] * s["h"]
    per_layer += 3 * s["h"] * s["inter"]
    return s["layers"] * per_layer + s["vocab"] * s["h"] * (1 if s["tied"] else 2)


def estimate(row, s):
    """(bytes, seconds): rough, only to keep rows on one H200 and in the device's time."""
    d = DTYPE_BYTES[row["precision"]]
    b, p, n = row["batch"], row["prompt"], row["new_tokens"]
    weights = params(s) * d
    kv = 2 * s["layers"] * s["kvh"] * s["hd"] * b * (p + n) * d
    act = b * p * (3 * s["inter"] + 6 * s["h"]) * d + b * p * s["h"] * 8
    logits = b * p * s["vocab"] * d if row["step"] == "prefill" else 4 * b * s["vocab"] * 4
    scores = 0
    if row["attention"] == "eager":
        scores = b * s["heads"] * p * (p + n) * (4 + 2 * d)
    elif d == 4 and s["kvh"] != s["heads"]:
        # fp32 with grouped kv heads: no fused kernel, SDPA's math path (fp32 scores, softmax)
        scores = 2 * b * s["heads"] * p * p * 4
    if row["kv_cache"] == "static":
        # the attention mask of a static cache: K and V repeated to every head (repeat_kv)
        scores += 2 * b * s["heads"] * (p + n) * s["hd"] * d
    total = weights + kv + act + logits + scores
    flops = 2 * params(s) * b * p + 4 * b * p * p * s["heads"] * s["hd"] * s["layers"]
    rate = 4e14 if d == 2 else 5e13
    secs = flops / rate
    if row["step"] == "generate":
        secs += n * (s["layers"] * 1.0e-3 + (weights + kv) / 3e12)
    return total, 2 * secs + 5.0


def draw(rng, models):
    while True:
        path, cfg = rng.choices(models, weights=[w for _, _, w in models], k=1)[0][:2]
        s = shape(cfg)
        step = rng.choices(["generate", "prefill"], weights=[0.75, 0.25])[0]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 6),
            "prompt": int(round(math.exp(rng.uniform(math.log(128), math.log(16384))))),
            "new_tokens": 0,
            "precision": rng.choices(["bf16", "fp16", "fp32"], weights=[0.5, 0.25, 0.25])[0],
            "attention": rng.choices(["sdpa", "eager"], weights=[0.75, 0.25])[0],
            "kv_cache": "dynamic",
        }
        if step == "generate":
            row["new_tokens"] = int(round(math.exp(rng.uniform(0.0, math.log(1024)))))
            row["kv_cache"] = rng.choices(["dynamic", "static"], weights=[0.6, 0.4])[0]
        if row["prompt"] + row["new_tokens"] > s["maxpos"]:
            continue
        mem, secs = estimate(row, s)
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
        r = {"id": f"g29-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid29_configs.jsonl", fit), ("grid29_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    types = sorted({r["model_type"] for r in rows})
    print(f"{len(fit)} fit + {len(held)} untouched rows over {len(types)} model types: {types}")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min")


if __name__ == "__main__":
    main()

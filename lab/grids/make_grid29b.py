#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 29's sampling and beam search (`model.generate()`
with `do_sample=True` and its logits warpers, or `num_beams > 1`).

Drawn at random with a fixed seed BEFORE any of it was measured, committed as drawn. The rows
in lab/grids/grid29b_untouched_configs.jsonl (a random third) are measured but not looked at while
the planner is fixed; their errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid29b.py     # writes lab/grids/grid29b_configs.jsonl and
                                      # lab/grids/grid29b_untouched_configs.jsonl (deterministic)
    python3 lab/device/infer_runner.py --configs lab/grids/grid29b_configs.jsonl --out $OUT/grid29b.jsonl

Axes: model type (the grid29 configs: llama, qwen2, qwen3, mistral, gemma, gemma3_text,
phi3), decoding (sampling with transformers' default top_k=50; top_k 0 with top_p; top_k,
top_p and a temperature; plain sampling with top_k=0 and top_p=1.0 (no warper); beam search
with 2-4 beams, greedy beams), batch 1-32, prompt 64-4096 tokens, new tokens 1-256, precision
bf16 / fp16 / fp32, attention sdpa / eager; the KV cache is dynamic (DynamicCache) on every row.

The constraints (fixed before drawing; a draw that breaks one is drawn again):
- prompt + new tokens <= the model's max_position_embeddings;
- a rough memory estimate (weights + KV cache of batch x beams sequences + the prefill's
  largest transients + the vocabulary-sized fp32 scores of the warpers or of beam search +
  eager attention scores, SDPA's fp32 math-path scores with grouped kv heads) <= 30 GB;
- a rough time estimate of the two calls (warm-up and measured) <= 25 s.
"""
import json
import math
import os
import random

SEED = 29_2026_12_05
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 18

MODELS = [  # (path, weight): the grid29 configs
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
DECODINGS = [  # (keys added to the row, weight)
    ({"do_sample": True}, 1.0),  # transformers' default top_k=50
    ({"do_sample": True, "top_k": 0, "top_p": 0.9}, 1.0),
    ({"do_sample": True, "top_k": 20, "top_p": 0.95, "temperature": 0.7}, 1.0),
    ({"do_sample": True, "top_k": 0, "top_p": 1.0}, 0.5),
    ({"num_beams": 2}, 0.7),
    ({"num_beams": 3}, 0.6),
    ({"num_beams": 4}, 0.7),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LIMIT_BYTES = 30e9
LIMIT_SECONDS = 25.0


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
    """(bytes, seconds): rough, only to keep rows small and in the device's time."""
    d = DTYPE_BYTES[row["precision"]]
    beams = row.get("num_beams", 1)
    b = row["batch"] * beams  # beam search expands the batch to batch x beams
    p, n = row["prompt"], row["new_tokens"]
    weights = params(s) * d
    kv = 2 * s["layers"] * s["kvh"] * s["hd"] * b * (p + n) * d
    if beams > 1:
        kv *= 2  # the reordered copy of every layer's cache while the old one exists
    act = b * p * (3 * s["inter"] + 6 * s["h"]) * d + b * p * s["h"] * 8
    # fp32 scores over the vocabulary: logits copy, processors, warpers (sort values and
    # indices), softmax, multinomial; beam search's log_softmax and [batch, beams x vocab]
    logits = 12 * b * s["vocab"] * 4
    scores = 0
    if row["attention"] == "eager":
        scores = b * s["heads"] * p * (p + n) * (4 + 2 * d)
    elif d == 4 and s["kvh"] != s["heads"]:
        scores = 2 * b * s["heads"] * p * p * 4
    total = weights + kv + act + logits + scores
    flops = 2 * params(s) * b * p + 4 * b * p * p * s["heads"] * s["hd"] * s["layers"]
    rate = 4e14 if d == 2 else 5e13
    secs = flops / rate
    secs += n * (s["layers"] * 1.2e-3 + (weights + kv) / 3e12 + 2e-3)
    return total, 2 * secs + 5.0


def draw(rng, models):
    while True:
        path, cfg = rng.choices(models, weights=[w for _, _, w in models], k=1)[0][:2]
        s = shape(cfg)
        dec = rng.choices(DECODINGS, weights=[w for _, w in DECODINGS], k=1)[0][0]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": "generate",
            "batch": 2 ** rng.randint(0, 5),
            "prompt": int(round(math.exp(rng.uniform(math.log(64), math.log(4096))))),
            "new_tokens": int(round(math.exp(rng.uniform(0.0, math.log(256))))),
            "precision": rng.choices(["bf16", "fp16", "fp32"], weights=[0.5, 0.25, 0.25])[0],
            "attention": rng.choices(["sdpa", "eager"], weights=[0.75, 0.25])[0],
            "kv_cache": "dynamic",
            **dec,
        }
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
        r = {"id": f"g29b-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid29b_configs.jsonl", fit),
                       ("grid29b_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    types = sorted({r["model_type"] for r in rows})
    print(f"{len(fit)} fit + {len(held)} untouched rows over {len(types)} model types: {types}")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min")


if __name__ == "__main__":
    main()

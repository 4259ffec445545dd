#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 29's inference of mixture-of-experts decoders
(qwen2_moe, qwen3_moe, gpt_oss: transformers 5.17's `grouped_mm` experts) — gpt-oss also the
model type whose attention transformers forces to eager (`_supports_sdpa = False`), with
attention sinks and alternating sliding-window layers.

Drawn at random with a fixed seed BEFORE any of it was measured, committed as drawn. The rows
in lab/grids/grid29d_untouched_configs.jsonl (a random third) are measured but not looked at while
the planner is fixed; their errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid29d.py     # writes lab/grids/grid29d_configs.jsonl and
                                      # lab/grids/grid29d_untouched_configs.jsonl (deterministic)
    CONFIGS="lab/grids/grid29d_configs.jsonl lab/grids/grid29d_untouched_configs.jsonl" GRID=grid29d \
        LANES=1 lab/run grid29c

Axes: model (Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B, gpt-oss-20b: the public configs with random
weights built by `from_config` on the GPU), step generate / prefill, batch 1-32, prompt
64-8192, new tokens 1-256, precision bf16 / fp16 (fp32 for the 14B Qwen1.5-MoE only: the
others do not fit an 80 GB card in fp32), attention sdpa / eager (gpt-oss: eager, what
transformers runs), KV cache dynamic / static, greedy decoding.

The constraints (fixed before drawing; a draw that breaks one is drawn again):
- prompt + new tokens <= the model's max_position_embeddings;
- a rough memory estimate <= 72 GB (an H100 80GB), a rough time estimate <= 40 s a row.
"""
import json
import math
import os
import random

from make_grid29c import log_uniform  # the same draw of lengths

SEED = 29_2026_12_06_4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 24

MODELS = [  # (path, weight, precisions)
    ("tests/data/hf_configs/Qwen1.5-MoE-A2.7B.json", 1.0, ["bf16", "fp16", "fp32"]),
    ("tests/data/hf_configs/Qwen3-30B-A3B.json", 1.0, ["bf16", "fp16"]),
    ("tests/data/hf_configs/gpt-oss-20b.json", 1.8, ["bf16", "fp16"]),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LIMIT_BYTES = 72e9
LIMIT_SECONDS = 40.0


def shape(cfg):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    e = cfg.get("num_experts") or cfg.get("num_local_experts")
    inter_moe = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return dict(h=h, heads=heads, kvh=cfg.get("num_key_value_heads") or heads,
                hd=cfg.get("head_dim") or h // heads, layers=cfg["num_hidden_layers"],
                e=e, k=cfg["num_experts_per_tok"], inter=inter_moe,
                shared=cfg.get("shared_expert_intermediate_size") or 0,
                vocab=cfg["vocab_size"], tied=cfg.get("tie_word_embeddings", False),
                maxpos=cfg["max_position_embeddings"])


def params(s):
    attn = s["h"] * (s["heads"] + 2 * s["kvh"]) * s["hd"] + s["heads"] * s["hd"] * s["h"]
    moe = s["e"] * 3 * s["h"] * s["inter"] + s["e"] * s["h"] + 3 * s["h"] * s["shared"]
    return s["layers"] * (attn + moe) + s["vocab"] * s["h"] * (1 if s["tied"] else 2)


def active(s):
    attn = s["h"] * (s["heads"] + 2 * s["kvh"]) * s["hd"] + s["heads"] * s["hd"] * s["h"]
    moe = s["k"] * 3 * s["h"] * s["inter"] + 3 * s["h"] * s["shared"]
    return s["layers"] * (attn + moe) + s["vocab"] * s["h"]


def estimate(row, s):
    """(bytes, seconds): rough, only to keep rows in an 80 GB card and in the device's time."""
    d = DTYPE_BYTES[row["precision"]]
    b = row["batch"]
    p, n = row["prompt"], row.get("new_tokens", 0)
    weights = params(s) * d
    kv = 2 * s["layers"] * s["kvh"] * s["hd"] * b * (p + n) * d
    # routed rows (tokens x k): gathered input, gate_up and its masked copy, act, product,
    # down and its masked copy, weighted, inverse-permuted
    act = b * p * (s["k"] * (6 * s["inter"] + 5 * s["h"]) * d + 8 * s["h"] * d + 3 * s["shared"] * d)
    logits = (b * p if row["step"] == "prefill" else 4 * b) * s["vocab"] * 4
    scores = 0
    if row["attention"] == "eager":
        scores = b * s["heads"] * p * (p + n) * (4 + 2 * d)
    elif d == 4 and s["kvh"] != s["heads"]:
        scores = 2 * b * s["heads"] * p * p * 4
    total = weights + kv + act + logits + scores
    flops = 2 * active(s) * b * p + 4 * b * p * p * s["heads"] * s["hd"] * s["layers"]
    rate = 2e14 if d == 2 else 3e13
    secs = flops / rate
    secs += n * (s["layers"] * 2.0e-3 + (active(s) * d + kv) / 2e12 + 3e-3)
    build = weights / 10e9
    return total, 2 * secs + 8.0 + build


def draw(rng, models):
    while True:
        path, cfg, _, precisions = rng.choices(models, weights=[m[2] for m in models], k=1)[0]
        s = shape(cfg)
        step = rng.choices(["generate", "prefill"], weights=[0.75, 0.25])[0]
        attention = rng.choices(["sdpa", "eager"], weights=[0.7, 0.3])[0]
        if cfg["model_type"] == "gpt_oss":
            attention = "eager"  # transformers 5.17: GptOss `_supports_sdpa = False`
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 5),
            "prompt": log_uniform(rng, 64, 8192),
            "precision": rng.choices(precisions, weights=[0.55, 0.3, 0.15][:len(precisions)])[0],
            "attention": attention,
            "kv_cache": "dynamic",
        }
        if step == "generate":
            row["new_tokens"] = log_uniform(rng, 1, 256)
            row["kv_cache"] = rng.choices(["dynamic", "static"], weights=[0.7, 0.3])[0]
        if row["prompt"] + row.get("new_tokens", 0) > s["maxpos"]:
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
    for path, w, precisions in MODELS:
        with open(os.path.join(ROOT, path)) as f:
            models.append((path, json.load(f), w, precisions))
    rows = [draw(rng, models) for _ in range(N_ROWS)]
    untouched = set(rng.sample(range(N_ROWS), N_ROWS // 3))
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"id": f"g29d-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid29d_configs.jsonl", fit),
                       ("grid29d_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    types = sorted({r["model_type"] for r in rows})
    print(f"{len(fit)} fit + {len(held)} untouched rows over {len(types)} model types: {types}")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min")


if __name__ == "__main__":
    main()

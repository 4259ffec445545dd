#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 29's quantized inference weights (bitsandbytes
nf4 / LLM.int8 loaded by `from_pretrained(..., quantization_config=BitsAndBytesConfig(...))`)
and accelerate's `device_map="auto"` under `max_memory={0: GPU, "cpu": "200GiB"}`.

Drawn at random with a fixed seed BEFORE any of it was measured, committed as drawn. The rows
in lab/grids/grid29c_untouched_configs.jsonl (a random third) are measured but not looked at while
the planner is fixed; their errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid29c.py     # writes lab/grids/grid29c_configs.jsonl and
                                      # lab/grids/grid29c_untouched_configs.jsonl (deterministic)
    python3 lab/device/infer_runner.py --configs lab/grids/grid29c_configs.jsonl --out $OUT/grid29c.jsonl

Axes, quantized rows: model type (the grid29 configs: llama, qwen2, qwen3, mistral, gemma,
gemma3_text, phi3), quantization (nf4 with and without double quantization, int8), precision
(the checkpoint's dtype, `dtype=` and nf4's `bnb_4bit_compute_dtype`: bf16 / fp16, fp32 for
nf4 only), step generate / prefill, batch 1-32, prompt 64-4096, new tokens 1-256, attention
sdpa / eager, KV cache dynamic / static, greedy decoding.
Device-map rows: the models up to 4B parameters, the GPU's max_memory drawn between 20 % and
95 % of the weights, precision bf16 / fp16 / fp32, step generate / prefill, batch 1-8, prompt
64-1024, new tokens 1-32, attention sdpa / eager, dynamic cache, greedy.

The constraints (fixed before drawing; a draw that breaks one is drawn again):
- prompt + new tokens <= the model's max_position_embeddings;
- a rough memory estimate <= 30 GB, a rough time estimate <= 25 s a row (LLM.int8 and
  offloaded layers decode slowly: their per-token cost is in the estimate).
"""
import json
import math
import os
import random

from make_grid29b import shape  # the same config.json sizes

SEED = 29_2026_12_06
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_QUANT = 27
N_MAP = 15

MODELS = [  # (path, weight): the grid29 configs
    ("tests/data/hf_configs/Llama-3.2-1B.json", 1.2),
    ("tests/data/hf_configs/Llama-3.1-8B.json", 0.7),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", 1.0),
    ("tests/data/hf_configs/Qwen2.5-7B.json", 0.6),
    ("tests/data/hf_configs/Qwen3-0.6B.json", 1.0),
    ("tests/data/hf_configs/Qwen3-8B.json", 0.6),
    ("tests/data/hf_configs/Mistral-7B-v0.3.json", 0.7),
    ("tests/data/hf_configs/gemma-2b.json", 1.0),
    ("tests/data/hf_configs/gemma-3-1b-pt.json", 1.2),
    ("tests/data/hf_configs/Phi-3-mini-4k-instruct.json", 1.0),
]
QUANTS = [  # (keys added to the row, weight)
    ({"quant": "nf4", "double_quant": True}, 1.2),
    ({"quant": "nf4", "double_quant": False}, 0.8),
    ({"quant": "int8"}, 1.0),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LIMIT_BYTES = 30e9
LIMIT_SECONDS = 25.0
MAP_MAX_PARAMS = 4.2e9


def linear_params(s):
    per_layer = s["h"] * (s["heads"] + 2 * s["kvh"]) * s["hd"] + s["heads"] * s["hd"] * s["h"]
    return s["layers"] * (per_layer + 3 * s["h"] * s["inter"])


def params(s):
    return linear_params(s) + s["vocab"] * s["h"] * (1 if s["tied"] else 2)


def estimate(row, s):
    """(bytes, seconds): rough, only to keep rows small and in the device's time."""
    d = DTYPE_BYTES[row["precision"]]
    b = row["batch"]
    p, n = row["prompt"], row.get("new_tokens", 0)
    q = row.get("quant")
    lin = linear_params(s)
    rest = params(s) - lin
    if q == "int8":
        weights = lin * 1.0 + rest * d
    elif q == "nf4":
        weights = lin * 0.53 + rest * d
    else:
        weights = params(s) * d
    on_gpu = weights
    if row.get("device_map"):
        on_gpu = row["max_gpu_bytes"]
    kv = 2 * s["layers"] * s["kvh"] * s["hd"] * b * (p + n) * d
    act = b * p * (3 * s["inter"] + 6 * s["h"]) * max(d, 2) + b * p * s["h"] * 8
    if q == "int8":
        act *= 2  # fp16 casts, int8 row quantization, int32 products
    if q == "nf4":
        act += s["h"] * s["inter"] * d  # one dequantized weight
    logits = (b * p if row["step"] == "prefill" else 4 * b) * s["vocab"] * 4
    scores = 0
    if row["attention"] == "eager":
        scores = b * s["heads"] * p * (p + n) * (4 + 2 * d)
    elif d == 4 and s["kvh"] != s["heads"]:
        scores = 2 * b * s["heads"] * p * p * 4
    total = on_gpu + kv + act + logits + scores
    flops = 2 * params(s) * b * p + 4 * b * p * p * s["heads"] * s["hd"] * s["layers"]
    rate = 4e14 if d == 2 else 5e13
    if q == "int8":
        rate /= 4
    secs = flops / rate
    per_token = s["layers"] * 1.2e-3 + (weights + kv) / 3e12 + 2e-3
    if q == "int8":
        per_token += s["layers"] * 7 * 0.4e-3  # seven LLM.int8 matmuls a layer
    if q == "nf4":
        per_token += s["layers"] * 7 * 0.05e-3
    if row.get("device_map"):
        per_token += (params(s) * d - row["max_gpu_bytes"]) / 8e9  # streamed from the CPU
    secs += n * per_token
    load = params(s) * DTYPE_BYTES[row["precision"]] / 1e9  # save + from_pretrained
    return total, 2 * secs + 5.0 + load


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw_quant(rng, models):
    while True:
        path, cfg = rng.choices(models, weights=[w for _, _, w in models], k=1)[0][:2]
        s = shape(cfg)
        quant = rng.choices(QUANTS, weights=[w for _, w in QUANTS], k=1)[0][0]
        step = rng.choices(["generate", "prefill"], weights=[0.7, 0.3])[0]
        precisions = ["bf16", "fp16", "fp32"] if quant["quant"] == "nf4" else ["bf16", "fp16"]
        weights = [0.5, 0.3, 0.2] if quant["quant"] == "nf4" else [0.6, 0.4]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 5),
            "prompt": log_uniform(rng, 64, 4096),
            "precision": rng.choices(precisions, weights=weights)[0],
            "attention": rng.choices(["sdpa", "eager"], weights=[0.75, 0.25])[0],
            **quant,
        }
        if step == "generate":
            row["new_tokens"] = log_uniform(rng, 1, 256)
            row["kv_cache"] = rng.choices(["dynamic", "static"], weights=[0.75, 0.25])[0]
        if row["prompt"] + row.get("new_tokens", 0) > s["maxpos"]:
            continue
        mem, secs = estimate(row, s)
        if mem > LIMIT_BYTES or secs > LIMIT_SECONDS:
            continue
        row["estimate_gb"] = round(mem / 1e9, 1)
        row["estimate_s"] = round(secs, 1)
        return row


def draw_map(rng, models):
    small = [m for m in models if params(shape(m[1])) <= MAP_MAX_PARAMS]
    while True:
        path, cfg = rng.choices(small, weights=[w for _, _, w in small], k=1)[0][:2]
        s = shape(cfg)
        step = rng.choices(["generate", "prefill"], weights=[0.7, 0.3])[0]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 3),
            "prompt": log_uniform(rng, 64, 1024),
            "precision": rng.choices(["bf16", "fp16", "fp32"], weights=[0.5, 0.25, 0.25])[0],
            "attention": rng.choices(["sdpa", "eager"], weights=[0.75, 0.25])[0],
            "device_map": "auto",
        }
        if step == "generate":
            row["new_tokens"] = log_uniform(rng, 1, 32)
            row["kv_cache"] = "dynamic"
        w = params(s) * DTYPE_BYTES[row["precision"]]
        mib = int(w * rng.uniform(0.20, 0.95) / 2**20)
        row["max_gpu_memory"] = f"{mib}MiB"
        row["max_cpu_memory"] = "200GiB"
        row["max_gpu_bytes"] = mib * 2**20
        if row["prompt"] + row.get("new_tokens", 0) > s["maxpos"]:
            continue
        mem, secs = estimate(row, s)
        if mem > LIMIT_BYTES or secs > LIMIT_SECONDS:
            continue
        del row["max_gpu_bytes"]
        row["estimate_gb"] = round(mem / 1e9, 1)
        row["estimate_s"] = round(secs, 1)
        return row


def main():
    rng = random.Random(SEED)
    models = []
    for path, w in MODELS:
        with open(os.path.join(ROOT, path)) as f:
            models.append((path, json.load(f), w))
    rows = [draw_quant(rng, models) for _ in range(N_QUANT)]
    rows += [draw_map(rng, models) for _ in range(N_MAP)]
    n = len(rows)
    untouched = set(rng.sample(range(N_QUANT), N_QUANT // 3))
    untouched |= {N_QUANT + i for i in rng.sample(range(N_MAP), N_MAP // 3)}
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"id": f"g29c-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid29c_configs.jsonl", fit),
                       ("grid29c_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    types = sorted({r["model_type"] for r in rows})
    print(f"{len(fit)} fit + {len(held)} untouched rows of {n} over {len(types)} model types: {types}")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min")


if __name__ == "__main__":
    main()

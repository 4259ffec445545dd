#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 29's last open item: bitsandbytes-quantized
weights (nf4 with or without double quantization, LLM.int8) loaded with accelerate's
`device_map="auto"` at once:

    from_pretrained(folder, dtype=dtype, attn_implementation="sdpa",
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=dtype,
            llm_int8_enable_fp32_cpu_offload=True)
        | BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True),
        device_map="auto", max_memory={0: max_gpu_memory, "cpu": "200GiB"})

Drawn at random with a fixed seed BEFORE any of it was measured, committed as drawn (session
30). Of the 9 rows drawn, a random third is written to
lab/grids/grid30q_untouched_configs.jsonl: measured, but not looked at while the planner is
fixed; their errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid30q.py      # writes lab/grids/grid30q_configs.jsonl (6 rows)
                                           # and lab/grids/grid30q_untouched_configs.jsonl (3)
    OUT=dir bash lab/device/session30b.sh  # measures both (carry .whl: bitsandbytes 0.50.2)

Axes: model (the small and medium Llama-lineage configs of grid29c: llama, qwen2, qwen3,
gemma, gemma3_text, phi3), quantization (nf4 with / without double quantization, int8),
precision bf16 / fp16 (the checkpoint's dtype, `dtype=` and nf4's compute dtype), step
generate / prefill, batch 1-8, prompt 32-512, new tokens 1-16, the GPU budget. SDPA, dynamic
cache, greedy decoding; every row with `llm_int8_enable_fp32_cpu_offload=True` (without it
transformers refuses an offloading map before loading anything).

The GPU budget: transformers 5.17 places the quantized model against `max_memory` × 0.90
(`adjust_max_memory`) with `compute_module_sizes` counting a quantized projection weight 0.5
byte per element (4-bit) or 1 (int8) and everything else in the dtype. The budget after the
× 0.90 is drawn uniformly between a lower bound that leaves room on GPU 0 for the embedding,
the reserve accelerate keeps for the largest module still to place and two decoder layers, and
an upper bound that leaves at least the last layer off the GPU (the bounds from the config's
sizes, not from the planner); `max_gpu_memory` is that divided by 0.90, rounded up to MiB.

The constraints (fixed before drawing; a draw that breaks one is drawn again):
- prompt + new tokens <= max_position_embeddings;
- max_gpu_memory <= 20 GiB and a rough memory estimate <= 20 GB;
- a rough time estimate <= 50 s a row on an H100 (checkpoint save and load, quantization on
  the CPU of the offloaded layers, the offloaded layers copied in at every forward).
"""
import json
import math
import os
import random

SEED = 30_2026_12_07
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 9
N_UNTOUCHED = 3
GIB = 2**30
LIMIT_GPU = 20 * GIB
LIMIT_BYTES = 20e9
LIMIT_SECONDS = 50.0
FACTOR = 0.90  # adjust_max_memory

MODELS = [  # (path, weight): grid29c's configs up to 4B parameters
    ("tests/data/hf_configs/Llama-3.2-1B.json", 1.2),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", 1.0),
    ("tests/data/hf_configs/Qwen3-0.6B.json", 1.0),
    ("tests/data/hf_configs/gemma-2b.json", 0.8),
    ("tests/data/hf_configs/gemma-3-1b-pt.json", 1.0),
    ("tests/data/hf_configs/Phi-3-mini-4k-instruct.json", 0.8),
]
QUANTS = [  # (keys added to the row, weight)
    ({"quant": "nf4", "double_quant": True}, 1.0),
    ({"quant": "nf4", "double_quant": False}, 0.8),
    ({"quant": "int8"}, 1.2),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
# `tie_word_embeddings` when config.json leaves it out: the config class's default
# (GemmaConfig / Gemma3TextConfig tie, the others do not)
TIED_DEFAULT = {"gemma": True, "gemma2": True, "gemma3_text": True}


def shape(cfg):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    return dict(h=h, heads=heads, kvh=kvh, hd=hd, layers=cfg["num_hidden_layers"],
                inter=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                tied=cfg.get("tie_word_embeddings", TIED_DEFAULT.get(cfg["model_type"], False)),
                maxpos=cfg["max_position_embeddings"])


def sizes(s, quant, d):
    """(embedding, untied lm_head, one layer) bytes as compute_module_sizes counts them."""
    lin = s["h"] * (s["heads"] + 2 * s["kvh"]) * s["hd"] + s["heads"] * s["hd"] * s["h"]
    lin += 3 * s["h"] * s["inter"]
    per = 0.5 if quant == "nf4" else 1.0
    layer = lin * per + 2 * s["h"] * d
    embed = s["vocab"] * s["h"] * d
    head = 0 if s["tied"] else embed
    return embed, head, layer


def estimate(row, s, gpu_bytes):
    """(bytes, seconds): rough, only to keep rows small and in the device's time."""
    d = DTYPE_BYTES[row["precision"]]
    b, p, n = row["batch"], row["prompt"], row.get("new_tokens", 0)
    embed, head, layer = sizes(s, row["quant"], d)
    total = embed + head + s["layers"] * layer
    offloaded = max(0.0, total - gpu_bytes * FACTOR)
    kv = 2 * s["layers"] * s["kvh"] * s["hd"] * b * (p + n) * d
    act = b * p * (3 * s["inter"] + 6 * s["h"]) * 2 + b * p * s["h"] * 8
    act += s["h"] * s["inter"] * d  # one dequantized 4-bit weight (or one streamed layer)
    logits = (b * p if row["step"] == "prefill" else 4 * b) * s["vocab"] * 4
    mem = gpu_bytes + kv + act + logits + layer * 2
    params_dtype = (s["vocab"] * s["h"] * (1 if s["tied"] else 2)
                    + s["layers"] * (layer / (0.5 if row["quant"] == "nf4" else 1.0))) * d
    load = params_dtype / 1e9 * 2.0 + 4.0      # save the random checkpoint, load it
    load += offloaded / 0.5e9                  # quantized on the CPU
    forwards = 2 * (n if row["step"] == "generate" else 1)   # warm-up + measured call
    tensors = 9 * s["layers"] * 6              # copied per forward (upper bound), each + empty_cache
    per_forward = offloaded / 5e9 + tensors * 0.3e-3 + s["layers"] * 1.5e-3
    if row["quant"] == "int8":
        per_forward += s["layers"] * 7 * 0.4e-3
    return mem, load + forwards * per_forward + 3.0


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw(rng, models):
    while True:
        path, cfg = rng.choices(models, weights=[w for _, _, w in models], k=1)[0][:2]
        s = shape(cfg)
        quant = rng.choices(QUANTS, weights=[w for _, w in QUANTS], k=1)[0][0]
        step = rng.choices(["generate", "prefill"], weights=[0.7, 0.3])[0]
        row = {
            "model": path,
            "model_type": cfg["model_type"],
            "step": step,
            "batch": 2 ** rng.randint(0, 3),
            "prompt": log_uniform(rng, 32, 512),
            "precision": rng.choice(["bf16", "fp16"]),
            "attention": "sdpa",
            **quant,
        }
        if step == "generate":
            row["new_tokens"] = log_uniform(rng, 1, 16)
            row["kv_cache"] = "dynamic"
        if row["prompt"] + row.get("new_tokens", 0) > s["maxpos"]:
            continue
        embed, head, layer = sizes(s, row["quant"], DTYPE_BYTES[row["precision"]])
        reserve = max(embed, head, layer)
        lo = embed + reserve + 2 * layer
        hi = embed + head + (s["layers"] - 1) * layer + max(head, layer)
        if lo >= hi:
            continue
        inferred = rng.uniform(lo, hi)
        mib = math.ceil(inferred / FACTOR / 2**20)
        gpu_bytes = mib * 2**20
        if gpu_bytes > LIMIT_GPU:
            continue
        row["device_map"] = "auto"
        row["max_gpu_memory"] = f"{mib}MiB"
        row["max_cpu_memory"] = "200GiB"
        row["fp32_cpu_offload"] = True
        mem, secs = estimate(row, s, gpu_bytes)
        if mem > LIMIT_BYTES or secs > LIMIT_SECONDS:
            continue
        row["estimate_gb"] = round(mem / 1e9, 2)
        row["estimate_s"] = round(secs, 1)
        return row


def main():
    rng = random.Random(SEED)
    models = []
    for path, w in MODELS:
        with open(os.path.join(ROOT, path)) as f:
            models.append((path, json.load(f), w))
    rows = [draw(rng, models) for _ in range(N)]
    untouched = set(rng.sample(range(N), N_UNTOUCHED))
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"id": f"g30q-{i:03d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid30q_configs.jsonl", fit),
                       ("grid30q_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    types = sorted({r["model_type"] for r in rows})
    print(f"{len(fit)} fit + {len(held)} untouched rows over {len(types)} model types: {types}")
    print(f"estimated device time: {sum(r['estimate_s'] for r in rows) / 60:.1f} min "
          f"(longest row {max(r['estimate_s'] for r in rows)} s)")


if __name__ == "__main__":
    main()

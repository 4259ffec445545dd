#!/usr/bin/env python3
"""Pre-registered H200 measurement grid for issue 30's model types (olmo2, granite,
starcoder2, smollm3, falcon): training steps of the config.json import, measured by
crates/device/runners/torch_runner.py (`measure`) and compared with `vramlab validate`.

Measured in session 17 (tests/data/grid30/). Drawn at random with a fixed seed BEFORE any of it was measured or planned,
committed as drawn, for a later session that has the GPU (lab/run grid30 runs it).
The rows in lab/grids/grid30_untouched_configs.jsonl (a random third of each type's) are measured but not looked
at while the planner is fixed; their errors are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid30.py      # writes lab/grids/grid30_configs.jsonl and
                                      # lab/grids/grid30_untouched_configs.jsonl (deterministic)

Axes: model type x a small (layer-cut) config of two sizes per type
(tests/data/hf_configs_device/*-L*.json, cut from the public configs in tests/data/hf_configs/),
batch, sequence length, precision (fp32, amp-bf16, bf16), activation checkpointing (off / on),
loop shape (plain: the output kept through backward; trainer: released before backward, as
transformers' Trainer does), attention (sdpa mostly; eager for a quarter of the rows). AdamW,
no accumulation, full fine-tuning: the model types are what is new.

Each type appears with each precision, both checkpointing settings and both loop shapes at
least once (draws are repeated until that holds, with the seed advancing).

The constraint (fixed before drawing; a draw that breaks it is drawn again): a rough memory
estimate (weights, gradients and AdamW state; activations per token and layer; eager or
math-path attention scores; the logits and the loss's fp32 copies) <= 60 GB, so rows run on
one H200 three at a time; seq <= max_position_embeddings.
"""
import json
import os
import random

SEED = 30_2026_12_04
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 60
LIMIT_BYTES = 60e9

MODELS = {  # type -> the two layer-cut configs (small, large)
    "olmo2": ["OLMo-2-0425-1B-L4", "OLMo-2-1124-7B-L2"],
    "granite": ["granite-3.1-2b-instruct-L4", "granite-3.1-8b-instruct-L2"],
    "starcoder2": ["starcoder2-3b-L4", "starcoder2-7b-L2"],
    "smollm3": ["SmolLM3-3B-L8", "SmolLM3-small-sliding-L6"],
    "falcon": ["falcon-7b-L2", "falcon-40b-L1"],
}
PRECISIONS = ["fp32", "amp-bf16", "bf16"]


def path(name):
    return f"tests/data/hf_configs_device/{name}.json"


def shape(cfg):
    mt = cfg["model_type"]
    h = cfg.get("hidden_size") or cfg.get("n_embed")
    heads = cfg["num_attention_heads"]
    if mt == "falcon":
        inter = cfg.get("ffn_hidden_size") or 4 * h
        if cfg.get("new_decoder_architecture"):
            kvh = cfg.get("num_kv_heads") or heads
        else:
            kvh = 1 if cfg.get("multi_query", True) else heads
    else:
        inter = cfg["intermediate_size"]
        kvh = cfg.get("num_key_value_heads") or heads
    return dict(h=h, heads=heads, kvh=kvh, layers=cfg["num_hidden_layers"], inter=inter,
                vocab=cfg["vocab_size"], maxpos=cfg.get("max_position_embeddings", 2048),
                tied=cfg.get("tie_word_embeddings", mt in ("starcoder2", "smollm3", "falcon")),
                mt=mt, mqa=(mt == "falcon" and kvh == 1))


def params(s):
    hd = s["h"] // s["heads"]
    layer = s["h"] * (s["heads"] + 2 * s["kvh"]) * hd + s["heads"] * hd * s["h"]
    layer += (2 if s["mt"] in ("starcoder2", "falcon") else 3) * s["h"] * s["inter"]
    return s["layers"] * layer + s["vocab"] * s["h"] * (1 if s["tied"] else 2)


def estimate(row, s):
    """Bytes, rough: only to keep rows on one H200 beside two others."""
    p = params(s)
    states = p * (8 if row["precision"] == "bf16" else 16)
    d = 4 if row["precision"] == "fp32" else 2
    tokens = row["batch"] * row["seq"]
    per_layer = tokens * (14 * s["h"] + 4 * s["inter"]) * d
    if row["checkpointing"]:
        per_layer = tokens * s["h"] * d
    scores = 0
    if row["attention"] == "eager" or (s["mqa"] and row["attention"] == "sdpa"):
        scores = row["batch"] * s["heads"] * row["seq"] ** 2 * (4 + 4 + d)
    logits = tokens * s["vocab"] * (d + 4 + 4 + 4)
    return states + s["layers"] * per_layer + scores + logits + 2e9


def draw(rng, mt, cfgs):
    while True:
        name = rng.choice(MODELS[mt])
        s = cfgs[name]
        row = {
            "model": path(name),
            "model_type": mt,
            "batch": rng.choice([1, 2, 4, 8, 16]),
            "seq": rng.choice([256, 512, 1024, 2048]),
            "precision": rng.choice(PRECISIONS),
            "optimizer": "adamw",
            "attention": rng.choices(["sdpa", "eager"], weights=[3, 1])[0],
            "loop": rng.choice(["plain", "trainer"]),
            "checkpointing": rng.random() < 0.5,
        }
        if row["seq"] > s["maxpos"]:
            continue
        est = estimate(row, s)
        if est > LIMIT_BYTES:
            continue
        row["estimate_gb"] = round(est / 1e9, 1)
        return row


def covers(rows):
    for mt in MODELS:
        mine = [r for r in rows if r["model_type"] == mt]
        for key, values in (("precision", PRECISIONS), ("checkpointing", [False, True]),
                            ("loop", ["plain", "trainer"]), ("model", [path(n) for n in MODELS[mt]])):
            if {r[key] for r in mine} != set(values):
                return False
    return True


def main():
    cfgs = {}
    for names in MODELS.values():
        for n in names:
            with open(os.path.join(ROOT, path(n))) as f:
                cfgs[n] = shape(json.load(f))
    seed = SEED
    while True:
        rng = random.Random(seed)
        per_type = N_ROWS // len(MODELS)
        rows = [draw(rng, mt, cfgs) for mt in MODELS for _ in range(per_type)]
        if covers(rows):
            break
        seed += 1
    rng.shuffle(rows)
    # a random third of each type's rows, so that every type has unseen rows
    untouched = set()
    for mt in MODELS:
        mine = [i for i, r in enumerate(rows) if r["model_type"] == mt]
        untouched |= set(rng.sample(mine, len(mine) // 3))
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"grid_id": f"g30-{i:02d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid30_configs.jsonl", fit), ("grid30_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part))
    print(f"seed {seed}: {len(fit)} fit rows, {len(held)} untouched")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Pre-registered device measurement grid for issue 30's masked-LM encoders (modernbert,
deberta-v2): training steps of the config.json import, measured by
crates/device/runners/torch_runner.py (`measure`) and compared with `vramlab validate`.

Measured in session 17 (tests/data/grid30/). Drawn at random with a fixed seed BEFORE any of it was measured or planned,
committed as drawn, for a later session that has the GPU (lab/run grid30_new
runs it). The rows in lab/grids/grid30_encoder_untouched_configs.jsonl (a random third of each
type's) are measured but not looked at while the planner is fixed; their errors are quoted
once, at the end, as they came out.

    python3 lab/grids/make_grid30_encoder.py   # writes lab/grids/grid30_encoder_configs.jsonl and
                                           # lab/grids/grid30_encoder_untouched_configs.jsonl

Axes (as lab/grids/make_grid30.py): model type x a layer-cut config of two sizes per type
(tests/data/hf_configs_device/*-L*.json, cut from the public configs in tests/data/hf_configs/),
batch, sequence length, precision (fp32, amp-bf16, bf16), activation checkpointing (off / on),
loop shape (plain / trainer), attention: ModernBERT sdpa for three quarters of its rows and
eager for the rest; DeBERTa-v2 eager always (transformers 5.17 refuses SDPA for it, and the
runner refuses it too). AdamW, no accumulation, full fine-tuning. ModernBERT's sequences are
all >= local_attention / 2 = 64, so its sliding layers always build the window mask. DeBERTa's
sequences stay <= 512, the length its relative buckets were trained for.

Each type appears with each precision, both checkpointing settings, both loop shapes and both
configs at least once (draws are repeated until that holds, with the seed advancing); ModernBERT
with both attentions.

The constraint (fixed before drawing; a draw that breaks it is drawn again): a rough memory
estimate (weights, gradients and AdamW state; activations per token and layer; the attention
score tensors each type materialises; the logits and the loss's fp32 copies) <= 35 GB, so rows
run two at a time on an 80 GB H100 or an H200.
"""
import json
import os
import random

SEED = 30_2026_12_05
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS_PER_TYPE = 12
LIMIT_BYTES = 35e9

MODELS = {  # type -> the two layer-cut configs (small, large)
    "modernbert": ["ModernBERT-base-L6", "ModernBERT-large-L4"],
    "deberta-v2": ["deberta-v3-base-L6", "deberta-v3-large-L4"],
}
SEQS = {"modernbert": [256, 512, 1024, 2048], "deberta-v2": [128, 256, 512]}
PRECISIONS = ["fp32", "amp-bf16", "bf16"]


def path(name):
    return f"tests/data/hf_configs_device/{name}.json"


def shape(cfg):
    return dict(mt=cfg["model_type"], h=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                layers=cfg["num_hidden_layers"], inter=cfg["intermediate_size"],
                vocab=cfg["vocab_size"], buckets=cfg.get("position_buckets", 256))


def params(s):
    h, i = s["h"], s["inter"]
    if s["mt"] == "modernbert":
        layer = 4 * h * h + 3 * h * i
    else:
        layer = 4 * h * h + 2 * h * i
    return s["layers"] * layer + s["vocab"] * h + h * h


def estimate(row, s):
    """Bytes, rough: only to keep two rows on one 80 GB card."""
    p = params(s)
    states = p * (8 if row["precision"] == "bf16" else 16)
    d = 4 if row["precision"] == "fp32" else 2
    b, q = row["batch"], row["seq"]
    tokens = b * q
    h, i, heads = s["h"], s["inter"], s["heads"]
    if s["mt"] == "modernbert":
        per_layer = tokens * (12 * h + 6 * i) * d
        # eager: fp32 softmax + its cast; SDPA's sliding layers: the float window bias
        scores = b * heads * q * q * (4 + d) if row["attention"] == "eager" else b * q * q * d
    else:
        per_layer = tokens * (16 * h + 2 * i) * d
        # q·k, c2p/p2c gathers, their sum, masked scores, softmax, dropout; the gathered
        # heads×s×2·buckets products; the bool masks
        scores = b * heads * q * q * (6 * d + 4 + 1) + b * q * q * 6 \
            + 2 * b * heads * q * 2 * s["buckets"] * d
    if row["checkpointing"]:
        acts = s["layers"] * tokens * h * d + per_layer + 2 * scores
    else:
        acts = s["layers"] * (per_layer + scores) + scores
    logits = tokens * s["vocab"] * (d + 4 + 4 + 4)
    return states + acts + logits + 2e9


def draw(rng, mt, cfgs):
    while True:
        name = rng.choice(MODELS[mt])
        s = cfgs[name]
        attention = "eager"
        if mt == "modernbert":
            attention = rng.choices(["sdpa", "eager"], weights=[3, 1])[0]
        row = {
            "model": path(name),
            "model_type": mt,
            "batch": rng.choice([1, 2, 4, 8, 16]),
            "seq": rng.choice(SEQS[mt]),
            "precision": rng.choice(PRECISIONS),
            "optimizer": "adamw",
            "attention": attention,
            "loop": rng.choice(["plain", "trainer"]),
            "checkpointing": rng.random() < 0.5,
        }
        est = estimate(row, s)
        if est > LIMIT_BYTES:
            continue
        row["estimate_gb"] = round(est / 1e9, 1)
        return row


def covers(rows):
    for mt in MODELS:
        mine = [r for r in rows if r["model_type"] == mt]
        axes = [("precision", PRECISIONS), ("checkpointing", [False, True]),
                ("loop", ["plain", "trainer"]), ("model", [path(n) for n in MODELS[mt]])]
        if mt == "modernbert":
            axes.append(("attention", ["sdpa", "eager"]))
        for key, values in axes:
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
        rows = [draw(rng, mt, cfgs) for mt in MODELS for _ in range(ROWS_PER_TYPE)]
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
        r = {"grid_id": f"g30e-{i:02d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid30_encoder_configs.jsonl", fit),
                       ("grid30_encoder_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part))
    print(f"seed {seed}: {len(fit)} fit rows, {len(held)} untouched")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Pre-registered H200 measurement grid for issue 30's bart (BartForConditionalGeneration from
config.json): training steps measured by crates/device/runners/torch_runner.py (`measure`) and
compared with `vramlab validate`.

Measured in session 17 (tests/data/grid30/). Drawn at random with a fixed seed BEFORE any of it was measured or planned,
committed as drawn, for a later session that has the GPU (lab/run grid30_new runs
it). The rows in lab/grids/grid30_bart_untouched_configs.jsonl (a random third) are measured but
not looked at while the planner is fixed; their errors are quoted once, at the end, as they
came out.

    python3 lab/grids/make_grid30_bart.py   # writes lab/grids/grid30_bart_configs.jsonl and
                                        # lab/grids/grid30_bart_untouched_configs.jsonl (deterministic)

Axes: three configs (tests/data/hf_configs_device/bart-*.json: bart-base whole, bart-large cut
to 4 + 4 layers, bart-large-cnn cut to 3 + 3 layers, whose attention and activation dropouts
are 0), batch, source length `seq`, target length `target_seq` (labels (batch, target_seq),
shifted into the decoder inputs), precision (fp32, amp-bf16, bf16), activation checkpointing
(off / on), loop shape (plain: the output kept through backward; trainer: released before
backward), attention (sdpa mostly; eager for a quarter of the rows). AdamW, no accumulation.

Every precision, both checkpointing settings, both loop shapes, both attentions and every
config appear at least once (draws are repeated until that holds, with the seed advancing).

The constraint (fixed before drawing; a draw that breaks it is drawn again): a rough memory
estimate (weights, gradients and AdamW state; activations per token and layer; eager scores;
the logits, their final_logits_bias sum and the loss's fp32 copies) <= 35 GB; seq and
target_seq <= max_position_embeddings (1024).
"""
import json
import os
import random

SEED = 30_2026_12_05
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 12
LIMIT_BYTES = 35e9
MODELS = ["bart-base-L6", "bart-large-L4", "bart-large-cnn-L3"]
PRECISIONS = ["fp32", "amp-bf16", "bf16"]


def path(name):
    return f"tests/data/hf_configs_device/{name}.json"


def shape(cfg):
    return dict(d=cfg["d_model"], heads=cfg["encoder_attention_heads"], ffn=cfg["encoder_ffn_dim"],
                enc=cfg["encoder_layers"], dec=cfg["decoder_layers"], vocab=cfg["vocab_size"],
                maxpos=cfg.get("max_position_embeddings", 1024))


def params(s):
    d, f = s["d"], s["ffn"]
    enc = 4 * (d * d + d) + 2 * d * f + f + d + 4 * d
    dec = 8 * (d * d + d) + 2 * d * f + f + d + 6 * d
    return s["enc"] * enc + s["dec"] * dec + s["vocab"] * d + 2 * (s["maxpos"] + 2) * d + 4 * d


def estimate(row, s):
    """Bytes, rough: only to keep rows small enough for three at a time on one H200."""
    p = params(s)
    states = p * (8 if row["precision"] == "bf16" else 16)
    e = 4 if row["precision"] == "fp32" else 2
    b, S, T = row["batch"], row["seq"], row["target_seq"]
    act = b * S * s["enc"] * (14 * s["d"] + 4 * s["ffn"]) * e
    act += b * T * s["dec"] * (22 * s["d"] + 4 * s["ffn"]) * e
    if row["checkpointing"]:
        act = b * (S * s["enc"] + T * s["dec"]) * s["d"] * e
    scores = 0
    if row["attention"] == "eager":
        scores = b * s["heads"] * (S * S + 2 * T * T + T * S) * (4 + 4 + e) // 2
    logits = b * T * s["vocab"] * (e + 4 + 4 + 4)
    return states + act + scores + logits + 2e9


def draw(rng, cfgs):
    while True:
        name = rng.choice(MODELS)
        s = cfgs[name]
        row = {
            "model": path(name),
            "model_type": "bart",
            "batch": rng.choice([1, 2, 4, 8, 16, 32]),
            "seq": rng.choice([128, 256, 512, 1024]),
            "target_seq": rng.choice([32, 64, 128, 256, 512]),
            "precision": rng.choice(PRECISIONS),
            "optimizer": "adamw",
            "attention": rng.choices(["sdpa", "eager"], weights=[3, 1])[0],
            "loop": rng.choice(["plain", "trainer"]),
            "checkpointing": rng.random() < 0.5,
        }
        if max(row["seq"], row["target_seq"]) > s["maxpos"]:
            continue
        est = estimate(row, s)
        if est > LIMIT_BYTES:
            continue
        row["estimate_gb"] = round(est / 1e9, 1)
        return row


def covers(rows):
    for key, values in (("precision", PRECISIONS), ("checkpointing", [False, True]),
                        ("loop", ["plain", "trainer"]), ("attention", ["sdpa", "eager"]),
                        ("model", [path(n) for n in MODELS])):
        if {r[key] for r in rows} != set(values):
            return False
    return True


def main():
    cfgs = {}
    for n in MODELS:
        with open(os.path.join(ROOT, path(n))) as f:
            cfgs[n] = shape(json.load(f))
    seed = SEED
    while True:
        rng = random.Random(seed)
        rows = [draw(rng, cfgs) for _ in range(N_ROWS)]
        if covers(rows):
            break
        seed += 1
    rng.shuffle(rows)
    untouched = set(rng.sample(range(len(rows)), len(rows) // 3))
    fit, held = [], []
    for i, r in enumerate(rows):
        r = {"grid_id": f"g30-bart-{i:02d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid30_bart_configs.jsonl", fit), ("grid30_bart_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part))
    print(f"seed {seed}: {len(fit)} fit rows, {len(held)} untouched")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Pre-registered H200 measurement grid for issue 30's MoE model types (deepseek_v3,
gpt_oss): training steps of the config.json import, measured by
crates/device/runners/torch_runner.py (`measure`) and compared with `vramlab validate`.

Measured in session 17 (tests/data/grid30/). Drawn at random with a fixed seed BEFORE any of it was measured or planned,
committed as drawn, for a later session that has the GPU. The rows in
lab/grids/grid30_moe_untouched_configs.jsonl (a random third of each type's) are measured but not
looked at while the planner is fixed; their errors are quoted once, at the end, as they came
out.

    python3 lab/grids/make_grid30_moe.py  # writes lab/grids/grid30_moe_configs.jsonl and
                                      # lab/grids/grid30_moe_untouched_configs.jsonl (deterministic)

Axes: model type x a small config of two sizes per type (tests/data/hf_configs_device/, cut
from the public configs in tests/data/hf_configs/): layer-cut as lab/grids/make_grid30.py does, and
where one layer of the published model is too large for a row, expert-cut too (fewer routed
experts, every width, the router and the shared expert as published; DeepSeek-V3 keeps 2
experts per router group), batch, sequence length, precision (fp32, amp-bf16, bf16),
activation checkpointing (off / on), loop shape (plain / trainer), attention (deepseek_v3:
sdpa mostly, eager for a quarter of the rows; gpt_oss: eager always, as transformers 5.17
refuses SDPA for it). AdamW, no accumulation, full fine-tuning.

Each type appears with each precision, both checkpointing settings, both loop shapes and both
configs at least once (draws are repeated until that holds, with the seed advancing).

The constraint (fixed before drawing; a draw that breaks it is drawn again): a rough memory
estimate (weights, gradients and AdamW state; activations per token and layer, the routed
expert rows included; eager attention scores; the logits and the loss's fp32 copies)
<= 35 GB; seq <= max_position_embeddings.
"""
import json
import os
import random

SEED = 30_2026_12_05
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS_PER_TYPE = 12
LIMIT_BYTES = 35e9

MODELS = {  # type -> the two cut configs
    "deepseek_v3": ["Moonlight-16B-A3B-L2", "DeepSeek-V3-L1-E16"],
    "gpt_oss": ["gpt-oss-120b-L2-E8", "gpt-oss-20b-L1"],
}
PRECISIONS = ["fp32", "amp-bf16", "bf16"]


def path(name):
    return f"tests/data/hf_configs_device/{name}.json"


def shape(cfg):
    """Parameters and per-token activation elements of one config, roughly."""
    mt = cfg["model_type"]
    h, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    if mt == "deepseek_v3":
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        v = cfg["v_head_dim"]
        kvr = cfg["kv_lora_rank"]
        qr = cfg.get("q_lora_rank")
        q = h * qr + qr * heads * qk if qr else h * heads * qk
        attn = q + h * (kvr + cfg["qk_rope_head_dim"]) + kvr * heads * (qk - cfg["qk_rope_head_dim"] + v) \
            + heads * v * h
        e, k, inter = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        shared = inter * cfg["n_shared_experts"]
        dense = min(cfg["first_k_dense_replace"], layers)
        moe = 3 * h * inter * e + 3 * h * shared + e * h
        p = layers * attn + dense * 3 * h * cfg["intermediate_size"] + (layers - dense) * moe
        act_attn = heads * (3 * qk + 2 * (qk - cfg["qk_rope_head_dim"] + v) + v) + 8 * h
        act_moe = k * (2 * h + 4 * inter) + 4 * shared + e * 4
        act = layers * act_attn + dense * 4 * cfg["intermediate_size"] + (layers - dense) * act_moe
    else:
        hd = cfg["head_dim"]
        kvh = cfg["num_key_value_heads"]
        e, k, inter = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]
        attn = h * (heads + 2 * kvh) * hd + heads * hd * h + heads
        moe = e * (3 * h * inter + 2 * inter + h) + e * h + e
        p = layers * (attn + moe)
        act = layers * (heads * hd * 6 + 8 * h + k * (3 * h + 8 * inter))
    p += 2 * vocab * h
    return dict(params=p, act=act, heads=heads, layers=layers, vocab=vocab, mt=mt,
                maxpos=cfg.get("max_position_embeddings", 4096))


def estimate(row, s):
    """Bytes, rough: only to keep rows on one H200 beside two others."""
    states = s["params"] * (8 if row["precision"] == "bf16" else 16)
    d = 4 if row["precision"] == "fp32" else 2
    tokens = row["batch"] * row["seq"]
    acts = tokens * s["act"] * (4 if row["precision"] != "bf16" else 2)
    if row["checkpointing"]:
        acts = tokens * s["layers"] * 4096 * d + acts / s["layers"]
    scores = 0
    if row["attention"] == "eager":
        scores = row["batch"] * s["heads"] * row["seq"] ** 2 * (4 + 4 + 4 + d)
    logits = tokens * s["vocab"] * (d + 4 + 4 + 4)
    return states + acts + scores + logits + 2e9


def draw(rng, mt, cfgs):
    while True:
        name = rng.choice(MODELS[mt])
        s = cfgs[name]
        row = {
            "model": path(name),
            "model_type": mt,
            "batch": rng.choice([1, 2, 4, 8]),
            "seq": rng.choice([256, 512, 1024, 2048]),
            "precision": rng.choice(PRECISIONS),
            "optimizer": "adamw",
            "attention": "eager" if mt == "gpt_oss"
            else rng.choices(["sdpa", "eager"], weights=[3, 1])[0],
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
        r = {"grid_id": f"g30moe-{i:02d}", "split": "untouched" if i in untouched else "fit", **r}
        (held if i in untouched else fit).append(r)
    for name, part in (("grid30_moe_configs.jsonl", fit),
                       ("grid30_moe_untouched_configs.jsonl", held)):
        with open(os.path.join(ROOT, "lab", "grids", name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part))
    print(f"seed {seed}: {len(fit)} fit rows, {len(held)} untouched")
    for n, s in cfgs.items():
        print(f"  {n}: {s['params'] / 1e9:.2f} B params (rough)")


if __name__ == "__main__":
    main()

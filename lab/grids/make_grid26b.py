#!/usr/bin/env python3
"""Pre-registered measurement grid for issue 26, part 2: multi-GPU ranks, models captured on
a CPU-only machine, and more max-batch searches under memory caps.

Drawn at random with a fixed seed BEFORE any of it was measured or planned, committed as
drawn; rows with `"split": "untouched"` (a random third of each part) are measured but not
looked at while fixing the planner: their results go to tests/data/grid26b/*untouched*
and are quoted once, at the end, as they came out.

    python3 lab/grids/make_grid26b.py     # writes lab/grids/grid26b_*.jsonl (deterministic)

Parts:
- ranks (30): strategy (FSDP2, DDP, PyTorch ZeRO-1, DeepSpeed ZeRO-1/2/3), world size, model,
  precision, checkpointing, loop shape, batch x sequence, accumulation, the strategy's own
  knobs (FSDP2 reshard_after_forward / MixedPrecisionPolicy, DDP bucket view). Rank 0 of a
  world of N under the fake process group (DDP: world 1 under NCCL), as crates/device/runners/dist_runner.py
  and crates/device/runners/ds_runner.py run them. Constraint fixed before drawing: tokens per micro-batch
  <= 8192.
- captures (12): models not in tests/data/captured yet (timm, torchvision) and two new
  hand-written modules (lab/models/handwritten_models.py), with precision, loop shape,
  checkpointing (timm only), image side and two measured batches drawn. Captured on the
  CPU-only machine with `vramlab capture` defaults; captured again and measured on the GPU
  host with runners/capture.py --measure.
- caps (8): LoRA / QLoRA max-batch searches under 24 / 48 / 80 GiB caps (at least three of
  them checkpointed LoRA and two QLoRA, forced before drawing the rest of the row).
"""
import json
import os
import random

SEED = 2026_12_04_2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK_MODELS = [
    "tests/data/hf_configs_device/gpt2-L12.json",
    "tests/data/hf_configs_device/Llama-3.2-1B-L4.json",
    "tests/data/hf_configs_device/Qwen2.5-0.5B-L4.json",
    "tests/data/hf_configs_device/Qwen3-0.6B-L4.json",
    "tests/data/hf_configs_device/gemma-2-2b-L3.json",
    "tests/data/hf_configs_device/Mistral-7B-v0.3-L2.json",
    "tests/data/hf_configs_device/Phi-3-mini-4k-instruct-L3.json",
    "tests/data/grid26/configs/TinyLlama-1.1B.json",
    "tests/data/hf_configs/Qwen2.5-0.5B.json",
]

CAPTURE_POOL = [  # (source args, fixed image or None)
    ("--timm resnet50", None), ("--timm efficientnet_b0", None),
    ("--timm mobilenetv3_large_100", None), ("--timm densenet121", None),
    ("--timm resnext50_32x4d", None), ("--timm ghostnet_100", None),
    ("--timm levit_128", 224), ("--timm swinv2_tiny_window8_256", 256),
    ("--timm edgenext_small", None), ("--timm efficientformer_l1", 224),
    ("--timm nfnet_l0", None), ("--timm vit_small_patch16_224", 224),
    ("--timm regnetx_032", None), ("--timm dla34", None),
    ("--timm repvgg_a2", None), ("--timm fastvit_t8", None),
    ("--timm tiny_vit_5m_224", 224), ("--timm pvt_v2_b1", 224),
    ("--timm rexnet_100", None), ("--timm xcit_tiny_12_p16_224", 224),
    ("--torchvision fcn_resnet50", None), ("--torchvision shufflenet_v2_x1_0", None),
]
HANDWRITTEN = [
    ("--module lab/models/handwritten_models.py:seg_unet", None),
    ("--module lab/models/handwritten_models.py:spec_conformer", "1x80x256"),
]

CAP_MODELS = [
    ("tests/data/grid26/configs/TinyLlama-1.1B.json", "mid"),
    ("tests/data/hf_configs/Qwen2.5-0.5B.json", "small"),
    ("tests/data/hf_configs/Llama-3.2-1B.json", "mid"),
    ("tests/data/hf_configs/gemma-2-2b.json", "mid"),
    ("tests/data/grid26/configs/Llama-2-7b-hf.json", "large"),
    ("tests/data/hf_configs/Mistral-7B-v0.3.json", "large"),
    ("tests/data/hf_configs/Qwen2.5-7B.json", "large"),
]


def pick(rng, items, weights=None):
    return rng.choices(items, weights=weights, k=1)[0]


def draw_rank(rng):
    while True:
        model = pick(rng, RANK_MODELS)
        strategy = pick(rng, ["fsdp2", "ddp", "torch-zero1", "zero1", "zero2", "zero3"],
                        [0.3, 0.14, 0.14, 0.12, 0.15, 0.15])
        batch = pick(rng, [1, 2, 4, 8])
        seq = pick(rng, [256, 512, 1024, 2048])
        if "gpt2" in model and seq > 1024:
            continue
        if batch * seq > 8192:
            continue
        row = {"model": model, "batch": batch, "seq": seq,
               "optimizer": "adamw", "accum": pick(rng, [1, 1, 1, 2]),
               "checkpointing": rng.random() < 0.45, "attention": "sdpa",
               "loop": pick(rng, ["plain", "trainer"], [0.6, 0.4])}
        if strategy == "fsdp2":
            row["precision"] = pick(rng, ["fp32", "bf16"], [0.6, 0.4])
            row["gpus"] = pick(rng, [2, 4, 8])
            row["reshard_after_forward"] = rng.random() < 0.6
            row["fsdp_mixed_precision"] = pick(rng, [None, "bf16"]) if row["precision"] == "fp32" else None
        elif strategy == "ddp":
            row["precision"] = pick(rng, ["fp32", "amp-bf16", "amp-fp16"], [0.4, 0.4, 0.2])
            row["gpus"] = 1
            row["bucket_cap_mb"] = 25
            row["gradient_as_bucket_view"] = rng.random() < 0.4
        elif strategy == "torch-zero1":
            row["precision"] = pick(rng, ["fp32", "amp-bf16"])
            row["gpus"] = pick(rng, [2, 4, 8])
            row["bucket_cap_mb"] = 25
            row["gradient_as_bucket_view"] = False
        else:
            row["precision"] = pick(rng, ["bf16", "fp32"], [0.65, 0.35])
            row["gpus"] = pick(rng, [2, 4, 8])
        row["strategy"] = strategy
        return row


def draw_capture(rng, source, image):
    precision = pick(rng, ["amp-bf16", "fp32", "amp-fp16", "bf16"], [0.45, 0.25, 0.15, 0.15])
    loop = pick(rng, ["plain", "trainer"], [0.65, 0.35])
    ckpt = source.startswith("--timm") and rng.random() < 0.3
    small = pick(rng, [4, 8, 16])
    large = small * pick(rng, [2, 4])
    row = {"source": source, "precision": precision, "loop": loop, "checkpointing": ckpt,
           "measure": [small, large]}
    if source.endswith("spec_conformer"):
        row["input"] = image
    else:
        row["image"] = image or pick(rng, [160, 224, 256])
    return row


def draw_cap(rng, forced):
    while True:
        path, size = pick(rng, CAP_MODELS)
        ft, ckpt = forced
        if ft == "lora":
            precision = pick(rng, ["bf16", "amp-bf16", "fp32"], [0.6, 0.3, 0.1])
            optimizer = "adamw"
        else:
            precision = pick(rng, ["fp32", "bf16"], [0.5, 0.5])
            optimizer = pick(rng, ["adamw", "paged-adamw-8bit"], [0.7, 0.3])
        cap = pick(rng, [24, 48, 80])
        if size == "large" and ft == "lora" and precision != "bf16" and cap < 80:
            continue  # 7B LoRA weights in fp32 (28 GB) cannot fit a 24/48 GiB cap at all
        seq = pick(rng, [512, 1024, 2048])
        row = {"model": path, "seq": seq, "precision": precision, "optimizer": optimizer,
               "accum": 1, "checkpointing": ckpt, "attention": "sdpa",
               "loop": pick(rng, ["plain", "trainer"], [0.6, 0.4]), "cap_gib": cap,
               "finetune": ft, "lora_rank": pick(rng, [8, 16, 64]),
               "lora_targets": pick(rng, ["attn", "all-linear"]), "lora_dropout": 0.05}
        if ft == "qlora":
            row["quant"] = "nf4"
            row["double_quant"] = True
        return row


def main():
    rng = random.Random(SEED)
    ranks = [draw_rank(rng) for _ in range(30)]
    chosen = rng.sample(CAPTURE_POOL, 10) + HANDWRITTEN
    caps_forced = [("lora", True)] * 3 + [("qlora", rng.random() < 0.5) for _ in range(2)] + \
        [(pick(rng, ["lora", "qlora"]), rng.random() < 0.5) for _ in range(3)]
    captures = [draw_capture(rng, s, img) for s, img in chosen]
    caps = [draw_cap(rng, f) for f in caps_forced]
    out = {}
    for part, rows, prefix in (("ranks", ranks, "r26b"), ("captures", captures, "x26b"),
                               ("caps", caps, "c26b")):
        untouched = set(rng.sample(range(len(rows)), len(rows) // 3))
        for i, r in enumerate(rows):
            r["grid_id"] = f"{prefix}-{i:02d}"
            r["split"] = "untouched" if i in untouched else "fit"
        out[part] = rows
    for part, rows in out.items():
        with open(os.path.join(ROOT, "lab", "grids", f"grid26b_{part}.jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        print(part, len(rows), "untouched", sum(r["split"] == "untouched" for r in rows))


if __name__ == "__main__":
    main()

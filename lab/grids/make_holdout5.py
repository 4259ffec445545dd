#!/usr/bin/env python3
"""Writes lab/grids/holdout5_configs.jsonl: configurations drawn at random (seed 5) before any of
them was measured, to check the planner on configurations it was never tuned on.

    python3 lab/grids/make_holdout5.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
R = random.Random(5)
PREC = ["fp32", "amp-fp16", "amp-bf16", "bf16"]
OPT = ["sgd", "sgd-momentum", "adam", "adamw"]

# (model, image sizes, batch range) sized to stay far below the H200's 141 GB.
CNN = [
    ("resnet18", [160, 224, 256], (32, 384)), ("resnet34", [192, 224], (32, 256)),
    ("resnet50", [176, 224, 256], (16, 192)), ("resnet101", [224], (16, 128)),
    ("resnet152", [192, 224], (8, 96)), ("efficientnet_b0", [224, 256], (32, 192)),
    ("efficientnet_b2", [260, 288], (16, 96)), ("efficientnet_b4", [320, 380], (8, 40)),
    ("mobilenet_v3_large", [224, 288], (64, 384)), ("mobilenet_v3_small", [224], (64, 512)),
    ("convnext_tiny", [224, 256], (16, 128)), ("convnext_small", [192, 224], (16, 96)),
]
SEG = [
    ("deeplabv3_resnet50", [384, 512], (2, 16)), ("deeplabv3_resnet101", [384, 512], (2, 12)),
    ("fcn_resnet50", [384, 448, 512], (2, 16)), ("unet", [192, 256, 320, 384], (4, 32)),
]
VIT = [("vit_b_16", [224], (16, 160)), ("vit_b_32", [224, 288], (32, 256)), ("vit_l_16", [224], (8, 32))]
LM = [("gpt2", [512, 1024], (4, 24)), ("gpt2-medium", [512, 1024], (2, 8)),
      ("bert-base-uncased", [256, 512], (8, 48)), ("TinyLlama-1.1B", [512, 1024], (1, 4))]


def draw(family, n, image=True):
    out = []
    for _ in range(n):
        m, sizes, (lo, hi) = R.choice(family)
        d = {"model": m, "batch": R.randint(lo, hi)}
        d["image" if image else "seq"] = R.choice(sizes)
        d["precision"] = R.choice(PREC)
        d["optimizer"] = R.choice(OPT)
        d["accum"] = 2 if R.random() < 0.15 else 1
        d["checkpointing"] = R.random() < 0.2
        if not image:
            d["attention"] = "sdpa"
        out.append(d)
    return out


configs = draw(CNN, 22) + draw(SEG, 10) + draw(VIT, 6) + draw(LM, 6, image=False)
configs.sort(key=lambda d: (d["model"], d["precision"] == "bf16", d["checkpointing"]))
with open(os.path.join(HERE, "holdout5_configs.jsonl"), "w") as f:
    for d in configs:
        f.write(json.dumps(d) + "\n")
print(len(configs), "configs")

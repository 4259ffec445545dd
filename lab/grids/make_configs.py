#!/usr/bin/env python3
"""Writes lab/grids/calibration_configs.jsonl and lab/grids/holdout_configs.jsonl.

Standard library only. Configs are grouped by model and, within a model, by
(precision dtype, attention, checkpointing) so torch_runner.py rebuilds the model
as rarely as possible. Every config is sized to peak well under ~100 GB on an
H200 (141 GB).

    python3 lab/grids/make_configs.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def c(model, batch, precision="fp32", optimizer="adamw", accum=1, checkpointing=False, attention=None,
      image=None, seq=None):
    d = {"model": model, "batch": batch}
    if image is not None:
        d["image"] = image
    if seq is not None:
        d["seq"] = seq
    d.update({"precision": precision, "optimizer": optimizer, "accum": accum, "checkpointing": checkpointing})
    if attention is not None:
        d["attention"] = attention
    return d


def calibration():
    out = []
    # ---- ResNet ----
    m = "resnet50"
    out += [c(m, b) for b in (16, 64, 128)]
    out += [c(m, 64, optimizer=o) for o in ("sgd", "sgd-momentum", "adam", "adafactor")]
    out += [c(m, 32, accum=4)]
    out += [c(m, b, "amp-bf16") for b in (64, 128, 256)]
    out += [c(m, 128, "amp-fp16", "sgd-momentum"), c(m, 128, "amp-fp16", "adam")]
    out += [c(m, b, "bf16") for b in (64, 128)]
    out += [c(m, 64, checkpointing=True), c(m, 128, "amp-bf16", checkpointing=True)]
    m = "resnet18"
    out += [c(m, b) for b in (32, 128, 256)]
    out += [c(m, 128, "amp-fp16", "sgd"), c(m, 128, "amp-bf16", "adam"), c(m, 256, "amp-bf16", "adam"),
            c(m, 128, "bf16", "sgd-momentum"), c(m, 64, accum=4), c(m, 128, checkpointing=True)]
    m = "resnet152"
    out += [c(m, 16), c(m, 64), c(m, 128, "amp-bf16"), c(m, 64, checkpointing=True)]

    # ---- GPT-2 ----
    m = "gpt2"
    out += [c(m, b, attention="sdpa") for b in (4, 8, 16)]
    out += [c(m, 8, optimizer=o, attention="sdpa") for o in ("sgd", "adafactor")]
    out += [c(m, 4, accum=4, attention="sdpa"), c(m, 16, seq=512, attention="sdpa")]
    out += [c(m, b, "amp-bf16", attention="sdpa") for b in (8, 16, 32)]
    out += [c(m, 16, "amp-fp16", attention="sdpa"), c(m, 16, "amp-fp16", "sgd-momentum", attention="sdpa")]
    out += [c(m, b, "bf16", attention="sdpa") for b in (8, 16)]
    out += [c(m, 16, checkpointing=True, attention="sdpa"), c(m, 32, "amp-bf16", checkpointing=True,
                                                             attention="sdpa")]
    out += [c(m, b, attention="eager") for b in (4, 8)]
    out += [c(m, b, "amp-bf16", attention="eager") for b in (8, 16)]
    out += [c(m, 8, "bf16", attention="eager")]
    m = "gpt2-medium"
    out += [c(m, 4, attention="sdpa"), c(m, 8, attention="sdpa"), c(m, 16, "amp-bf16", attention="sdpa"),
            c(m, 16, "amp-bf16", checkpointing=True, attention="sdpa"),
            c(m, 8, "amp-bf16", attention="eager")]

    # ---- TinyLlama ----
    m = "TinyLlama-1.1B"
    out += [c(m, 1, attention="sdpa"), c(m, 4, attention="sdpa"), c(m, 4, optimizer="sgd", attention="sdpa")]
    out += [c(m, 4, "amp-bf16", attention="sdpa"), c(m, 8, "amp-bf16", attention="sdpa"),
            c(m, 4, "amp-bf16", "adafactor", attention="sdpa"), c(m, 4, "amp-fp16", attention="sdpa"),
            c(m, 2, "amp-bf16", accum=4, attention="sdpa")]
    out += [c(m, 4, "bf16", attention="sdpa"), c(m, 8, "bf16", attention="sdpa"),
            c(m, 8, "bf16", "sgd", attention="sdpa")]
    out += [c(m, 8, "amp-bf16", checkpointing=True, attention="sdpa"),
            c(m, 16, "amp-bf16", checkpointing=True, attention="sdpa")]
    # eager attention keeps ~6 bytes per (layer, head, query, key) element: b4 would peak ~105 GiB
    out += [c(m, 2, "amp-bf16", attention="eager"), c(m, 3, "amp-bf16", attention="eager"),
            c(m, 3, "bf16", attention="eager")]

    # ---- Llama-2-7B: pure bf16 only ----
    m = "Llama-2-7b-hf"
    out += [c(m, b, "bf16", "sgd", attention="sdpa") for b in (1, 2, 4)]
    out += [c(m, 1, "bf16", "adamw", attention="sdpa")]
    out += [c(m, 4, "bf16", "sgd", checkpointing=True, attention="sdpa"),
            c(m, 8, "bf16", "sgd", checkpointing=True, attention="sdpa")]
    out += [c(m, 1, "bf16", "sgd", attention="eager")]

    # ---- ViT ----
    m = "vit_b_16"
    out += [c(m, 32), c(m, 128), c(m, 64, optimizer="sgd"), c(m, 32, accum=4)]
    out += [c(m, 128, "amp-bf16"), c(m, 256, "amp-bf16"), c(m, 128, "amp-fp16")]
    out += [c(m, 128, "bf16")]
    out += [c(m, 128, checkpointing=True), c(m, 256, "amp-bf16", checkpointing=True)]
    m = "vit_l_16"
    out += [c(m, 16), c(m, 64), c(m, 64, "amp-bf16"), c(m, 64, "bf16"), c(m, 64, checkpointing=True)]

    # ---- BERT ----
    m = "bert-base-uncased"
    out += [c(m, 8, attention="sdpa"), c(m, 32, attention="sdpa"), c(m, 8, accum=4, attention="sdpa")]
    out += [c(m, 32, "amp-bf16", attention="sdpa"), c(m, 64, "amp-bf16", attention="sdpa"),
            c(m, 32, "amp-fp16", attention="sdpa")]
    out += [c(m, 32, "bf16", attention="sdpa")]
    out += [c(m, 64, "amp-bf16", checkpointing=True, attention="sdpa")]
    out += [c(m, 32, "amp-bf16", attention="eager")]

    # ---- EfficientNet / MobileNet ----
    m = "efficientnet_b0"
    out += [c(m, 32), c(m, 128), c(m, 128, "amp-bf16"), c(m, 256, "amp-bf16"), c(m, 128, "bf16"),
            c(m, 128, checkpointing=True)]
    m = "efficientnet_b4"
    out += [c(m, 16), c(m, 64), c(m, 16, image=380), c(m, 64, "amp-bf16"), c(m, 64, checkpointing=True)]
    m = "mobilenet_v3_large"
    out += [c(m, 64), c(m, 256), c(m, 256, "amp-fp16"), c(m, 256, "bf16", "sgd"),
            c(m, 256, checkpointing=True)]

    # ---- ConvNeXt ----
    m = "convnext_tiny"
    out += [c(m, 32), c(m, 128), c(m, 64, optimizer="adafactor"), c(m, 128, "amp-bf16"), c(m, 128, "bf16"),
            c(m, 128, checkpointing=True)]
    m = "convnext_base"
    out += [c(m, 16), c(m, 64), c(m, 64, "amp-bf16"), c(m, 128, "amp-bf16"), c(m, 64, checkpointing=True)]

    # ---- Segmentation ----
    m = "deeplabv3_resnet50"
    out += [c(m, 2), c(m, 8), c(m, 16), c(m, 16, image=256), c(m, 16, "amp-bf16"),
            c(m, 16, checkpointing=True)]
    m = "fcn_resnet50"
    out += [c(m, 2), c(m, 8), c(m, 16), c(m, 16, "amp-bf16"), c(m, 8, checkpointing=True)]
    m = "unet"
    out += [c(m, 4), c(m, 16), c(m, 32), c(m, 8, image=512), c(m, 32, "amp-bf16"), c(m, 32, "bf16"),
            c(m, 32, checkpointing=True)]
    return out


def holdout():
    out = []
    out += [c("resnet34", 48), c("resnet34", 96, "amp-bf16", "sgd-momentum")]
    out += [c("resnet101", 40), c("resnet101", 80, "amp-fp16", "sgd-momentum"),
            c("resnet101", 64, checkpointing=True)]
    out += [c("resnet50", 100, image=160), c("resnet50", 24, image=288, precision="amp-bf16")]
    out += [c("efficientnet_b2", 48), c("efficientnet_b2", 96, "amp-bf16", checkpointing=True),
            c("efficientnet_b3", 40, image=300, precision="amp-bf16")]
    out += [c("mobilenet_v3_small", 200), c("mobilenet_v3_small", 500, "amp-bf16", "adam")]
    out += [c("convnext_small", 24), c("convnext_small", 72, "amp-bf16"), c("convnext_small", 48, "bf16")]
    out += [c("vit_b_32", 100), c("vit_b_32", 300, "amp-bf16", "sgd-momentum"),
            c("vit_b_16", 96, image=288, precision="amp-bf16")]
    out += [c("deeplabv3_resnet101", 6), c("deeplabv3_resnet101", 12, "amp-bf16"),
            c("deeplabv3_resnet101", 10, checkpointing=True)]
    out += [c("fcn_resnet50", 5, "amp-fp16", "sgd-momentum"), c("unet", 6, image=384),
            c("unet", 20, "amp-bf16", "adam")]
    out += [c("gpt2", 24, seq=512, precision="amp-bf16", attention="sdpa"),
            c("gpt2", 12, "amp-fp16", "adam", attention="eager")]
    out += [c("gpt2-large", 3, attention="sdpa"), c("gpt2-large", 6, "amp-bf16", attention="sdpa"),
            c("gpt2-large", 12, "amp-bf16", checkpointing=True, attention="sdpa"),
            c("gpt2-large", 4, "amp-bf16", attention="eager")]
    out += [c("gpt2-xl", 4, "bf16", "adamw", attention="sdpa")]
    out += [c("bert-large-uncased", 12, attention="sdpa"), c("bert-large-uncased", 24, "amp-bf16", attention="sdpa"),
            c("bert-large-uncased", 40, "amp-bf16", checkpointing=True, attention="sdpa"),
            c("bert-base-uncased", 48, seq=256, precision="amp-fp16", attention="eager")]
    out += [c("TinyLlama-1.1B", 6, seq=1024, precision="amp-bf16", optimizer="adam", attention="sdpa"),
            c("TinyLlama-1.1B", 3, "bf16", "adamw", attention="sdpa")]
    out += [c("Meta-Llama-3-8B", 1, "bf16", "sgd", attention="sdpa"),
            c("Meta-Llama-3-8B", 2, "bf16", "sgd", attention="sdpa"),
            c("Meta-Llama-3-8B", 4, "bf16", "sgd", checkpointing=True, attention="sdpa")]
    out += [c("Llama-2-13b-hf", 1, "bf16", "sgd", attention="sdpa"),
            c("Llama-2-13b-hf", 2, "bf16", "sgd", checkpointing=True, attention="sdpa")]
    return out


def group(configs):
    """Stable grouping by model, then by what forces a rebuild (dtype, attention, checkpointing)."""
    model_order = {}
    key_order = {}
    for i, cfg in enumerate(configs):
        model_order.setdefault(cfg["model"], i)
        key = (cfg["model"], cfg["precision"] == "bf16", cfg.get("attention"), cfg["checkpointing"],
               cfg.get("image"))
        key_order.setdefault(key, i)
    def sort_key(ic):
        i, cfg = ic
        key = (cfg["model"], cfg["precision"] == "bf16", cfg.get("attention"), cfg["checkpointing"],
               cfg.get("image"))
        return (model_order[cfg["model"]], key_order[key], i)
    return [cfg for _, cfg in sorted(enumerate(configs), key=sort_key)]


def write(name, configs):
    path = os.path.join(HERE, name)
    with open(path, "w") as f:
        for cfg in configs:
            f.write(json.dumps(cfg) + "\n")
    print(f"{path}: {len(configs)} configs")


if __name__ == "__main__":
    write("calibration_configs.jsonl", group(calibration()))
    write("holdout_configs.jsonl", group(holdout()))

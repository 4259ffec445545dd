#!/usr/bin/env python3
"""Writes presets/models/<id>.json for the built-in model presets.

Standard library only. The values mirror torchvision's builder functions
(weights=None) and the well-known Hugging Face configs; crates/device/runners/torch_runner.py
`count` checks them against the real PyTorch modules.

    python3 lab/cpu/make_presets.py            # (re)write all preset files
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "presets", "models")


def image(size=224):
    return {"kind": "image", "image_size": size, "channels": 3}


def tokens(seq_len):
    return {"kind": "tokens", "seq_len": seq_len}


def presets():
    out = []

    # ---------------- ResNet (torchvision.models.resnet) ----------------
    for depth, block, layers in [
        (18, "basic", [2, 2, 2, 2]),
        (34, "basic", [3, 4, 6, 3]),
        (50, "bottleneck", [3, 4, 6, 3]),
        (101, "bottleneck", [3, 4, 23, 3]),
        (152, "bottleneck", [3, 8, 36, 3]),
    ]:
        out.append({
            "id": f"resnet{depth}",
            "family": "resnet",
            "display_name": f"ResNet-{depth}",
            "reference": f"torchvision.models.resnet{depth}",
            "input": image(224),
            "params": {"block": block, "layers": layers, "num_classes": 1000,
                       "groups": 1, "width_per_group": 64},
        })

    # ---------------- EfficientNet B0..B7 ----------------
    # torchvision.models.efficientnet.efficientnet_bN: (width_mult, depth_mult, dropout);
    # stochastic_depth_prob is EfficientNet's default 0.2. b5..b7 also pass
    # norm_layer=partial(nn.BatchNorm2d, eps=0.001, momentum=0.01) (same parameter count).
    eff = [(1.0, 1.0, 0.2), (1.0, 1.1, 0.2), (1.1, 1.2, 0.3), (1.2, 1.4, 0.3),
           (1.4, 1.8, 0.4), (1.6, 2.2, 0.4), (1.8, 2.6, 0.5), (2.0, 3.1, 0.5)]
    for i, (w, d, p) in enumerate(eff):
        out.append({
            "id": f"efficientnet_b{i}",
            "family": "efficientnet",
            "display_name": f"EfficientNet-B{i}",
            "reference": f"torchvision.models.efficientnet_b{i}",
            "input": image(224),
            "params": {"width_mult": w, "depth_mult": d, "dropout": p,
                       "stochastic_depth_prob": 0.2, "num_classes": 1000},
        })

    # ---------------- MobileNetV3 ----------------
    for arch in ["small", "large"]:
        out.append({
            "id": f"mobilenet_v3_{arch}",
            "family": "mobilenet_v3",
            "display_name": f"MobileNetV3-{arch.capitalize()}",
            "reference": f"torchvision.models.mobilenet_v3_{arch}",
            "input": image(224),
            "params": {"arch": arch, "width_mult": 1.0, "dropout": 0.2, "num_classes": 1000},
        })

    # ---------------- ConvNeXt ----------------
    for name, channels, depths, sd in [
        ("tiny", [96, 192, 384, 768], [3, 3, 9, 3], 0.1),
        ("small", [96, 192, 384, 768], [3, 3, 27, 3], 0.4),
        ("base", [128, 256, 512, 1024], [3, 3, 27, 3], 0.5),
    ]:
        out.append({
            "id": f"convnext_{name}",
            "family": "convnext",
            "display_name": f"ConvNeXt-{name.capitalize()}",
            "reference": f"torchvision.models.convnext_{name}",
            "input": image(224),
            "params": {"channels": channels, "depths": depths,
                       "stochastic_depth_prob": sd, "num_classes": 1000},
        })

    # ---------------- ViT ----------------
    for vid, name, patch, layers, heads, hidden, mlp in [
        ("vit_b_16", "ViT-B/16", 16, 12, 12, 768, 3072),
        ("vit_b_32", "ViT-B/32", 32, 12, 12, 768, 3072),
        ("vit_l_16", "ViT-L/16", 16, 24, 16, 1024, 4096),
        ("vit_h_14", "ViT-H/14", 14, 32, 16, 1280, 5120),
    ]:
        out.append({
            "id": vid,
            "family": "vit",
            "display_name": name,
            "reference": f"torchvision.models.{vid}",
            "input": image(224),
            "params": {"patch_size": patch, "num_layers": layers, "num_heads": heads,
                       "hidden_dim": hidden, "mlp_dim": mlp, "dropout": 0.0,
                       "attention_dropout": 0.0, "num_classes": 1000},
        })

    # ---------------- Segmentation ----------------
    for fam, disp, mod in [("deeplabv3", "DeepLabV3", "torchvision.models.segmentation.deeplabv3"),
                           ("fcn", "FCN", "torchvision.models.segmentation.fcn")]:
        for depth, layers in [(50, [3, 4, 6, 3]), (101, [3, 4, 23, 3])]:
            pid = f"{fam}_resnet{depth}"
            if pid == "fcn_resnet101":
                continue  # not in the built-in list
            out.append({
                "id": pid,
                "family": fam,
                "display_name": f"{disp} ResNet-{depth}",
                "reference": f"{mod}_resnet{depth}",
                "input": image(512),
                "params": {"backbone_layers": layers, "num_classes": 21},
            })

    out.append({
        "id": "unet",
        "family": "unet",
        "display_name": "U-Net",
        "reference": "crates/device/runners/torch_runner.py UNet (see presets/README.md, UNet reference)",
        "input": image(256),
        "params": {"depth": 4, "base_channels": 64, "in_channels": 3, "num_classes": 2},
    })

    # ---------------- GPT-2 ----------------
    for gid, disp, embd, layers, heads in [
        ("gpt2", "GPT-2 (124M)", 768, 12, 12),
        ("gpt2-medium", "GPT-2 Medium", 1024, 24, 16),
        ("gpt2-large", "GPT-2 Large", 1280, 36, 20),
        ("gpt2-xl", "GPT-2 XL", 1600, 48, 25),
    ]:
        out.append({
            "id": gid,
            "family": "gpt2",
            "display_name": disp,
            "reference": f"transformers.GPT2LMHeadModel ({gid} config)",
            "input": tokens(1024),
            "params": {"vocab_size": 50257, "n_positions": 1024, "n_embd": embd,
                       "n_layer": layers, "n_head": heads, "n_inner": None,
                       "activation_function": "gelu_new", "resid_pdrop": 0.1,
                       "embd_pdrop": 0.1, "attn_pdrop": 0.1, "tie_word_embeddings": True},
        })

    # ---------------- BERT ----------------
    for bid, disp, hidden, layers, heads, inter in [
        ("bert-base-uncased", "BERT-Base (uncased)", 768, 12, 12, 3072),
        ("bert-large-uncased", "BERT-Large (uncased)", 1024, 24, 16, 4096),
    ]:
        out.append({
            "id": bid,
            "family": "bert",
            "display_name": disp,
            "reference": f"transformers.BertForMaskedLM ({bid} config)",
            "input": tokens(512),
            "params": {"vocab_size": 30522, "hidden_size": hidden, "num_hidden_layers": layers,
                       "num_attention_heads": heads, "intermediate_size": inter,
                       "max_position_embeddings": 512, "type_vocab_size": 2,
                       "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
        })

    # ---------------- Llama ----------------
    for lid, disp, hidden, inter, layers, heads, kv, vocab, maxpos in [
        ("TinyLlama-1.1B", "TinyLlama 1.1B", 2048, 5632, 22, 32, 4, 32000, 2048),
        ("Llama-2-7b-hf", "Llama 2 7B", 4096, 11008, 32, 32, 32, 32000, 4096),
        ("Llama-2-13b-hf", "Llama 2 13B", 5120, 13824, 40, 40, 40, 32000, 4096),
        ("Meta-Llama-3-8B", "Llama 3 8B", 4096, 14336, 32, 32, 8, 128256, 8192),
    ]:
        out.append({
            "id": lid,
            "family": "llama",
            "display_name": disp,
            "reference": f"transformers.LlamaForCausalLM ({lid} config)",
            "input": tokens(2048),
            "params": {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
                       "num_hidden_layers": layers, "num_attention_heads": heads,
                       "num_key_value_heads": kv, "max_position_embeddings": maxpos,
                       "tie_word_embeddings": False, "attention_dropout": 0.0},
        })
    return out


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    ps = presets()
    for p in ps:
        path = os.path.join(OUT_DIR, p["id"] + ".json")
        with open(path, "w") as f:
            json.dump(p, f, indent=2)
            f.write("\n")
    print(f"wrote {len(ps)} presets to {OUT_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()

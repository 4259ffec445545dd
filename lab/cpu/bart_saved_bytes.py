#!/usr/bin/env python3
"""Bytes that autograd saves for backward in one fp32 training forward of a tiny BART
(`BartForConditionalGeneration`, transformers 5.17, CPU): every tensor packed by
`torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage, parameters left out.
Writes tests/data/bart_saved_bytes.jsonl, which crates/core/tests/types30_bart.rs compares
with the saved tensors of vramlab's graph (the same rules the planner uses).

    python3 lab/cpu/bart_saved_bytes.py

Dropout runs as `torch.native_dropout`, the fused kernel a GPU runs (it saves a bool mask);
on CPU `F.dropout` would save a float noise tensor instead. SDPA rows: the CPU's flash kernel
keeps q, k, v, the output and a logsumexp per query row, as the GPU's fused kernels do; the
lengths are multiples of 32, where the memory-efficient kernel's padded logsumexp is the
same size, and `attention_dropout` is 0 (with dropout the CPU takes another path).
"""
import json
import os

import torch
import transformers
from transformers import AutoConfig, AutoModelForSeq2SeqLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "bart_saved_bytes.jsonl")

BASE = {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 3,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 256,
        "decoder_ffn_dim": 256, "max_position_embeddings": 128}
CASES = [
    # (name, attention, dropouts, batch, seq, target)
    ("dropouts-on", "eager", {"dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1},
     2, 48, 24),
    ("dropouts-off", "eager", {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0},
     3, 40, 56),
    ("scaled", "eager", {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
                         "scale_embedding": True}, 2, 32, 16),
    ("sdpa-activation-dropout", "sdpa",
     {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.1}, 2, 64, 32),
    ("sdpa-longer-target", "sdpa",
     {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}, 3, 96, 128),
]


def gpu_dropout(x, p=0.5, training=True, inplace=False):
    """`F.dropout` as on a GPU: `native_dropout` for 0 < p < 1, the input itself for p = 0."""
    if not training or p == 0:
        return x
    return torch.native_dropout(x, p, True)[0]


torch.nn.functional.dropout = gpu_dropout


def saved_bytes(model, x, y):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=x, labels=y).loss
    loss.backward()
    return sum(seen.values())


def main():
    torch.manual_seed(0)
    rows = []
    for name, attention, drop, batch, seq, target in CASES:
        cfg = {**BASE, **drop}
        config = AutoConfig.for_model("bart", **cfg)
        model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attention)
        model.train()
        x = torch.randint(3, cfg["vocab_size"], (batch, seq))
        y = torch.randint(3, cfg["vocab_size"], (batch, target))
        n = saved_bytes(model, x, y)
        rows.append({"case": name, "config": {"model_type": "bart", **cfg}, "attention": attention,
                     "batch": batch, "seq": seq, "target_seq": target, "saved_bytes": n,
                     "versions": {"torch": torch.__version__,
                                  "transformers": transformers.__version__}})
        print(name, n)
    with open(OUT, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()

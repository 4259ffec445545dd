#!/usr/bin/env python3
"""Exact parameter counts of the Hugging Face configs in tests/data/hf_configs/.

For every config.json: sum(p.numel()) of AutoModelForCausalLM.from_config(cfg)
(AutoModelForMaskedLM for bert/roberta/modernbert/deberta-v2, AutoModelForSeq2SeqLM for encoder-decoder configs
such as t5) built on the meta device, written as JSON lines
with the versions to tests/data/hf_param_counts.jsonl (tests/hf_import.rs asserts the
Rust builders give the same numbers).

    python3 lab/cpu/hf_param_counts.py [--write | --append]

--write rewrites every row with this environment's versions; --append adds rows only for the
configs the file does not count yet (the older rows keep the versions they were counted with).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "tests", "data", "hf_configs")
OUT = os.path.join(ROOT, "tests", "data", "hf_param_counts.jsonl")
MASKED_LM = ("bert", "roberta", "modernbert", "deberta-v2")
DROP = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "auto_map", "quantization_config",
        "_vramlab_source")


def count(path):
    with open(path) as f:
        cfg = json.load(f)
    mt = cfg.pop("model_type")
    for k in DROP:
        cfg.pop(k, None)
    config = AutoConfig.for_model(mt, **cfg)
    if getattr(config, "is_encoder_decoder", False):
        cls = AutoModelForSeq2SeqLM
    elif mt in MASKED_LM:
        cls = AutoModelForMaskedLM
    else:
        cls = AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config)
    return mt, type(model).__name__, int(sum(p.numel() for p in model.parameters()))


def main():
    rows = []
    have = []
    if "--append" in sys.argv and os.path.exists(OUT):
        with open(OUT) as f:
            have = [json.loads(l) for l in f if l.strip()]
    counted = {r["config"] for r in have}
    for name in sorted(os.listdir(CONFIGS)):
        if not name.endswith(".json") or name in counted:
            continue
        mt, cls, n = count(os.path.join(CONFIGS, name))
        rows.append({"config": name, "model_type": mt, "class": cls, "params": n,
                     "versions": {"torch": torch.__version__, "transformers": transformers.__version__}})
        print(f"{name:40s} {mt:12s} {cls:28s} {n:>15,d}", file=sys.stderr)
    if "--write" in sys.argv or "--append" in sys.argv:
        rows = sorted(have + rows, key=lambda r: r["config"])
        with open(OUT, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    else:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()

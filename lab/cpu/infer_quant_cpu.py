#!/usr/bin/env python3
"""The bytes bitsandbytes keeps for a model loaded with `quantization_config` (issue 29), on
the CPU: a tiny config's random checkpoint saved, then loaded the way users load it
(`from_pretrained(folder, dtype=dtype, quantization_config=BitsAndBytesConfig(...),
device_map="cpu")`), and every parameter, buffer and quantization-state tensor summed —
the tensors of a quantized weight each rounded to the caching allocator's 512-byte blocks,
as `QuantStorage::bytes` counts them on a GPU. Also the bitsandbytes module classes.

    python3 lab/cpu/infer_quant_cpu.py > tests/data/infer/quant_weights_cpu.jsonl

Needs torch, transformers and bitsandbytes (its CPU backend quantizes).
"""
import json
import os
import shutil
import tempfile

import bitsandbytes
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

CONFIGS = "tests/data/infer/quant_cpu"
ROWS = [
    ("llama_tiny.json", "nf4", True, "bf16"),
    ("llama_tiny.json", "nf4", False, "bf16"),
    ("llama_tiny.json", "int8", False, "bf16"),
    ("qwen2_tiny.json", "nf4", True, "fp32"),
    ("qwen2_tiny.json", "int8", False, "fp16"),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def block(n):
    return -(-n // 512) * 512


def weights(model):
    seen, total = set(), 0
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            ts = [p.data, qs.absmax, qs.code]
            if qs.nested:
                ts += [qs.offset, qs.state2.absmax, qs.state2.code]
            total += sum(block(t.numel() * t.element_size()) for t in ts)
        elif type(p).__name__ == "Int8Params":
            mod = model.get_submodule(name.rsplit(".", 1)[0])
            scb = p.SCB if p.SCB is not None else mod.state.SCB
            total += block(p.numel()) + block(scb.numel() * 4)
        else:
            total += p.numel() * p.element_size()
    return total


def main():
    for cfg_file, quant, dq, precision in ROWS:
        dtype = DTYPES[precision]
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(CONFIGS, cfg_file), os.path.join(tmp, "config.json"))
            torch.manual_seed(29)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp), dtype=dtype)
            model.save_pretrained(os.path.join(tmp, "ckpt"))
            del model
            if quant == "int8":
                qc = BitsAndBytesConfig(load_in_8bit=True)
            else:
                qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
                                        bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=dtype)
            model = AutoModelForCausalLM.from_pretrained(os.path.join(tmp, "ckpt"), dtype=dtype,
                                                         quantization_config=qc, device_map="cpu")
        modules = {}
        for m in model.modules():
            if "bitsandbytes" in type(m).__module__:
                modules[type(m).__name__] = modules.get(type(m).__name__, 0) + 1
        print(json.dumps({
            "model": f"{CONFIGS}/{cfg_file}", "quant": quant, "double_quant": dq,
            "precision": precision, "weights_bytes": weights(model), "quant_modules": modules,
            "lm_head": type(model.lm_head).__name__,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "bitsandbytes": bitsandbytes.__version__},
        }))


if __name__ == "__main__":
    main()

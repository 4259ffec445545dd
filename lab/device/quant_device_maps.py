#!/usr/bin/env python3
"""Reference device maps of quantized models (issue 29): the placement transformers 5.17
computes for `from_pretrained(..., quantization_config=BitsAndBytesConfig(...),
device_map="auto", max_memory={0: GPU, "cpu": CPU}, dtype=dtype)`, without weights.

    python3 lab/device/quant_device_maps.py --out $OUT/quant_device_maps.jsonl

Needs bitsandbytes importable (the carried 0.50.2 wheel; `replace_with_bnb_linear` builds its
modules and `validate_environment` checks its backend), so it runs on the GPU machine; no GPU
memory is used beyond the CUDA context.

How (transformers 5.17 `modeling_utils.from_pretrained`, nothing replicated): the model is
instantiated on the meta device under `cls.get_init_context(dtype, True, False, None)`, the
quantizer is `AutoHfQuantizer.from_config(BitsAndBytesConfig(...))`, its
`preprocess_model(model, dtype=dtype, device_map="auto", ...)` replaces the linears (the
device map is still the string "auto" there, as in `from_pretrained`), then
`integrations.accelerate._get_device_map(model, "auto", max_memory, hf_quantizer)`:
`get_balanced_memory`, the quantizer's `adjust_max_memory` (× 0.90), `infer_auto_device_map`
with `compute_module_sizes` counting `param_element_size`, and `validate_environment` on the
map. Each (model, quantization, dtype, budget) is computed twice: with
`llm_int8_enable_fp32_cpu_offload=True` (the map) and without (the refusal's message, or none).
GPU budgets are fractions of the quantized model's `compute_module_sizes` total, so that the
maps run from one layer on GPU 0 to all of them; `get_max_memory` takes the minimum of the
budget and the free memory, which is the budget here.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
from infer_runner import DTYPES, load_config  # noqa: E402

MODELS = ["Llama-3.2-1B", "Llama-3.1-8B", "Qwen2.5-0.5B", "Qwen2.5-7B", "Qwen3-0.6B",
          "Qwen3-8B", "Mistral-7B-v0.3", "gemma-2b", "gemma-3-1b-pt", "Phi-3-mini-4k-instruct"]
QUANTS = [("nf4", True), ("nf4", False), ("int8", False)]
FRACTIONS = [0.35, 0.6, 0.85, 1.2]


def bnb_config(quant, dq, dtype, offload):
    from transformers import BitsAndBytesConfig

    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=offload)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
                              bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=dtype,
                              llm_int8_enable_fp32_cpu_offload=offload)


def quantized_meta_model(path, dtype, qc):
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import ContextManagers
    from transformers.quantizers.auto import AutoHfQuantizer

    config = load_config(path)
    config.quantization_config = qc
    hf_quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=False)
    cls = AutoModelForCausalLM._model_mapping[type(config)]
    with ContextManagers(cls.get_init_context(dtype, True, False, None)):
        model = cls(config)
        hf_quantizer.preprocess_model(model=model, dtype=dtype, device_map="auto",
                                      checkpoint_files=None, use_kernels=False)
    return model, hf_quantizer


def main():
    import accelerate
    import bitsandbytes
    import transformers
    from transformers.integrations.accelerate import _get_device_map, compute_module_sizes
    from transformers.quantizers.auto import AutoHfQuantizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "accelerate": accelerate.__version__, "bitsandbytes": bitsandbytes.__version__}
    here = os.path.dirname(os.path.abspath(__file__))
    n = 0
    with open(args.out, "w") as f:
        for name in MODELS:
            path = os.path.join(here, "..", "..", "tests", "data", "hf_configs", f"{name}.json")
            for i, (quant, dq) in enumerate(QUANTS):
                prec = ["bf16", "fp16"][i % 2]
                dtype = DTYPES[prec]
                row0 = {"model": f"tests/data/hf_configs/{name}.json", "precision": prec,
                        "quant": quant, "double_quant": dq, "versions": versions}
                try:
                    model, hq = quantized_meta_model(path, dtype, bnb_config(quant, dq, dtype, True))
                    total = compute_module_sizes(model, hq)[0][""]
                except Exception as e:  # recorded, the rest go on
                    f.write(json.dumps({**row0, "error": f"{type(e).__name__}: {e}"[:500]}) + "\n")
                    continue
                for frac in FRACTIONS:
                    gpu = f"{max(1, int(total * frac / 2**20))}MiB"
                    row = {**row0, "max_gpu_memory": gpu, "max_cpu_memory": "200GiB",
                           "weights_bytes": total}
                    try:
                        dm = _get_device_map(model, "auto", {0: gpu, "cpu": "200GiB"}, hq)
                        row["device_map"] = {k: (v if isinstance(v, (int, str)) else str(v))
                                             for k, v in dm.items()}
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"[:500]
                    # the same without llm_int8_enable_fp32_cpu_offload (the model is the same:
                    # under device_map="auto" the flag changes nothing in preprocess_model)
                    try:
                        hq2 = AutoHfQuantizer.from_config(bnb_config(quant, dq, dtype, False),
                                                          pre_quantized=False)
                        _get_device_map(model, "auto", {0: gpu, "cpu": "200GiB"}, hq2)
                        row["refused_without_flag"] = None
                    except Exception as e:
                        row["refused_without_flag"] = f"{type(e).__name__}: {e}"[:600]
                    f.write(json.dumps(row) + "\n")
                    n += 1
                del model
    print(f"{n} rows -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

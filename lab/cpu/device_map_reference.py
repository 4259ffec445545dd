#!/usr/bin/env python3
"""Reference device maps (issue 29): the placement transformers 5.17 computes for
`from_pretrained(..., device_map="auto", max_memory={0: GPU, "cpu": CPU}, dtype=dtype)`, on the
CPU, without a GPU and without weights.

    /tmp/bart_venv/bin/python lab/cpu/device_map_reference.py \
        --out tests/data/infer/device_maps_accelerate.jsonl

How (transformers 5.17 `modeling_utils.py`, `PreTrainedModel.from_pretrained`): the model is
instantiated under `cls.get_init_context(dtype, False, False, None)` (the dtype as default
dtype, `init.no_tie_weights()`, the meta device), exactly as `from_pretrained` does, then
transformers' own `integrations.accelerate._get_device_map(model, "auto", max_memory, None)`
is called: `get_balanced_memory` (a no-op for one GPU with `max_memory` given), then
transformers' copy of accelerate's `infer_auto_device_map` (accelerate 1.15's `get_max_memory`,
`get_max_layer_size`, `clean_device_map`). Nothing is replicated here: the map is what those
functions return. Without CUDA `get_max_memory` adds no "reserved but unused" memory; on a GPU
it adds `memory_reserved() - memory_allocated()` and then takes the minimum with the user's
`max_memory`, so with `max_memory` given (and less than the free memory) the result is the same.

Each model's config is loaded as lab/device/infer_runner.py `load_config` does. GPU budgets run
from a few % of the weights to more than all of them; a few rows have a CPU budget small
enough to send modules to "disk".
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "device"))
from infer_runner import DTYPES, load_config  # noqa: E402

MODELS = ["Llama-3.2-1B", "Llama-3.1-8B", "Qwen2.5-0.5B", "Qwen2.5-7B", "Qwen3-0.6B", "Qwen3-8B",
          "Mistral-7B-v0.3", "gemma-2b", "gemma-3-1b-pt", "Phi-3-mini-4k-instruct"]
# GPU budget as a fraction of the weights' bytes (a size string in MiB is written).
FRACTIONS = [0.03, 0.2, 0.5, 0.8, 0.97, 1.5]
# CPU budgets as a fraction of the weights (None: 200GiB, no pressure).
CPU_FRACTIONS = [None, 0.3]


def meta_model(path, dtype):
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import ContextManagers

    config = load_config(path)
    cls = AutoModelForCausalLM._model_mapping[type(config)]
    with ContextManagers(cls.get_init_context(dtype, False, False, None)):
        model = cls(config)
    return model


def weights_bytes(model):
    from transformers.integrations.accelerate import compute_module_sizes

    return compute_module_sizes(model)[0][""]


def device_map(model, gpu, cpu):
    from transformers.integrations.accelerate import _get_device_map

    dm = _get_device_map(model, "auto", {0: gpu, "cpu": cpu}, None)
    return {k: v for k, v in dm.items()}


def main():
    import accelerate
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", action="store_true", help="print module sizes (debugging)")
    args = ap.parse_args()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "accelerate": accelerate.__version__}
    rows = []
    here = os.path.dirname(os.path.abspath(__file__))
    for name in MODELS:
        path = os.path.join(here, "..", "..", "tests", "data", "hf_configs", f"{name}.json")
        for prec in ["bf16", "fp16", "fp32"]:
            model = meta_model(path, DTYPES[prec])
            total = weights_bytes(model)
            if args.sizes and prec == "bf16":
                from transformers.integrations.accelerate import compute_module_sizes
                sizes = compute_module_sizes(model)[0]
                print(name, model._no_split_modules, dict(model.all_tied_weights_keys),
                      [(n, sizes[n]) for n, _ in model.named_modules() if n.count(".") <= 1],
                      [(n, b.dtype, b.shape) for n, b in model.named_buffers()][:6],
                      file=sys.stderr)
            for i, frac in enumerate(FRACTIONS):
                # one dtype per budget, to keep the file short, all three per model
                if prec != ["bf16", "fp16", "fp32"][i % 3] and frac not in (0.5,):
                    continue
                gpu = f"{max(1, int(total * frac / 2**20))}MiB"
                for cf in CPU_FRACTIONS:
                    if cf is not None and frac > 0.5:
                        continue
                    cpu = "200GiB" if cf is None else f"{max(1, int(total * cf / 2**20))}MiB"
                    dm = device_map(model, gpu, cpu)
                    rows.append({"model": f"tests/data/hf_configs/{name}.json", "precision": prec,
                                 "max_gpu_memory": gpu, "max_cpu_memory": cpu,
                                 "weights_bytes": total, "device_map": dm, "versions": versions})
            del model
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} rows -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

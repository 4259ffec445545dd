#!/usr/bin/env python3
"""The allocations of a transformers inference call on the CPU (no GPU needed), to check the
op-by-op order vramlab's inference planner assumes (`crates/core/src/plan/inference/`).

PyTorch's profiler records every CPU allocation and free (`profile_memory=True`); the peak of
live bytes above the call's start is what the CUDA caching allocator would see as allocated,
except inside attention kernels (the CPU's SDPA kernels differ: compare eager attention).

    python3 lab/cpu/infer_cpu_trace.py CONFIG.json generate|prefill BATCH PROMPT NEW \\
        eager|sdpa dynamic|static fp32|bf16 [N_EVENTS_TO_LIST]

Prints {"peak_above_start": bytes, ...}; with N_EVENTS_TO_LIST, the first allocation and
free events in order (op name, bytes, live bytes). A model is built from the config.json
with random weights (shrink its sizes first: this runs on the CPU).
"""
import json
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

DROP = ("architectures", "transformers_version", "torch_dtype", "dtype")


def main():
    path, step, b, p, n, att, cache, dt = sys.argv[1:9]
    b, p, n = int(b), int(p), int(n)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dt]
    with open(path) as f:
        c = json.load(f)
    mt = c.pop("model_type")
    for k in DROP:
        c.pop(k, None)
    cfg = AutoConfig.for_model(mt, **c)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=att, dtype=dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (b, p))

    def call():
        if step == "prefill":
            with torch.no_grad():
                out = model(ids)
            del out
        else:
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 cache_implementation="static" if cache == "static" else None,
                                 disable_compile=True)
            del out

    call()  # warm-up, as on the device
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        call()
    with tempfile.NamedTemporaryFile(suffix=".raw.json") as tmp:
        prof.export_memory_timeline(tmp.name, device="cpu")
        times, sizes = json.load(open(tmp.name))
    total = [sum(x) for x in sizes]
    print(json.dumps({"peak_above_start": max(total) - total[0], "start": total[0],
                      "end_above_start": total[-1] - total[0], "samples": len(times)}))
    if len(sys.argv) > 9:
        live = 0
        events = sorted(prof.events(), key=lambda e: e.time_range.start)
        rows = [("free" if e.name == "[memory]" else e.name,
                 e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
                for e in events if e.name == "[memory]" or e.self_cpu_memory_usage != 0]
        for name, nbytes in rows[: int(sys.argv[9])]:
            live += nbytes
            print(f"{name:28s} {nbytes:>12d} {live:>12d}")


if __name__ == "__main__":
    main()

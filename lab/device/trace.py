#!/usr/bin/env python3
"""Diagnostics for calibrating the planner (run on the GPU machine).

  trace.py saved  --config JSON      walk the autograd graph after forward and list every
                                     saved tensor (node, attribute, shape, dtype, bytes, storage)
  trace.py memory --config JSON      record the CUDA caching allocator's event history over the
                                     training loop of torch_runner.py (alloc/free/segment events
                                     with the Python frame that caused them)

Output: one JSON object on stdout.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the shipped runner lives with the crate that embeds it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "device", "runners"))
import torch_runner as tr  # noqa: E402

DEV = os.environ.get("VRAMLAB_TRACE_DEVICE", "cuda")


def build(cfg):
    if cfg.get("finetune") not in (None, "full"):
        # build_reference makes the full model with every weight trainable (and Adam state for
        # each): a LoRA / QLoRA row would be traced as another job
        raise SystemExit("trace.py builds full fine-tuning only; for LoRA / QLoRA rows use "
                         "lab/device/snapshot_step.py (the shipped runner's own step)")
    cfg, preset = tr.normalize_config(cfg)
    fam = preset["family"]
    size = cfg.get("image") if fam in tr.IMAGE_FAMILIES else cfg.get("seq")
    with torch.device(DEV):
        model = tr.build_reference(preset, size, attention=cfg["attention"])
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    if cfg["checkpointing"]:
        tr.enable_checkpointing(model, fam)
    model.train()
    return cfg, preset, model


def saved(cfg):
    cfg, preset, model = build(cfg)
    dev = tr.Device(DEV)
    make = tr.make_batch_fn(cfg, preset, dev)
    x, y = make()
    amp = cfg["precision"] in ("amp-fp16", "amp-bf16")
    dt = torch.float16 if cfg["precision"] == "amp-fp16" else torch.bfloat16
    with torch.autocast(DEV, dtype=dt, enabled=amp):
        out, loss = tr.forward_loss(model, preset["family"], x, y)
    seen = {}
    rows = []
    stack = [loss.grad_fn]
    visited = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for attr in dir(fn):
            if not attr.startswith("_saved_"):
                continue
            try:
                v = getattr(fn, attr)
            except Exception:
                continue
            vals = v if isinstance(v, (tuple, list)) else [v]
            for t in vals:
                if torch.is_tensor(t) and t.device.type == DEV:
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    nb = st.nbytes()
                    new = key not in seen
                    seen[key] = nb
                    rows.append({"node": type(fn).__name__, "attr": attr, "shape": list(t.shape),
                                 "dtype": str(t.dtype).replace("torch.", ""), "storage_bytes": nb,
                                 "param": isinstance(t, torch.nn.Parameter) or t.requires_grad and t.is_leaf,
                                 "new": new})
        for nxt, _ in fn.next_functions:
            stack.append(nxt)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = sum(nb for k, nb in seen.items() if k not in param_ptrs)
    by_node = {}
    for r in rows:
        if r["new"]:
            k = (r["node"], r["attr"], r["dtype"])
            by_node.setdefault(k, [0, 0])
            by_node[k][0] += 1
            by_node[k][1] += r["storage_bytes"]
    summary = sorted(([n, a, d, c, b] for (n, a, d), (c, b) in by_node.items()), key=lambda r: -r[4])
    return {"mode": "saved", "config": cfg, "saved_unique_bytes_excl_params": total,
            "allocated_after_forward": torch.cuda.memory_allocated() if DEV == "cuda" else 0,
            "summary": summary[:80], "rows_first_layer": rows[:400]}


def memory(cfg):
    torch.cuda.memory._record_memory_history(max_entries=400000, stacks="python")
    cfg, preset, model = build(cfg)
    dev = tr.Device("cuda")
    rec = {}
    tr.run_step(model, preset["family"], cfg, preset, dev, rec)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = []
    for tr_ in snap.get("device_traces", [[]])[0]:
        frame = ""
        for f in tr_.get("frames", []) or []:
            fn = f.get("filename", "")
            if "torch/optim" in fn or "torchvision" in fn or "transformers" in fn or "torch/nn" in fn \
                    or "torch/autograd" in fn or "torch_runner" in fn or "torch/amp" in fn:
                frame = f"{os.path.basename(fn)}:{f.get('line')}:{f.get('name')}"
                break
        events.append([tr_["action"], tr_["size"], tr_["addr"], frame])
    segs = [[s["total_size"], s["allocated_size"], len(s["blocks"])] for s in snap["segments"]]
    return {"mode": "memory", "config": cfg, "record": {k: v for k, v in rec.items() if isinstance(v, (int, float))},
            "segments": segs, "events": events}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("saved", "memory"))
    ap.add_argument("--config", required=True)
    a = ap.parse_args()
    cfg = json.loads(a.config)
    out = saved(cfg) if a.mode == "saved" else memory(cfg)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

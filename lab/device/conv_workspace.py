#!/usr/bin/env python3
"""Measure the transient (workspace) allocations of every distinct convolution in real models.

  conv_workspace.py CONFIGS.jsonl > out.jsonl      (run on the GPU machine)

For each measurement config (torch_runner.py format) the reference model is built and one
forward runs under the config's precision with hooks on every Conv2d / ConvTranspose2d,
recording what each convolution really receives (input shape and dtype, weight shape,
stride, padding, dilation, groups, whether the input needs a gradient). Each distinct
signature is then run alone, forward and backward, twice (the second run is kept: cuDNN's
plan cache is warm then, as in a training step) with the caching allocator's history on.
Every allocation that is freed before its phase ends is a transient one (cuDNN workspace,
conversion buffers); the output line lists them in order with the persistent ones.

Output, one JSON object per line:
  {"kind": "config", "config": {...}, "convs": [signature index per conv call, in order]}
  {"kind": "conv", "index": i, "sig": {...}, "fwd": [[size, transient], ...], "bwd": [...],
   "fwd_peak_transient": B, "bwd_peak_transient": B}
and a first line with the versions.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the shipped runner lives with the crate that embeds it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "device", "runners"))
import torch_runner as tr  # noqa: E402
import trace as trc  # noqa: E402

DT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def signatures(cfg):
    cfg, preset, model = trc.build(cfg)
    calls = []

    def hook(mod, args):
        x = args[0]
        transposed = isinstance(mod, torch.nn.ConvTranspose2d)
        calls.append({
            "input": list(x.shape), "dtype": DT.get(x.dtype, str(x.dtype)),
            "weight": list(mod.weight.shape), "bias": mod.bias is not None,
            "stride": list(mod.stride), "padding": list(mod.padding),
            "dilation": list(mod.dilation), "groups": mod.groups,
            "transposed": transposed,
            "output_padding": list(getattr(mod, "output_padding", (0, 0))),
            "input_grad": bool(x.requires_grad),
        })

    hs = [m.register_forward_pre_hook(hook) for m in model.modules()
          if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    dev = tr.Device("cuda")
    make = tr.make_batch_fn(cfg, preset, dev)
    x, _ = make()
    amp = cfg["precision"] in ("amp-fp16", "amp-bf16")
    dt = torch.float16 if cfg["precision"] == "amp-fp16" else torch.bfloat16
    with torch.autocast("cuda", dtype=dt, enabled=amp):
        out = model(x)
    del out, x
    for h in hs:
        h.remove()
    del model
    torch.cuda.empty_cache()
    # Under autocast the hook sees the fp32 input; the convolution runs in the autocast dtype.
    if amp:
        for c in calls:
            c["dtype"] = DT[dt]
    return cfg, calls


def traced(fn):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    res = fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    evs = snap.get("device_traces", [[]])[0]
    freed = {}
    order = []
    for i, e in enumerate(evs):
        if e["action"] == "alloc":
            order.append((e["addr"], e["size"], i))
        elif e["action"] in ("free_requested",):
            freed.setdefault(e["addr"], []).append(i)
    out = []
    for addr, size, i in order:
        transient = any(j > i for j in freed.get(addr, []))
        out.append([size, transient])
    return res, out


def peak_transient(seq):
    # Upper bound: transients are freed in the phase; report their largest single size and sum.
    t = [s for s, tr_ in seq if tr_]
    return max(t) if t else 0


def measure(sig):
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[sig["dtype"]]
    x = torch.randn(sig["input"], device="cuda", dtype=dt, requires_grad=sig["input_grad"])
    w = torch.randn(sig["weight"], device="cuda", dtype=dt, requires_grad=True)
    b = torch.randn(sig["weight"][1] * sig["groups"] if sig["transposed"] else sig["weight"][0],
                    device="cuda", dtype=dt, requires_grad=True) if sig["bias"] else None

    def fwd():
        if sig["transposed"]:
            return F.conv_transpose2d(x, w, b, sig["stride"], sig["padding"], sig["output_padding"],
                                      sig["groups"], sig["dilation"])
        return F.conv2d(x, w, b, sig["stride"], sig["padding"], sig["dilation"], sig["groups"])

    result = None
    for _ in range(2):
        y, fseq = traced(fwd)
        g = torch.randn_like(y)
        _, bseq = traced(lambda: y.backward(g))
        result = (fseq, bseq, list(y.shape))
        del y, g
        x.grad = None
        w.grad = None
        if b is not None:
            b.grad = None
    del x, w, b
    return result


def main():
    path = sys.argv[1]
    print(json.dumps({"kind": "versions", "versions": tr.versions()}), flush=True)
    known = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        try:
            cfg, calls = signatures(json.loads(line))
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"kind": "error", "config": line, "error": repr(e)}), flush=True)
            torch.cuda.empty_cache()
            continue
        idx = []
        for c in calls:
            key = json.dumps(c, sort_keys=True)
            if key not in known:
                known[key] = len(known)
                try:
                    fseq, bseq, out_shape = measure(c)
                    print(json.dumps({"kind": "conv", "index": known[key], "sig": c, "output": out_shape,
                                      "fwd": fseq, "bwd": bseq,
                                      "fwd_max_transient": peak_transient(fseq),
                                      "bwd_max_transient": peak_transient(bseq)}), flush=True)
                except Exception as e:  # noqa: BLE001
                    print(json.dumps({"kind": "conv", "index": known[key], "sig": c, "error": repr(e)}),
                          flush=True)
                torch.cuda.empty_cache()
            idx.append(known[key])
        print(json.dumps({"kind": "config", "config": cfg, "convs": idx}), flush=True)


if __name__ == "__main__":
    main()

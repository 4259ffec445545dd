#!/usr/bin/env python3
"""The allocation events of one MoE block / gpt-oss attention under `torch.no_grad()` on the
GPU, as PyTorch's memory history records them (`_record_memory_history()` as is), for
mirroring the inference planner's MoE ops (issue 29). Writes JSON lines: one per module call,
with the (action, size) sequence of its device trace.

    python3 lab/device/probe_moe_events.py --out $OUT/moe_events.jsonl
"""
import argparse
import json

import torch


def trace(fn):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history()
    with torch.no_grad():
        out = fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = []
    for dev_trace in snap["device_traces"]:
        for e in dev_trace:
            if e["action"] in ("alloc", "free_requested", "segment_alloc", "segment_free"):
                top = ""
                for f in e.get("frames", []):
                    if "transformers" in f.get("filename", "") or "torch/nn" in f.get("filename", ""):
                        top = f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}"
                        break
                ev.append([e["action"], e["size"], top])
    del out
    return ev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from transformers import AutoConfig
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q3
    from transformers.models.qwen2_moe import modeling_qwen2_moe as q2
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    rows = []
    dev = "cuda"
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens in (1, 8, 1000):
            cfg = AutoConfig.for_model("qwen3_moe", hidden_size=256, moe_intermediate_size=128,
                                       num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=64)
            cfg._experts_implementation = "grouped_mm"
            with torch.device(dev):
                blk = q3.Qwen3MoeSparseMoeBlock(cfg).to(dtype)
            x = torch.randn(1, tokens, 256, device=dev, dtype=dtype)
            rows.append({"module": "qwen3_moe.block", "dtype": str(dtype), "tokens": tokens,
                         "hidden": 256, "inter": 128, "experts": 16, "k": 4,
                         "events": trace(lambda: blk(x))})
            cfg2 = AutoConfig.for_model("qwen2_moe", hidden_size=256, moe_intermediate_size=128,
                                        shared_expert_intermediate_size=512, num_experts=16,
                                        num_experts_per_tok=4, num_attention_heads=4,
                                        num_key_value_heads=4)
            cfg2._experts_implementation = "grouped_mm"
            with torch.device(dev):
                blk2 = q2.Qwen2MoeSparseMoeBlock(cfg2).to(dtype)
            rows.append({"module": "qwen2_moe.block", "dtype": str(dtype), "tokens": tokens,
                         "hidden": 256, "inter": 128, "shared": 512, "experts": 16, "k": 4,
                         "events": trace(lambda: blk2(x))})
            cfg3 = AutoConfig.for_model("gpt_oss", hidden_size=256, intermediate_size=128,
                                        num_local_experts=16, num_experts_per_tok=4,
                                        num_attention_heads=8, num_key_value_heads=2, head_dim=32)
            cfg3._experts_implementation = "grouped_mm"
            cfg3._attn_implementation = "eager"
            with torch.device(dev):
                mlp = go.GptOssMLP(cfg3).to(dtype)
            rows.append({"module": "gpt_oss.mlp", "dtype": str(dtype), "tokens": tokens,
                         "hidden": 256, "inter": 128, "experts": 16, "k": 4,
                         "events": trace(lambda: mlp(x))})
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(len(rows), "module calls traced")


if __name__ == "__main__":
    main()

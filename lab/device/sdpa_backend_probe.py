#!/usr/bin/env python3
"""Which SDPA backend runs T5's attention: a float attn_mask that requires grad (the learned
relative position bias) or not (cross-attention's zeros), with dropout 0.1, bf16 inputs on CUDA.
Each backend is tried alone (torch.nn.attention.sdpa_kernel); prints one JSON line per case:
which backends accept it and the peak memory of forward+backward with the default choice."""
import json
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, Q, K, D = 8, 8, 512, 512, 64
dev = "cuda"
for mask_grad in (True, False):
    for dtype in (torch.bfloat16, torch.float32):
        res = {"mask_requires_grad": mask_grad, "dtype": str(dtype), "torch": torch.__version__}
        for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]:
            q, k, v = (torch.randn(B, H, Q, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            m = torch.randn(1, H, Q, K, device=dev, dtype=dtype, requires_grad=mask_grad)
            try:
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.1).sum().backward()
                res[name] = "ok"
            except RuntimeError as e:
                res[name] = "refused: " + str(e).splitlines()[0][:160]
        q, k, v = (torch.randn(B, H, Q, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        m = torch.randn(1, H, Q, K, device=dev, dtype=dtype, requires_grad=mask_grad)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.1)
        res["after_forward_bytes"] = torch.cuda.memory_allocated() - base
        out.sum().backward()
        res["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        res["scores_bytes_fp32"] = B * H * Q * K * 4
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.1)
        res["ops"] = sorted({e.name for e in prof.events() if "attention" in e.name or "softmax" in e.name or "dropout" in e.name})
        print(json.dumps(res), flush=True)

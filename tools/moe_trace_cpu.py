#!/usr/bin/env python3
"""The tensor allocations of transformers' mixture-of-experts blocks under `torch.no_grad()`,
traced on the CPU, for `crates/core/tests/infer_moe.rs` (issue 29): the sequence the
inference planner's `plan/inference/moe.rs` mirrors, read off the real modules
(transformers 5.17 `Qwen3MoeSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`,
`MixtralSparseMoeBlock` with the default `grouped_mm` experts) rather than written from
reading their source.

A `TorchDispatchMode` sees every ATen op the block runs; each op output whose storage is new
is an allocation of `nbytes`, and a `weakref.finalize` on that storage records when its last
reference goes. The trace is device-independent except where ATen's kernels differ by device:
the CPU's `softmax(x, dtype=float)` converts fp16 first where CUDA has a half-to-float
kernel, so fp16 is not traced (bf16 and fp32 are; the planner's fp16 branch is read from
ATen's `softmax`). The parameters and the block's input exist before the trace and are not
in it.

    python3 tools/moe_trace_cpu.py > tests/data/infer/moe_trace_cpu.jsonl

One JSON line per block call: model type, dtype, tokens, the sizes, the versions, and
`events`: `["alloc", id, nbytes, op]` / `["free", id]`.
"""
import json
import sys
import weakref

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.events = []
        self.live = {}  # id(storage wrapper's cdata) -> our id
        self.next = 0
        self.known = set()

    def note_existing(self, tensors):
        for t in tensors:
            self.known.add(t.untyped_storage()._cdata)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        for t in flat:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.known or st.nbytes() == 0:
                continue
            self.known.add(key)
            i = self.next
            self.next += 1
            self.events.append(["alloc", i, st.nbytes(), func.__name__])
            weakref.finalize(st, self.freed, i, key)
        return out

    def freed(self, i, key):
        self.known.discard(key)
        self.events.append(["free", i])


def block_of(model_type, dtype, sizes):
    from transformers import AutoConfig

    h, inter, e, k = sizes["hidden"], sizes["inter"], sizes["experts"], sizes["k"]
    if model_type == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as B
        cfg = AutoConfig.for_model(model_type, hidden_size=h, moe_intermediate_size=inter,
                                   num_experts=e, num_experts_per_tok=k,
                                   norm_topk_prob=sizes["norm_topk_prob"])
    elif model_type == "qwen2_moe":
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as B
        cfg = AutoConfig.for_model(model_type, hidden_size=h, moe_intermediate_size=inter,
                                   shared_expert_intermediate_size=sizes["shared"],
                                   num_experts=e, num_experts_per_tok=k,
                                   norm_topk_prob=sizes["norm_topk_prob"])
    else:
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as B
        cfg = AutoConfig.for_model(model_type, hidden_size=h, intermediate_size=inter,
                                   num_local_experts=e, num_experts_per_tok=k)
    cfg._experts_implementation = "grouped_mm"  # what from_pretrained / from_config set
    torch.manual_seed(0)
    blk = B(cfg).to(dtype)
    for prm in blk.parameters():
        torch.nn.init.normal_(prm, std=0.02)
    return blk.eval()


CASES = [
    ("qwen3_moe", {"hidden": 64, "inter": 48, "experts": 8, "k": 2, "norm_topk_prob": True}),
    ("qwen3_moe", {"hidden": 64, "inter": 48, "experts": 8, "k": 2, "norm_topk_prob": False}),
    ("qwen2_moe", {"hidden": 64, "inter": 48, "shared": 96, "experts": 8, "k": 4,
                   "norm_topk_prob": False}),
    ("mixtral", {"hidden": 64, "inter": 48, "experts": 8, "k": 2, "norm_topk_prob": True}),
]


def main():
    for model_type, sizes in CASES:
        for dtype in (torch.bfloat16, torch.float32):
            for tokens in (1, 3, 40):
                blk = block_of(model_type, dtype, sizes)
                x = torch.randn(1, tokens, sizes["hidden"], dtype=dtype)
                tr = Tracer()
                tr.note_existing(list(blk.parameters()) + [x])
                with torch.no_grad(), tr:
                    out = blk(x)
                    # the trace ends as the block returns: its output lives on
                    events = list(tr.events)
                del out
                row = {"model_type": model_type, "dtype": str(dtype).replace("torch.", ""),
                       "tokens": tokens, **sizes, "torch": torch.__version__,
                       "transformers": transformers.__version__, "events": events}
                sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

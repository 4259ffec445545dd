#!/usr/bin/env python3
"""The tensor allocations of transformers' inference modules under `torch.no_grad()`, traced
on the CPU, for `crates/core/tests/infer_moe.rs` (issue 29): the sequences the inference
planner (`plan/inference/forward.rs`, `attention.rs`, `moe.rs`) mirrors, read off the real
modules of transformers 5.17 rather than written from reading their source:
- mixture-of-experts blocks (`Qwen3MoeSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`,
  `MixtralSparseMoeBlock`, `GptOssMLP`; the default `grouped_mm` experts), called alone;
- decoder layers of every type the inference planner models (tiny configs, two layers each,
  eager attention), each traced inside its model's own forward — a prefill, then one decode
  step on the same `DynamicCache` — so that its inputs (masks, cos/sin, the cache) are what
  transformers builds.

A `TorchDispatchMode` sees every ATen op the module runs; each op output whose storage is new
is an allocation of `nbytes`, and a `weakref.finalize` on that storage records when its last
reference goes. The trace is device-independent except where ATen's kernels differ by device:
the CPU's `softmax(x, dtype=float)` converts fp16 first where CUDA has a half-to-float
kernel, so fp16 is not traced (bf16 and fp32 are); SDPA's kernels differ, so attention is
eager. What existed before the call (parameters, inputs, the cache's tensors) is not in it.

    python3 lab/cpu/infer_trace_cpu.py > tests/data/infer/trace_cpu.jsonl

One JSON line per module call: model type, dtype, tokens, the sizes, the versions, and
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
            st = t.untyped_storage()
            if st._cdata in self.known:
                continue
            self.known.add(st._cdata)
            # a storage that dies during the trace frees its address for a new one
            weakref.finalize(st, self.known.discard, st._cdata)

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
    elif model_type == "gpt_oss":
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP as B
        cfg = AutoConfig.for_model(model_type, hidden_size=h, intermediate_size=inter,
                                   num_local_experts=e, num_experts_per_tok=k)
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
    ("gpt_oss", {"hidden": 64, "inter": 48, "experts": 8, "k": 2, "norm_topk_prob": False}),
]

# Decoders of two layers (gpt-oss: a sliding one, a full one): each layer's call is traced
# inside the model's own forward (a prefill of `tokens`, then one decode step), so that its
# inputs (the masks, cos/sin, the cache) are what transformers builds
GPT_OSS = {"hidden_size": 64, "intermediate_size": 48, "num_local_experts": 8,
           "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 2, "sliding_window": 4,
           "layer_types": ["sliding_attention", "full_attention"], "vocab_size": 128,
           "max_position_embeddings": 4096}


# Tiny decoders of the Llama lineage with MoE blocks (eager attention: SDPA's kernels differ
# between the CPU and CUDA; eager's ops do not)
LAYER_MODELS = [
    ("gpt_oss", GPT_OSS),
    ("qwen3_moe", {"hidden_size": 64, "moe_intermediate_size": 48, "intermediate_size": 80,
                   "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
                   "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
                   "num_hidden_layers": 2, "mlp_only_layers": [1], "vocab_size": 128,
                   "max_position_embeddings": 4096}),
    ("qwen2_moe", {"hidden_size": 64, "moe_intermediate_size": 48, "intermediate_size": 80,
                   "shared_expert_intermediate_size": 96, "num_experts": 8,
                   "num_experts_per_tok": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                   "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 4096}),
    ("mixtral", {"hidden_size": 64, "intermediate_size": 48, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                 "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 128,
                 "max_position_embeddings": 4096}),
]


BATCH = 2


# The dense decoders of the Llama lineage the planner models, tiny, two layers each (a
# sliding and a full one where the type has windows)
DENSE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 128,
         "max_position_embeddings": 4096}
LAYER_MODELS += [
    ("llama", DENSE),
    ("mistral", {**DENSE, "sliding_window": 4}),
    ("qwen2", DENSE),
    ("qwen3", DENSE),
    ("gemma", {**DENSE, "num_key_value_heads": 1}),
    ("gemma3_text", {**DENSE, "sliding_window": 4, "layer_types": ["sliding_attention",
                                                                   "full_attention"]}),
    ("phi3", {**{k: v for k, v in DENSE.items() if k != "head_dim"}, "num_attention_heads": 4,
              "num_key_value_heads": 4, "sliding_window": 4, "pad_token_id": 0,
              "eos_token_id": 1, "bos_token_id": 1}),
]


STATIC_LEN = 12  # `max_cache_len` of the static-cache traces


def trace_layers(model_type, keys, dtype, tokens, kind="dynamic"):
    from transformers import AutoConfig, AutoModel
    from transformers.cache_utils import DynamicCache, StaticCache

    cfg = AutoConfig.for_model(model_type, **keys)
    torch.manual_seed(0)
    # transformers' defaults otherwise: `grouped_mm` experts where the model has experts
    model = AutoModel.from_config(cfg, attn_implementation="eager").to(dtype).eval()
    rows = []
    state = {}

    def pre(module, args, kwargs):
        tr = Tracer()
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        cache = kwargs.get("past_key_values")
        for layer in getattr(cache, "layers", []):
            # keys, values, a static layer's `cumulative_length`
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        tr.note_existing(list(model.parameters()) + list(model.buffers()) + tensors)
        state["tr"] = tr
        tr.__enter__()

    def post(module, args, kwargs, out):
        tr = state.pop("tr")
        events = list(tr.events)
        tr.__exit__(None, None, None)
        rows.append({"layer": module.self_attn.layer_idx, "events": events})

    for layer in model.layers:
        layer.register_forward_pre_hook(pre, with_kwargs=True)
        layer.register_forward_hook(post, with_kwargs=True)
    if kind == "static":
        cache = StaticCache(config=cfg, max_cache_len=STATIC_LEN)
    else:
        cache = DynamicCache(config=cfg)
    # two sequences: with one, `matmul` folds a transposed query without copying it
    ids = torch.randint(0, keys["vocab_size"], (BATCH, tokens))
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
        model(ids[:, -1:], past_key_values=cache, use_cache=True)
    for i, r in enumerate(rows):
        r["call"] = "prefill" if i < 2 else "decode"
        r["tokens"] = tokens if i < 2 else 1
        r["cached"] = 0 if i < 2 else tokens
        r["batch"] = BATCH
        r["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
        r["cache"] = kind
        if kind == "static":
            r["max_cache_len"] = STATIC_LEN
    return rows


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
    runs = [(dtype, tokens, "dynamic") for dtype in (torch.bfloat16, torch.float32)
            for tokens in (3, 6)]
    runs += [(torch.bfloat16, tokens, "static") for tokens in (3, 6)]
    for model_type, keys in LAYER_MODELS:
        for dtype, tokens, kind in runs:
            if True:
                for r in trace_layers(model_type, keys, dtype, tokens, kind):
                    row = {"model_type": model_type, "module": "decoder_layer",
                           "dtype": str(dtype).replace("torch.", ""), **keys, **r,
                           "torch": torch.__version__,
                           "transformers": transformers.__version__}
                    sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The saved-for-backward bytes of a forward of tiny deepseek_v3 / gpt_oss configs on CPU
(transformers 5.17, eager attention), for crates/core/tests/types30_moe.rs
(`saved_bytes_match_torch`): the storages autograd saves (saved_tensors_hooks, deduplicated
by storage, parameters left out) plus what the step's output holds (logits, the
DynamicCache's tensors) and the input ids, at batch 2 and 4; half the difference is the
per-sample bytes (batch 1 is left out: some reshapes are views there and copies above) the planner's activations at the end of forward are compared with.

    python3 lab/cpu/saved_bytes_moe.py   # writes tests/data/types30_moe_saved.jsonl
"""
import json
import os

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "types30_moe_saved.jsonl")
SEQ = 32

DEEPSEEK = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                n_shared_experts=1, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
                kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                vocab_size=128, max_position_embeddings=256, routed_scaling_factor=2.5, norm_topk_prob=True)
GPT_OSS = dict(model_type="gpt_oss", hidden_size=64, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
               num_experts_per_tok=2, vocab_size=128, pad_token_id=1, eos_token_id=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)


def saved(model, batch):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def keep(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.nbytes() > 0:
            seen[s.data_ptr()] = s.nbytes()

    def pack(t):
        keep(t)
        return t

    torch.manual_seed(0)
    ids = torch.randint(3, 128, (batch, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    keep(ids)
    keep(out.logits)
    for layer in getattr(out.past_key_values, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None:
                keep(t)
    total = sum(seen.values())
    out.loss.backward()
    return total


def main():
    rows = []
    for cfg in (DEEPSEEK, GPT_OSS):
        for precision in ("fp32", "bf16"):
            c = dict(cfg)
            mt = c.pop("model_type")
            config = AutoConfig.for_model(mt, **c)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
            if precision == "bf16":
                model = model.to(torch.bfloat16)
            model.train()
            two, four = saved(model, 2), saved(model, 4)
            rows.append({"config": cfg, "seq": SEQ, "precision": precision, "attention": "eager",
                         "experts_implementation": getattr(model.config, "_experts_implementation", None),
                         "saved_batch2": two, "saved_batch4": four, "per_sample": (four - two) // 2,
                         "versions": {"torch": torch.__version__, "transformers": transformers.__version__}})
            print(mt, precision, rows[-1]["experts_implementation"], two, four, (four - two) // 2)
    with open(OUT, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Session 24 (issue 26): on the GPU, which attention transformers 5.17 gives Gemma 2 by default, the
source of sdpa_attention_forward (it drops the layer's softcap keyword), and the bytes a tiny Gemma 2
forward keeps for backward under SDPA and under eager (eager also saves the soft-cap's tanh output).

    python3 lab/device/probe_gemma2_sdpa.py > $OUT/probe_gemma2.txt
"""
import inspect, json, torch, transformers
from transformers.models.gemma2 import modeling_gemma2 as m
from transformers.integrations import sdpa_attention as s
print("transformers", transformers.__version__, "torch", torch.__version__)
print("=== Gemma2Attention.forward"); print(inspect.getsource(m.Gemma2Attention.forward))
print("=== Gemma2PreTrainedModel attrs", {k: v for k, v in m.Gemma2PreTrainedModel.__dict__.items() if k.startswith("_")and not callable(v)})
print("=== sdpa_attention_forward"); print(inspect.getsource(s))
cfg = transformers.Gemma2Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=32)
mdl = transformers.AutoModelForCausalLM.from_config(cfg)
print("default attn (from_config, no arg):", mdl.config._attn_implementation)
mdl2 = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
print("explicit sdpa:", mdl2.config._attn_implementation)
# which SDPA backend runs for fp32, enable_gqa, causal, on this GPU; and what backward saves
mdl2 = mdl2.cuda().train()
ids = torch.randint(0, 1000, (2, 1024), device="cuda")
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
a0 = torch.cuda.memory_allocated()
out = mdl2(input_ids=ids, labels=ids)
print("after forward saved bytes (sdpa fp32):", torch.cuda.memory_allocated() - a0)
mdl3 = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").cuda().train()
a0 = torch.cuda.memory_allocated()
out3 = mdl3(input_ids=ids, labels=ids)
print("after forward saved bytes (eager fp32):", torch.cuda.memory_allocated() - a0)
print("s^2 fp32 per head per layer per sample x heads x layers x batch:", 1024*1024*4*8*2*2)

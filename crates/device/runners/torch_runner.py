#!/usr/bin/env python3
"""vramlab reference runner: builds the reference PyTorch model of a preset and
measures the real memory of one training step.

Dependencies: Python standard library, torch, torchvision, transformers, and
optionally pynvml (package nvidia-ml-py). No network access is needed: Hugging
Face models are built from config objects, never downloaded.

stdout carries JSON only, one object per line; all logging goes to stderr.

Modes
-----
  torch_runner.py --env                                   versions line only
  torch_runner.py count [ID|PATH ...] [--write FILE]       parameter counts (meta device, no GPU)
  torch_runner.py measure [CONFIGS.jsonl] [--config JSON | --model ID --batch N ...]
                          [--cap-gib X] [--device cuda|cpu]
  torch_runner.py max-batch [CONFIG.jsonl|--config JSON | --model ...] --cap-gib X
  torch_runner.py serve [--device cuda|cpu]               one config per stdin line, one result
                                                          line each; the model is kept between
                                                          lines (vramlab's PyTorch bench engine)

Measurement config (one JSON object per line):
  {"model": id or path to a preset .json or a Hugging Face config.json, "batch": N,
   "image": px (image models) | "seq": len (token models)   -- default: the preset's input,
   "precision": "fp32" | "amp-fp16" | "amp-bf16" | "bf16",   -- default fp32
   "optimizer": "sgd" | "sgd-momentum" | "adam" | "adamw" | "adafactor",   -- default adamw
   "accum": 1, "checkpointing": false, "attention": "sdpa" | "eager",
   "loop": "plain" | "trainer" | "lightning",   -- default plain (see the loop below;
   lightning: Lightning's closure order, the output dropped and zero_grad after the forward)
   "finetune": "full" | "lora", "lora_rank": 8, "lora_targets": "attn" | "all-linear" | "a,b",
   "lora_alpha": 16, "lora_dropout": 0.0}   -- default full; lora: peft.get_peft_model with
   LoraConfig(r, lora_alpha, lora_dropout, target_modules) after the bf16 cast and checkpointing
   ("attn": peft's default targets, c_attn / q_proj,v_proj; "all-linear": peft's, no lm_head);
   rows get "trainable_params" / "all_params" (peft's get_nb_trainable_parameters)
   "finetune": "qlora", "quant": "nf4" | "fp4" | "int8", "double_quant": true   -- bitsandbytes
   base layers, prepare_model_for_kbit_training, then LoRA as above (crates/device/runners/torch_qlora.py);
   "qlora_build": "replaced" (default: the base built on the device in fp32, each linear
   replaced by its quantized copy) | "as-loaded" (built on the CPU in bf16 and moved as
   from_pretrained(quantization_config=...) loads it: the device never holds the fp32 model);
   rows get "quant_bytes" and, for the paged optimizers, "paged_state_bytes"
   "freeze_embeddings": true, "freeze_blocks": N   -- full fine-tuning of part of the model:
   every nn.Embedding and the first N blocks of the longest nn.ModuleList get
   requires_grad_(False) (after checkpointing); rows get "trainable_params"
   "checkpoint_reentrant": true   -- with "checkpointing" (Hugging Face families):
   gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
   (torch's CheckpointFunction); lora: model.enable_input_require_grads() before
   get_peft_model; qlora: prepare_model_for_kbit_training with the same kwargs (peft calls
   enable_input_require_grads itself)
   "lora_merged": true   -- eval / eval-grad rows of lora / qlora: after the WARMUP training
   steps, model = model.merge_and_unload() (peft; bnb layers re-quantize the merged weight)
   before the evaluation step; the optimizer still holds the adapters (and their grads and
   state). Merging right after get_peft_model would leave nothing to train in the warm-up.

A config.json (a JSON object with "model_type", no "family") is built with
AutoConfig.for_model(model_type, **config) and AutoModelForCausalLM.from_config
(AutoModelForMaskedLM for bert/roberta), random init, nothing downloaded.

The measured training step (the Rust planner models exactly this loop)
----------------------------------------------------------------------
  model = build_reference(preset, image|seq, attention)     # built directly on the GPU
  if precision == "bf16": model.to(torch.bfloat16)          # pure bf16 training
  if checkpointing: wrap blocks (see presets/README.md "Checkpointing")
  model.train()
  opt = make_optimizer(...)   # SGD(lr=1e-3) / SGD(lr=1e-3, momentum=0.9) / Adam(lr=1e-4)
                              # / AdamW(lr=1e-4) / Adafactor(lr=1e-3); foreach etc. left at default
  scaler = torch.amp.GradScaler("cuda")   only for amp-fp16
  for step in range(WARMUP + 1):          # WARMUP = 2; the last step is the measured one
                                          # (amp-fp16: while every step so far was skipped by the GradScaler
                                          #  (inf grads at the initial scale 65536), warm-up goes on, at most
                                          #  16 more steps, so that optimizer state exists before the measured
                                          #  step; "amp_skipped_steps" records it)
      if step == WARMUP:
          torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
          allocated_start = torch.cuda.memory_allocated()      # params + grads + optimizer state
      opt.zero_grad(set_to_none=True)
      for micro in range(accum):
          x, y = make_batch()   # created on the GPU each micro-step:
                                #  classifiers: x fp32 randn (B,3,H,W) (bf16 under pure bf16), y int64 (B,)
                                #  segmentation/unet: same x, y int64 (B,H,W)
                                #  tokens: x int64 (B,S) input_ids; y = x (labels = input_ids; BERT MLM too)
          with torch.autocast("cuda", dtype=fp16|bf16, enabled=amp):
              out = model(x)                    # HF: out = model(input_ids=x, labels=y); loss = out.loss
              loss = F.cross_entropy(logits, y)  # vision; segmentation uses out["out"]
              # loop "trainer": loss = model(input_ids=x, labels=y).loss (vision:
              # F.cross_entropy(model(x), y)): no `out` is kept, as HF Trainer / Lightning
              loss = loss / accum
          # measured step, last micro-step: synchronize; allocated_after_forward = memory_allocated()
          scaler.scale(loss).backward() if amp-fp16 else loss.backward()
          del out, loss, x, y
      scaler.step(opt); scaler.update()   if amp-fp16 else opt.step()
  torch.cuda.synchronize()
  peak_allocated = max_memory_allocated(); peak_reserved = max_memory_reserved()

Extra phase readings taken on the measured step (synchronize + memory_allocated /
max_memory_allocated, which do not change what is allocated):
  allocated_after_forward / peak_after_forward   (last micro-step, before backward)
  allocated_after_backward / peak_after_backward (after the last backward, before the optimizer step)
  grad_bytes, opt_state_bytes                    (after the optimizer step)

Between configs the optimizer, scaler and grads are deleted, then gc.collect() and
torch.cuda.empty_cache(). The model is rebuilt when (model, precision dtype,
attention, image size for ViT, checkpointing) changes.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

# The repository root: this file is crates/device/runners/torch_runner.py in a checkout (the
# binary writes a copy elsewhere and passes presets inline); else the working directory.
_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = next((d for d in (os.path.dirname(os.path.dirname(os.path.dirname(_HERE))), os.getcwd())
             if os.path.isdir(os.path.join(d, "presets", "models"))),
            os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))
PRESET_DIR = os.path.join(ROOT, "presets", "models")
PARAM_COUNTS_PATH = os.path.join(ROOT, "tests", "data", "param_counts.jsonl")

WARMUP = 2
AMP_EXTRA_WARMUP = 16  # amp-fp16 only: extra warm-up steps allowed while the GradScaler skips every step

IMAGE_CLASSIFIERS = {"resnet", "efficientnet", "mobilenet_v3", "convnext", "vit"}
SEGMENTATION = {"deeplabv3", "fcn", "unet"}
IMAGE_FAMILIES = IMAGE_CLASSIFIERS | SEGMENTATION
TOKEN_FAMILIES = {"gpt2", "bert", "llama", "hf"}
HF_FAMILIES = TOKEN_FAMILIES

PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adafactor",
              "adam8bit", "adamw-8bit", "paged-adamw-8bit", "paged-adamw")  # the last four: bitsandbytes
ATTENTIONS = ("sdpa", "eager")
LOOPS = ("plain", "trainer", "lightning")
STEPS = ("train", "eval", "eval-grad")
FINETUNES = ("full", "lora", "qlora")
MASKED_LM_TYPES = ("bert", "roberta", "modernbert", "deberta-v2")
# transformers 5.17 refuses attn_implementation="sdpa" for these (no SDPA path; gpt_oss: attention
# sinks): rows must ask for eager attention, which is what vramlab plans for them
EAGER_ONLY_TYPES = ("deberta-v2", "gpt_oss")


# --------------------------------------------------------------------------
# output helpers
# --------------------------------------------------------------------------

def log(*args):
    print("[torch_runner]", *args, file=sys.stderr, flush=True)


class Emitter:
    """Writes one JSON object per line to stdout (and optionally a file), flushed."""

    def __init__(self, path=None):
        self.file = open(path, "a") if path else None

    def __call__(self, obj):
        line = json.dumps(obj, allow_nan=True)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


# --------------------------------------------------------------------------
# versions / NVML
# --------------------------------------------------------------------------

_NVML = {"init": None, "mod": None}


def _nvml():
    """Returns the pynvml module after nvmlInit, or None."""
    if _NVML["init"] is None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            _NVML["mod"] = pynvml
            _NVML["init"] = True
        except Exception as e:  # not installed, no driver, ...
            log(f"pynvml unavailable: {e!r}")
            _NVML["init"] = False
    return _NVML["mod"] if _NVML["init"] else None


def _nvml_handle(nv, device_index=0):
    try:
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        if not uuid.startswith("GPU-"):
            uuid = "GPU-" + uuid
        return nv.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        pass
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        idx = int(visible.split(",")[device_index]) if visible else device_index
        return nv.nvmlDeviceGetHandleByIndex(idx)
    except Exception:
        return None


def nvml_readings():
    """(process_bytes, device_used_bytes) from NVML; None where unavailable."""
    nv = _nvml()
    if nv is None or not torch.cuda.is_available():
        return None, None
    h = _nvml_handle(nv, torch.cuda.current_device())
    if h is None:
        return None, None
    proc = None
    used = None
    try:
        pid = os.getpid()
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == pid and p.usedGpuMemory is not None:
                proc = int(p.usedGpuMemory)
    except Exception as e:
        log(f"nvmlDeviceGetComputeRunningProcesses failed: {e!r}")
    try:
        used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
    except Exception as e:
        log(f"nvmlDeviceGetMemoryInfo failed: {e!r}")
    return proc, used


def _pkg_version(name):
    try:
        mod = __import__(name)
        return getattr(mod, "__version__", None)
    except Exception:
        return None


_VERSIONS = None


def versions():
    global _VERSIONS
    if _VERSIONS is not None:
        return _VERSIONS
    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torchvision": _pkg_version("torchvision"),
        "transformers": _pkg_version("transformers"),
        "peft": _pkg_version("peft"),
        "bitsandbytes": _pkg_version("bitsandbytes"),
        "driver": None,
        "device_name": None,
        "device_total_bytes": None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        v["device_name"] = props.name
        v["device_total_bytes"] = int(props.total_memory)
        nv = _nvml()
        if nv is not None:
            try:
                d = nv.nvmlSystemGetDriverVersion()
                v["driver"] = d.decode() if isinstance(d, bytes) else d
            except Exception:
                pass
    _VERSIONS = v
    return v


# --------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------

def load_preset(ref):
    """`ref` is a preset id (presets/models/<id>.json) or a path to a preset json."""
    if isinstance(ref, dict):
        if ref.get("family") in ("llama", "bert") and "model_type" in ref.get("params", {}):
            # a config.json imported by vramlab (`vramlab bench --model config.json`)
            return hf_preset(hf_config_from_params(ref["params"]), ref.get("id", "imported"))
        if ref.get("family") == "t5":
            return hf_preset(t5_config_from_params(ref["params"]), ref.get("id", "imported"))
        return ref
    path = ref if (ref.endswith(".json") or os.sep in ref) and os.path.exists(ref) else None
    if path is None:
        path = os.path.join(PRESET_DIR, ref + ".json")
    with open(path) as f:
        doc = json.load(f)
    if "model_type" in doc and "family" not in doc:
        return hf_preset(doc, path)
    return doc


# vramlab's option fields of an imported decoder / BERT: implied by model_type, not config keys
VRAMLAB_ONLY = ("model_type", "qkv_bias", "qk_norm", "gemma", "sandwich_norm", "fused_projections",
                "position_offset", "hidden_act", "moe",
                # issue 30's decoder options (implied by model_type or renamed below)
                "norm", "post_norm", "qk_norm_full_width", "plain_mlp", "nope_layers", "sliding_layers",
                "multipliers", "falcon", "attention_bias", "mlp_bias", "embedding_dropout",
                "residual_dropout", "sliding_window", "full_attention_every",
                # issue 30's MoE types (deepseek_v3, gpt_oss)
                "mla", "attention_sinks", "quantization")


def falcon_config_from_params(p):
    """FalconConfig keys of vramlab's imported Falcon (inverse of hf.rs `falcon_params`)."""
    f = p["falcon"]
    new = f["new_decoder_architecture"]
    return {"model_type": "falcon", "vocab_size": p["vocab_size"], "hidden_size": p["hidden_size"],
            "num_hidden_layers": p["num_hidden_layers"], "num_attention_heads": p["num_attention_heads"],
            "num_kv_heads": p["num_key_value_heads"], "new_decoder_architecture": new,
            "multi_query": (not new) and p["num_key_value_heads"] == 1,
            "parallel_attn": f["parallel_attn"], "num_ln_in_parallel_attn": f["num_ln_in_parallel_attn"],
            "ffn_hidden_size": p["intermediate_size"], "bias": p.get("attention_bias", False),
            "activation": p.get("hidden_act", "gelu"), "hidden_dropout": f.get("hidden_dropout", 0.0),
            "attention_dropout": p.get("attention_dropout", 0.0), "alibi": False,
            "tie_word_embeddings": p["tie_word_embeddings"],
            "max_position_embeddings": p["max_position_embeddings"]}


def encoder_config_from_params(p):
    """ModernBertConfig / DebertaV2Config keys of vramlab's imported encoder (inverse of hf.rs
    `modernbert_params` / `deberta_params`)."""
    mt = p["model_type"]
    cfg = {k: p[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "intermediate_size", "max_position_embeddings")}
    cfg["model_type"] = mt
    if mt == "modernbert":
        m = p["modernbert"]
        sliding = set(m["sliding_layers"])
        cfg["layer_types"] = ["sliding_attention" if i in sliding else "full_attention"
                              for i in range(p["num_hidden_layers"])]
        cfg["attention_dropout"] = p["attention_probs_dropout_prob"]
        for k in ("local_attention", "attention_bias", "mlp_bias", "norm_bias", "classifier_bias",
                  "decoder_bias", "tie_word_embeddings", "embedding_dropout", "mlp_dropout"):
            cfg[k] = m[k]
        # the config class's special-token defaults index a 50368-token vocabulary
        for k in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
            cfg[k] = 0
        return cfg
    d = p["deberta"]
    terms = [t for t in ("c2p", "p2c") if d[t]]
    cfg.update(type_vocab_size=p["type_vocab_size"], hidden_dropout_prob=p["hidden_dropout_prob"],
               attention_probs_dropout_prob=p["attention_probs_dropout_prob"],
               relative_attention=d["relative_attention"], position_buckets=d["att_span"],
               max_relative_positions=d["att_span"], pos_att_type=terms,
               share_att_key=d["share_att_key"], norm_rel_ebd="layer_norm" if d["norm_rel_ebd"] else "none",
               position_biased_input=d["position_biased_input"], attention_head_size=d["head_size"],
               legacy=d["legacy"])
    if d.get("conv"):
        cfg.update(conv_kernel_size=d["conv"]["kernel"], conv_groups=d["conv"]["groups"],
                   conv_act="gelu" if d["conv"]["gelu"] else "tanh")
    return cfg


def hf_config_from_params(params):
    """The config.json fields of a preset imported by vramlab's HF import (inverse mapping)."""
    mt = params["model_type"]
    if mt == "falcon":
        return falcon_config_from_params(params)
    if mt in ("modernbert", "deberta-v2"):
        return encoder_config_from_params(params)
    cfg = {k: v for k, v in params.items() if k not in VRAMLAB_ONLY}
    cfg["model_type"] = mt
    # options that are config keys under their own name for the types that read them
    for k in ("attention_bias", "mlp_bias", "sliding_window"):
        if k in params:
            cfg[k] = params[k]
    if mt == "starcoder2":
        cfg["use_bias"] = params.get("attention_bias", False)
        cfg["embedding_dropout"] = params.get("embedding_dropout", 0.0)
        cfg["residual_dropout"] = params.get("residual_dropout", 0.0)
    if mt == "granite" and params.get("multipliers"):
        cfg.update(params["multipliers"])
    if mt == "smollm3":
        nope = set(params.get("nope_layers", []))
        cfg["no_rope_layers"] = [0 if i in nope else 1 for i in range(params["num_hidden_layers"])]
        sliding = params.get("sliding_layers")
        cfg["use_sliding_window"] = sliding is not None and params.get("sliding_window") is not None
        if sliding is not None:
            cfg["layer_types"] = ["sliding_attention" if i in set(sliding) else "full_attention"
                                  for i in range(params["num_hidden_layers"])]
    if "hidden_act" in params:
        cfg["hidden_activation" if mt.startswith("gemma") else "hidden_act"] = params["hidden_act"]
    if mt == "roberta":
        cfg["pad_token_id"] = params.get("position_offset", 2) - 1
    if mt == "qwen2_moe":
        cfg["qkv_bias"] = params.get("qkv_bias", False)
    moe = params.get("moe")
    if mt in ("deepseek_v3", "gpt_oss"):
        cfg.update(moe_config_from_params(params))
    elif moe:
        # vramlab's MoeParams back to the config keys (crates/core/src/model/hf.rs, moe_params)
        cfg["num_experts_per_tok"] = moe["num_experts_per_tok"]
        cfg["output_router_logits"] = moe.get("output_router_logits", False)
        if mt == "mixtral":
            cfg["num_local_experts"] = moe["num_experts"]
        else:
            cfg["num_experts"] = moe["num_experts"]
            cfg["moe_intermediate_size"] = moe["moe_intermediate_size"]
            cfg["norm_topk_prob"] = moe.get("norm_topk_prob", False)
            cfg["decoder_sparse_step"] = moe.get("decoder_sparse_step", 1)
            cfg["mlp_only_layers"] = moe.get("mlp_only_layers", [])
            if "shared_expert_intermediate_size" in moe:
                cfg["shared_expert_intermediate_size"] = moe["shared_expert_intermediate_size"]
    if mt.startswith("gemma"):
        cfg.setdefault("attn_logit_softcapping", None)
        cfg.setdefault("final_logit_softcapping", None)
    return cfg


def bart_config_from_params(p):
    """The BART config.json of vramlab's imported BART preset (family "t5" with `bart`
    options; inverse of hf.rs `bart_params`)."""
    o = p["bart"]
    return dict(model_type="bart", vocab_size=p["vocab_size"], d_model=p["d_model"],
                encoder_layers=p["num_layers"], decoder_layers=p["num_decoder_layers"],
                encoder_attention_heads=p["num_heads"], decoder_attention_heads=p["num_heads"],
                encoder_ffn_dim=p["d_ff"], decoder_ffn_dim=p["d_ff"],
                activation_function=p["dense_act_fn"], dropout=p["dropout_rate"],
                attention_dropout=o["attention_dropout"], activation_dropout=o["activation_dropout"],
                max_position_embeddings=o["max_position_embeddings"],
                scale_embedding=o["scale_embedding"])


def moe_config_from_params(p):
    """DeepseekV3Config / GptOssConfig keys of vramlab's imported deepseek_v3 / gpt_oss (inverse
    of hf.rs `deepseek_moe`, `mla_params` and the gpt_oss arms of `decoder_params`)."""
    moe = p["moe"]
    cfg = {"num_experts_per_tok": moe["num_experts_per_tok"]}
    if p["model_type"] == "deepseek_v3":
        m = p["mla"]
        router = moe["router"]["sigmoid_grouped"]
        cfg.update(q_lora_rank=m.get("q_lora_rank"), kv_lora_rank=m["kv_lora_rank"],
                   qk_nope_head_dim=m["qk_nope_head_dim"], qk_rope_head_dim=m["qk_rope_head_dim"],
                   v_head_dim=m["v_head_dim"], n_routed_experts=moe["num_experts"],
                   moe_intermediate_size=moe["moe_intermediate_size"],
                   n_shared_experts=moe["shared_expert_intermediate_size"] // moe["moe_intermediate_size"],
                   first_k_dense_replace=len(moe.get("mlp_only_layers", [])),
                   norm_topk_prob=moe.get("norm_topk_prob", False),
                   n_group=router["n_group"], topk_group=router["topk_group"])
        cfg.pop("head_dim", None)
    else:
        layers = p["num_hidden_layers"]
        sliding = set(p.get("sliding_layers") or [])
        cfg.update(num_local_experts=moe["num_experts"], intermediate_size=moe["moe_intermediate_size"],
                   output_router_logits=moe.get("output_router_logits", False),
                   layer_types=["sliding_attention" if i in sliding else "full_attention"
                                for i in range(layers)],
                   sliding_window=p.get("sliding_window"))
    return cfg


def t5_config_from_params(p):
    """The T5 config.json of vramlab's imported T5 preset (inverse of hf.rs `t5_params`)."""
    if p.get("bart"):
        return bart_config_from_params(p)
    act = p["dense_act_fn"]
    if p["is_gated_act"]:
        proj = "gated-gelu" if act == "gelu_new" else "gated-" + act
    else:
        proj = act
    keys = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
            "num_heads", "relative_attention_num_buckets", "dropout_rate")
    cfg = {k: p[k] for k in keys}
    cfg.update(model_type="t5", feed_forward_proj=proj,
               tie_word_embeddings=bool(p["scale_decoder_outputs"]))
    return cfg


def hf_preset(cfg, path):
    """A Hugging Face config.json as a preset dict of family "hf" (built with AutoConfig)."""
    maxpos = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048
    if cfg["model_type"] == "roberta":
        maxpos -= cfg.get("pad_token_id", 1) + 1
    return {
        "id": path,
        "family": "hf",
        "hf_config": cfg,
        "input": {"kind": "tokens", "seq_len": min(maxpos, 2048)},
        "params": {"vocab_size": cfg["vocab_size"]},
    }


def all_preset_ids():
    return sorted(n[:-5] for n in os.listdir(PRESET_DIR) if n.endswith(".json"))


# --------------------------------------------------------------------------
# reference UNet (mirrored op by op by the Rust builder; see presets/README.md)
# --------------------------------------------------------------------------

class DoubleConv(nn.Sequential):
    """(Conv3x3 pad 1 no bias -> BatchNorm2d -> ReLU(inplace=True)) x 2."""

    def __init__(self, cin, cout):
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    """MaxPool2d(2) -> DoubleConv."""

    def __init__(self, cin, cout):
        super().__init__(nn.MaxPool2d(2), DoubleConv(cin, cout))


class UNet(nn.Module):
    def __init__(self, in_channels=3, num_classes=2, base_channels=64, depth=4):
        super().__init__()
        c = base_channels
        self.depth = depth
        self.inc = DoubleConv(in_channels, c)
        self.downs = nn.ModuleList([Down(c * 2 ** i, c * 2 ** (i + 1)) for i in range(depth)])
        # decoder level i (from the bottom): c*2^(i+1) -> c*2^i
        self.ups = nn.ModuleList()
        self.up_convs = nn.ModuleList()
        for i in reversed(range(depth)):
            self.ups.append(nn.ConvTranspose2d(c * 2 ** (i + 1), c * 2 ** i, kernel_size=2, stride=2, bias=True))
            self.up_convs.append(DoubleConv(c * 2 ** (i + 1), c * 2 ** i))
        self.outc = nn.Conv2d(c, num_classes, kernel_size=1, bias=True)

    def forward(self, x):
        x = self.inc(x)
        skips = [x]
        for down in self.downs:
            x = down(x)
            skips.append(x)
        skips.pop()  # the bottom output is x itself
        for up, conv in zip(self.ups, self.up_convs):
            x = up(x)
            x = torch.cat([skips.pop(), x], dim=1)
            x = conv(x)
        return self.outc(x)


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------

def _check_keys(preset, required):
    params = preset["params"]
    missing = [k for k in required if k not in params]
    unknown = [k for k in params if k not in required]
    if missing or unknown:
        raise ValueError(f"preset {preset.get('id')}: missing params {missing}, unknown params {unknown}")
    return params


def build_resnet(preset, size):
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    p = _check_keys(preset, ["block", "layers", "num_classes", "groups", "width_per_group"])
    block = {"basic": BasicBlock, "bottleneck": Bottleneck}[p["block"]]
    return ResNet(block, list(p["layers"]), num_classes=p["num_classes"], groups=p["groups"],
                  width_per_group=p["width_per_group"])


def build_efficientnet(preset, size):
    from functools import partial

    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    p = _check_keys(preset, ["width_mult", "depth_mult", "dropout", "stochastic_depth_prob", "num_classes"])
    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=p["width_mult"],
                                               depth_mult=p["depth_mult"])
    kwargs = {}
    # torchvision's efficientnet_b5/b6/b7 pass this norm layer (same parameters and memory, other eps/momentum)
    if preset.get("id") in ("efficientnet_b5", "efficientnet_b6", "efficientnet_b7"):
        kwargs["norm_layer"] = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
    return EfficientNet(setting, p["dropout"], stochastic_depth_prob=p["stochastic_depth_prob"],
                        num_classes=p["num_classes"], last_channel=last_channel, **kwargs)


def build_mobilenet_v3(preset, size):
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    p = _check_keys(preset, ["arch", "width_mult", "dropout", "num_classes"])
    setting, last_channel = _mobilenet_v3_conf("mobilenet_v3_" + p["arch"], width_mult=p["width_mult"])
    return MobileNetV3(setting, last_channel, num_classes=p["num_classes"], dropout=p["dropout"])


def build_convnext(preset, size):
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    p = _check_keys(preset, ["channels", "depths", "stochastic_depth_prob", "num_classes"])
    ch, de = p["channels"], p["depths"]
    if len(ch) != len(de):
        raise ValueError("convnext: channels and depths must have the same length")
    setting = [CNBlockConfig(ch[i], ch[i + 1] if i + 1 < len(ch) else None, de[i]) for i in range(len(ch))]
    return ConvNeXt(setting, stochastic_depth_prob=p["stochastic_depth_prob"], num_classes=p["num_classes"])


def build_vit(preset, size):
    from torchvision.models.vision_transformer import VisionTransformer

    p = _check_keys(preset, ["patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim", "dropout",
                             "attention_dropout", "num_classes"])
    image_size = size or preset["input"]["image_size"]
    return VisionTransformer(image_size=image_size, patch_size=p["patch_size"], num_layers=p["num_layers"],
                             num_heads=p["num_heads"], hidden_dim=p["hidden_dim"], mlp_dim=p["mlp_dim"],
                             dropout=p["dropout"], attention_dropout=p["attention_dropout"],
                             num_classes=p["num_classes"])


def _seg_backbone(p):
    from torchvision.models.resnet import Bottleneck, ResNet

    # == torchvision resnet50/101(weights=None, replace_stride_with_dilation=[False, True, True])
    return ResNet(Bottleneck, list(p["backbone_layers"]), replace_stride_with_dilation=[False, True, True])


def build_deeplabv3(preset, size):
    from torchvision.models.segmentation.deeplabv3 import _deeplabv3_resnet

    p = _check_keys(preset, ["backbone_layers", "num_classes"])
    return _deeplabv3_resnet(_seg_backbone(p), p["num_classes"], None)  # aux_loss default None: no aux head


def build_fcn(preset, size):
    from torchvision.models.segmentation.fcn import _fcn_resnet

    p = _check_keys(preset, ["backbone_layers", "num_classes"])
    return _fcn_resnet(_seg_backbone(p), p["num_classes"], None)


def build_unet(preset, size):
    p = _check_keys(preset, ["depth", "base_channels", "in_channels", "num_classes"])
    return UNet(in_channels=p["in_channels"], num_classes=p["num_classes"], base_channels=p["base_channels"],
                depth=p["depth"])


GPT2_KEYS = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
             "resid_pdrop", "embd_pdrop", "attn_pdrop", "tie_word_embeddings"]
BERT_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob", "attention_probs_dropout_prob"]
LLAMA_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "attention_dropout"]


def _hf_model(config_cls, model_cls, params, attention):
    config = config_cls(**params, attn_implementation=attention)
    model = model_cls(config)
    got = getattr(model.config, "_attn_implementation", None)
    if got != attention:
        # older/newer transformers: force it and re-check
        model.config._attn_implementation = attention
        got = getattr(model.config, "_attn_implementation", None)
        if got != attention:
            raise RuntimeError(f"attn_implementation {attention!r} did not take effect (got {got!r})")
    return model


def build_gpt2(preset, size, attention="sdpa", dtype=None):  # dtype: cast after (small presets)
    from transformers import GPT2Config, GPT2LMHeadModel

    p = _check_keys(preset, GPT2_KEYS)
    return _hf_model(GPT2Config, GPT2LMHeadModel, p, attention)


def build_bert(preset, size, attention="sdpa", dtype=None):
    from transformers import BertConfig, BertForMaskedLM

    p = _check_keys(preset, BERT_KEYS)
    return _hf_model(BertConfig, BertForMaskedLM, p, attention)


def build_llama(preset, size, attention="sdpa", dtype=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    p = _check_keys(preset, LLAMA_KEYS)
    return _hf_model(LlamaConfig, LlamaForCausalLM, p, attention)


def build_hf(preset, size, attention="sdpa", dtype=None):
    """AutoConfig.for_model(model_type, **config) → AutoModelForCausalLM (MaskedLM for
    bert/roberta) .from_config, random init, no download. dtype: the parameters' dtype at
    construction (fp32 when None); pure-bf16 rows build in bf16 directly, as
    `from_pretrained(..., dtype=torch.bfloat16)` does, so that a 7B model under a 24 GiB cap
    is never materialised in fp32 first."""
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM,
                              AutoModelForSeq2SeqLM)

    cfg = dict(preset["hf_config"])
    mt = cfg.pop("model_type")
    for k in ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
              "auto_map", "quantization_config"):
        cfg.pop(k, None)
    if mt in EAGER_ONLY_TYPES and attention != "eager":
        raise ValueError(f"{mt}: transformers 5.17 refuses {attention} attention for this model; "
                         "measure it with \"attention\": \"eager\" (what vramlab plans for it)")
    config = AutoConfig.for_model(mt, **cfg)
    config._attn_implementation = attention
    if getattr(config, "is_encoder_decoder", False):
        cls = AutoModelForSeq2SeqLM  # T5, BART: labels (B, target_seq) → decoder inputs shifted
    elif mt in MASKED_LM_TYPES:
        cls = AutoModelForMaskedLM
    else:
        cls = AutoModelForCausalLM
    model = cls.from_config(config, attn_implementation=attention, dtype=dtype or torch.float32)
    got = getattr(model.config, "_attn_implementation", None)
    if got != attention:
        raise RuntimeError(f"attn_implementation {attention!r} did not take effect (got {got!r})")
    return model


BUILDERS = {
    "hf": build_hf,
    "resnet": build_resnet,
    "efficientnet": build_efficientnet,
    "mobilenet_v3": build_mobilenet_v3,
    "convnext": build_convnext,
    "vit": build_vit,
    "deeplabv3": build_deeplabv3,
    "fcn": build_fcn,
    "unet": build_unet,
    "gpt2": build_gpt2,
    "bert": build_bert,
    "llama": build_llama,
}


def build_reference(preset, size=None, attention="sdpa", dtype=None):
    """Constructs the reference nn.Module of a preset dict (or id / path).

    size: image_size (only ViT's parameters depend on it) or seq_len (no effect on the
    module); None means the preset's input. attention: "sdpa" | "eager" (HF models only).
    The module is created on the current default device (use `with torch.device(...)`).
    """
    preset = load_preset(preset)
    fam = preset["family"]
    if fam not in BUILDERS:
        raise ValueError(f"unknown family {fam!r}")
    if fam in HF_FAMILIES:
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}")
        return BUILDERS[fam](preset, size, attention=attention, dtype=dtype)
    return BUILDERS[fam](preset, size)


# --------------------------------------------------------------------------
# activation checkpointing of torchvision / UNet blocks
# --------------------------------------------------------------------------

class CheckpointBlock(nn.Module):
    """forward = torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def checkpoint_block_types(family):
    if family in ("resnet", "deeplabv3", "fcn"):
        from torchvision.models.resnet import BasicBlock, Bottleneck

        return (BasicBlock, Bottleneck)
    if family == "vit":
        from torchvision.models.vision_transformer import EncoderBlock

        return (EncoderBlock,)
    if family == "convnext":
        from torchvision.models.convnext import CNBlock

        return (CNBlock,)
    if family == "efficientnet":
        from torchvision.models.efficientnet import FusedMBConv, MBConv

        return (MBConv, FusedMBConv)
    if family == "mobilenet_v3":
        from torchvision.models.mobilenetv3 import InvertedResidual

        return (InvertedResidual,)
    if family == "unet":
        return (DoubleConv,)
    raise ValueError(f"no checkpoint blocks for {family}")


def wrap_checkpoint_blocks(module, types):
    """Replaces every submodule of one of `types` (outermost only) by CheckpointBlock(it)."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, types):
            setattr(module, name, CheckpointBlock(child))
            n += 1
        else:
            n += wrap_checkpoint_blocks(child, types)
    return n


def enable_checkpointing(model, family, reentrant=False):
    if family in HF_FAMILIES:
        import warnings

        with warnings.catch_warnings():  # transformers >= 5.2x: "deprecated, use activation_checkpointing_enable"
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": bool(reentrant)})
        try:
            from transformers.modeling_layers import GradientCheckpointingLayer
        except ImportError:
            GradientCheckpointingLayer = nn.Module
        return sum(1 for m in model.modules()
                   if isinstance(m, GradientCheckpointingLayer) and getattr(m, "gradient_checkpointing", False))
    return wrap_checkpoint_blocks(model, checkpoint_block_types(family))


# --------------------------------------------------------------------------
# count mode
# --------------------------------------------------------------------------

def count_params(preset):
    with torch.device("meta"):
        model = build_reference(preset)
    params = list(model.parameters())
    return {
        "id": preset["id"],
        "params": int(sum(p.numel() for p in params)),
        "param_tensors": len(params),
    }


def cmd_count(args, emit):
    refs = args.presets or all_preset_ids()
    v = versions()
    vers = {"torch": v["torch"], "torchvision": v["torchvision"], "transformers": v["transformers"]}
    lines = []
    for ref in refs:
        try:
            preset = load_preset(ref)
            row = count_params(preset)
            row["versions"] = vers
            row["measured_on"] = "cpu (meta device)"
        except Exception as e:
            row = {"id": ref, "error": f"{type(e).__name__}: {e}"}
            log(traceback.format_exc())
        emit(row)
        lines.append(row)
    if args.write:
        os.makedirs(os.path.dirname(os.path.abspath(args.write)), exist_ok=True)
        with open(args.write, "w") as f:
            for row in lines:
                f.write(json.dumps(row) + "\n")
        log(f"wrote {len(lines)} lines to {args.write}")
    return 0 if all("error" not in r for r in lines) else 1


# --------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------

def normalize_config(cfg):
    """Fills defaults and validates; returns (normalized config, preset)."""
    cfg = dict(cfg)
    if "model" not in cfg:
        raise ValueError("config needs 'model'")
    preset = load_preset(cfg["model"])
    fam = preset["family"]
    out = {"model": cfg.pop("model")}
    if "batch" in cfg:
        out["batch"] = int(cfg.pop("batch"))
    if fam in IMAGE_FAMILIES:
        out["image"] = int(cfg.pop("image", None) or preset["input"]["image_size"])
        cfg.pop("seq", None)
    else:
        out["seq"] = int(cfg.pop("seq", None) or preset["input"]["seq_len"])
        cfg.pop("image", None)
    out["precision"] = cfg.pop("precision", "fp32")
    out["optimizer"] = cfg.pop("optimizer", "adamw")
    out["accum"] = int(cfg.pop("accum", 1))
    out["checkpointing"] = bool(cfg.pop("checkpointing", False))
    if bool(cfg.pop("checkpoint_reentrant", False)):  # (other rows keep their old fields)
        if not out["checkpointing"]:
            raise ValueError("checkpoint_reentrant needs checkpointing")
        if fam not in HF_FAMILIES:
            raise ValueError(f"checkpoint_reentrant: only Hugging Face families, not {fam}")
        out["checkpoint_reentrant"] = True
    out["attention"] = cfg.pop("attention", "sdpa")
    out["loop"] = cfg.pop("loop", "plain")
    if out["loop"] not in LOOPS:
        raise ValueError(f"unknown loop {out['loop']!r}")
    step_kind = cfg.pop("step", "train")
    if step_kind not in STEPS:
        raise ValueError(f"unknown step {step_kind!r}")
    if step_kind != "train":  # (training rows keep their old fields, nothing added)
        out["step"] = step_kind
    if out["precision"] not in PRECISIONS:
        raise ValueError(f"unknown precision {out['precision']!r}")
    if out["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {out['optimizer']!r}")
    if out["attention"] not in ATTENTIONS:
        raise ValueError(f"unknown attention {out['attention']!r}")
    if out["accum"] < 1:
        raise ValueError("accum must be >= 1")
    ft = cfg.pop("finetune", "full")
    if ft not in FINETUNES:
        raise ValueError(f"unknown finetune {ft!r}")
    if ft in ("lora", "qlora"):  # (full fine-tuning rows keep their old fields, nothing added)
        out["finetune"] = ft
        out["lora_rank"] = int(cfg.pop("lora_rank", 8))
        out["lora_targets"] = str(cfg.pop("lora_targets", "attn"))
        out["lora_alpha"] = float(cfg.pop("lora_alpha", 16))
        out["lora_dropout"] = float(cfg.pop("lora_dropout", 0.0))
        if out["lora_rank"] < 1:
            raise ValueError("lora_rank must be >= 1")
        if fam not in HF_FAMILIES:
            raise ValueError(f"finetune lora: only Hugging Face families, not {fam}")
    fe, fb = bool(cfg.pop("freeze_embeddings", False)), int(cfg.pop("freeze_blocks", 0))
    if fe or fb:
        if ft != "full":
            raise ValueError("freeze_embeddings / freeze_blocks: full fine-tuning only")
        if fb < 0:
            raise ValueError("freeze_blocks must be >= 0")
        out["freeze_embeddings"], out["freeze_blocks"] = fe, fb
    if bool(cfg.pop("lora_merged", False)):  # (other rows keep their old fields)
        if ft not in ("lora", "qlora"):
            raise ValueError("lora_merged: lora / qlora only (nothing to merge)")
        if step_kind == "train":
            raise ValueError("lora_merged: eval / eval-grad steps only")
        out["lora_merged"] = True
    if ft == "qlora":
        out["quant"] = str(cfg.pop("quant", "nf4"))
        out["double_quant"] = bool(cfg.pop("double_quant", True))
        if out["quant"] not in ("nf4", "fp4", "int8"):
            raise ValueError(f"unknown quant {out['quant']!r}")
        build = str(cfg.pop("qlora_build", "replaced"))
        if build not in ("replaced", "as-loaded"):
            raise ValueError(f"unknown qlora_build {build!r} (replaced, as-loaded)")
        if build == "as-loaded":  # (rows of the default keep their old fields)
            out["qlora_build"] = build
    out.update(cfg)  # pass through anything else (e.g. a "tag") untouched
    return out, preset


def model_key(cfg, preset):
    fam = preset["family"]
    return (
        json.dumps(preset, sort_keys=True),
        torch.bfloat16 if cfg["precision"] == "bf16" else torch.float32,
        cfg["attention"] if fam in HF_FAMILIES else None,
        cfg["image"] if fam == "vit" else None,
        cfg["checkpointing"],
        cfg.get("checkpoint_reentrant", False),
        tuple(cfg.get(k) for k in ("finetune", "lora_rank", "lora_targets", "lora_alpha", "lora_dropout",
                                   "quant", "double_quant", "qlora_build", "freeze_embeddings",
                                   "freeze_blocks")),
    )


def freeze_parts(model, cfg):
    """requires_grad_(False) on every nn.Embedding (freeze_embeddings) and on the first
    freeze_blocks blocks of the model's longest nn.ModuleList (freeze_blocks). Returns the
    trainable parameter count."""
    if cfg.get("freeze_embeddings"):
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                m.requires_grad_(False)
    n = cfg.get("freeze_blocks", 0)
    if n:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        if not lists:
            raise ValueError("freeze_blocks: the model has no nn.ModuleList of blocks")
        blocks = max(lists, key=len)
        if n > len(blocks):
            raise ValueError(f"freeze_blocks {n} > the model's {len(blocks)} blocks")
        for b in blocks[:n]:
            b.requires_grad_(False)
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


# peft's default targets (LoraConfig without target_modules) by model_type: "attn"
LORA_ATTN_TARGETS = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"],
                     "qwen3": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"],
                     "bert": ["query", "value"], "gemma": ["q_proj", "v_proj"],
                     "gemma2": ["q_proj", "v_proj"], "gemma3_text": ["q_proj", "v_proj"]}


def apply_lora(model, cfg):
    """peft.get_peft_model with LoraConfig(r, lora_alpha, lora_dropout, target_modules); the
    base weights are frozen, adapters fp32 on a bf16 base (peft's autocast_adapter_dtype).
    Returns (model, trainable, all) as print_trainable_parameters counts them."""
    import peft

    t = cfg["lora_targets"]
    if t == "attn":
        mt = model.config.model_type
        if mt not in LORA_ATTN_TARGETS:
            raise ValueError(f"lora_targets attn: no default for model_type {mt}")
        targets = LORA_ATTN_TARGETS[mt]
    elif t == "all-linear":
        targets = "all-linear"
    else:
        targets = [x for x in t.split(",") if x]
    lc = peft.LoraConfig(r=cfg["lora_rank"], lora_alpha=cfg["lora_alpha"],
                         lora_dropout=cfg["lora_dropout"], target_modules=targets,
                         fan_in_fan_out=model.config.model_type == "gpt2" and cfg.get("finetune") != "qlora")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, lc)
    trainable, total = pm.get_nb_trainable_parameters()
    return pm, int(trainable), int(total)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3)
    if name in ("adam8bit", "adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        import torch_qlora

        return torch_qlora.make_optimizer(name, params)
    raise ValueError(name)


def tensor_bytes(t):
    return t.numel() * t.element_size()


def optimizer_state_bytes(opt):
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                total += tensor_bytes(v)
    return total


class Device:
    """Thin wrapper so the same loop runs on CUDA (measured) and CPU (debug)."""

    def __init__(self, kind):
        self.kind = kind
        self.cuda = kind == "cuda"
        self.torch_device = torch.device(kind)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self):
        return int(torch.cuda.memory_allocated()) if self.cuda else None

    def peak(self):
        return int(torch.cuda.max_memory_allocated()) if self.cuda else None

    def peak_reserved(self):
        return int(torch.cuda.max_memory_reserved()) if self.cuda else None

    def reserved(self):
        return int(torch.cuda.memory_reserved()) if self.cuda else None

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def stat(self, key):
        """A cumulative counter of torch.cuda.memory_stats() (num_alloc_retries: the caching
        allocator freed its cached blocks and retried cudaMalloc; num_ooms)."""
        return int(torch.cuda.memory_stats().get(key, 0)) if self.cuda else None

    def empty_cache(self):
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def timer(self):
        if self.cuda:
            return torch.cuda.Event(enable_timing=True)
        return None


class ModelHolder:
    """Keeps the built model between configs; rebuilds when the key changes."""

    def __init__(self, dev):
        self.dev = dev
        self.key = None
        self.model = None
        self.info = None

    def drop(self):
        self.model = None
        self.key = None
        self.info = None
        self.dev.empty_cache()

    def get(self, cfg, preset):
        key = model_key(cfg, preset)
        if key == self.key and self.model is not None:
            return self.model, self.info
        self.drop()
        fam = preset["family"]
        size = cfg.get("image") if fam in IMAGE_FAMILIES else cfg.get("seq")
        t0 = time.time()
        # QLoRA "as loaded": built on the CPU (in bf16, as a checkpoint is), then moved the
        # way from_pretrained with a quantization config loads it (torch_qlora.load_quantized).
        as_loaded = cfg.get("qlora_build") == "as-loaded"
        with torch.device("cpu" if as_loaded else self.dev.torch_device):
            model = build_reference(preset, size, attention=cfg["attention"],
                                    dtype=torch.bfloat16 if cfg["precision"] == "bf16" or as_loaded else None)
        if cfg["precision"] == "bf16":
            model = model.to(torch.bfloat16)
        reentrant = cfg.get("checkpoint_reentrant", False)
        wrapped = enable_checkpointing(model, fam, reentrant) if cfg["checkpointing"] else 0
        if fam in HF_FAMILIES:
            got = model.config._attn_implementation
            if got != cfg["attention"]:
                raise RuntimeError(f"attention {cfg['attention']} requested, model uses {got}")
        lora = {}
        if cfg.get("finetune") == "qlora":
            import torch_qlora

            if as_loaded:
                n, qbytes = torch_qlora.load_quantized(model, cfg["quant"], cfg["double_quant"],
                                                       self.dev.torch_device)
            else:
                n, qbytes = torch_qlora.quantize_model(model, cfg["quant"], cfg["double_quant"],
                                                       self.dev.torch_device)
            model = torch_qlora.prepare(model, cfg["quant"], cfg["checkpointing"], reentrant)
            lora = {"quantized_layers": n, "quant_bytes": qbytes}
        if cfg.get("finetune") == "lora" and reentrant:
            # As peft's prepare_model_for_kbit_training does for use_reentrant=True: without
            # it a reentrant checkpoint over the frozen base passes no gradient to adapters.
            model.enable_input_require_grads()
        if cfg.get("finetune") in ("lora", "qlora"):
            model, trainable, total = apply_lora(model, cfg)
            lora.update({"trainable_params": trainable, "all_params": total})
            if cfg.get("finetune") == "qlora":
                lora["lora_on_bnb_layers"] = torch_qlora.lora_on_bnb(model)
        if cfg.get("freeze_embeddings") or cfg.get("freeze_blocks"):
            lora["trainable_params"] = freeze_parts(model, cfg)
        params = list(model.parameters())
        self.info = {**lora,
            "params": int(sum(p.numel() for p in params)),
            "param_bytes": int(sum(tensor_bytes(p) for p in params)),
            "buffer_bytes": int(sum(tensor_bytes(b) for b in model.buffers())),
            "checkpointed_blocks": wrapped,
            "build_s": round(time.time() - t0, 3),
        }
        self.model = model
        self.key = key
        self.dev.empty_cache()
        log(f"built {preset['id']} ({self.info['params']} params, {cfg['precision']}, "
            f"ckpt={cfg['checkpointing']}) in {self.info['build_s']} s")
        return model, self.info


def make_batch_fn(cfg, preset, dev):
    fam = preset["family"]
    B = cfg["batch"]
    device = dev.torch_device
    if fam in IMAGE_FAMILIES:
        H = W = cfg["image"]
        chans = preset["params"].get("in_channels", preset["input"].get("channels", 3))
        ncls = preset["params"]["num_classes"]
        xdtype = torch.bfloat16 if cfg["precision"] == "bf16" else torch.float32
        seg = fam in SEGMENTATION

        def make():
            x = torch.randn(B, chans, H, W, device=device, dtype=xdtype)
            if seg:
                y = torch.randint(0, ncls, (B, H, W), device=device, dtype=torch.int64)
            else:
                y = torch.randint(0, ncls, (B,), device=device, dtype=torch.int64)
            return x, y

        return make
    S = cfg["seq"]
    vocab = preset["params"]["vocab_size"]

    T = cfg.get("target_seq")

    def make():
        x = torch.randint(0, vocab, (B, S), device=device, dtype=torch.int64)
        if T:
            # encoder-decoder (T5): source x, target labels of their own length
            return x, torch.randint(0, vocab, (B, T), device=device, dtype=torch.int64)
        return x, x  # labels = input_ids

    return make


def forward_loss(model, fam, x, y, loop="plain"):
    if fam in HF_FAMILIES:
        if loop in ("trainer", "lightning"):
            # HF Trainer.compute_loss / a Lightning training_step: the output dies here
            return None, model(input_ids=x, labels=y).loss
        out = model(input_ids=x, labels=y)
        return out, out.loss
    if loop in ("trainer", "lightning"):
        return None, F.cross_entropy(_logits(model(x), fam), y)
    out = model(x)
    return out, F.cross_entropy(_logits(out, fam), y)


def _logits(out, fam):
    return out["out"] if fam in ("deeplabv3", "fcn") else out


def run_step(model, fam, cfg, preset, dev, record):
    """The measured training loop (see the module docstring). Fills `record`."""
    precision = cfg["precision"]
    amp = precision in ("amp-fp16", "amp-bf16")
    amp_dtype = torch.float16 if precision == "amp-fp16" else torch.bfloat16
    accum = cfg["accum"]
    make_batch = make_batch_fn(cfg, preset, dev)

    model.train()
    opt = make_optimizer(cfg["optimizer"], model.parameters())
    scaler = torch.amp.GradScaler(dev.kind) if precision == "amp-fp16" else None
    t_start = t_end = None
    wall0 = None
    skipped = []  # amp-fp16: was opt.step() skipped by the GradScaler, per step
    step = 0
    step_kind = cfg.get("step", "train")
    while True:
        # amp-fp16: keep warming up until the GradScaler has let one optimizer step through
        # (at most AMP_EXTRA_WARMUP more steps), so optimizer state exists before the measured step
        measured = step >= WARMUP and (scaler is None or not all(skipped) or step >= WARMUP + AMP_EXTRA_WARMUP)
        if measured and step_kind != "train":
            # an evaluation step after WARMUP training steps (grads and optimizer state stay)
            if cfg.get("lora_merged"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = model.merge_and_unload()
                record["params_merged"] = int(sum(p.numel() for p in model.parameters()))
            run_eval(model, fam, cfg, make_batch, dev, record, amp, amp_dtype, grad=step_kind == "eval-grad")
            record["grad_bytes"] = int(sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None))
            record["opt_state_bytes"] = int(optimizer_state_bytes(opt))
            record["steps_run"] = step
            del opt, scaler
            return
        if measured:
            dev.sync()
            dev.reset_peak()
            record["allocated_start"] = dev.allocated()
            t_start, t_end = dev.timer(), dev.timer()
            if t_start is not None:
                t_start.record()
            wall0 = time.perf_counter()
        # Lightning's automatic optimization (lightning 2.x loops/optimization/automatic.py,
        # Closure.closure): training_step, then zero_grad (first micro-batch of a window),
        # then backward; every other loop zeroes the gradients before the forward.
        lightning = cfg.get("loop") == "lightning"
        if not lightning:
            opt.zero_grad(set_to_none=True)
        for micro in range(accum):
            x, y = make_batch()
            with torch.autocast(dev.kind, dtype=amp_dtype, enabled=amp):
                out, loss = forward_loss(model, fam, x, y, cfg.get("loop", "plain"))
                loss = loss / accum
            if lightning and micro == 0:
                opt.zero_grad(set_to_none=True)
            if measured and micro == accum - 1:
                dev.sync()
                record["allocated_after_forward"] = dev.allocated()
                record["peak_after_forward"] = dev.peak()
                record["loss"] = float(loss.detach().float().item()) * accum
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            del out, loss, x, y
        if measured:
            dev.sync()
            record["allocated_after_backward"] = dev.allocated()
            record["peak_after_backward"] = dev.peak()
        if scaler is not None:
            scale_before = scaler.get_scale()
            scaler.step(opt)  # skips opt.step() when the grads hold inf/nan
            scaler.update()
            skipped.append(scaler.get_scale() < scale_before)
        else:
            opt.step()
        step += 1
        if measured:
            break
    if t_end is not None:
        t_end.record()
    dev.sync()
    wall = time.perf_counter() - wall0
    record["peak_allocated"] = dev.peak()
    record["peak_reserved"] = dev.peak_reserved()
    record["allocated_end"] = dev.allocated()
    record["reserved_end"] = dev.reserved()
    proc, used = nvml_readings()
    record["nvml_process_bytes"] = proc
    record["nvml_device_used_bytes"] = used
    record["step_ms"] = round(t_start.elapsed_time(t_end), 3) if t_start is not None else round(wall * 1e3, 3)
    record["grad_bytes"] = int(sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None))
    record["opt_state_bytes"] = int(optimizer_state_bytes(opt))
    if cfg["optimizer"].startswith("paged"):
        import torch_qlora

        record["paged_state_bytes"] = int(torch_qlora.paged_state_bytes(opt))
    if scaler is not None:
        record["grad_scale"] = float(scaler.get_scale())
        record["amp_skipped_steps"] = skipped  # one bool per step; the last one is the measured step
    record["steps_run"] = step  # warm-up steps + the measured one
    # free the optimizer/scaler here; grads are cleared by the caller
    del opt, scaler


def run_eval(model, fam, cfg, make_batch, dev, record, amp, amp_dtype, grad):
    """The measured evaluation step: model.eval(), one forward + loss with autograd off
    (`torch.no_grad()`, step "eval") or on (step "eval-grad": the graph lives until `del`)."""
    import contextlib

    model.eval()
    dev.sync()
    dev.reset_peak()
    record["allocated_start"] = dev.allocated()
    wall0 = time.perf_counter()
    x, y = make_batch()
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    with ctx:
        with torch.autocast(dev.kind, dtype=amp_dtype, enabled=amp):
            # an evaluation loop keeps the output for its metrics
            out, loss = forward_loss(model, fam, x, y, "plain")
        dev.sync()
        record["allocated_after_forward"] = dev.allocated()
        record["peak_after_forward"] = dev.peak()
        record["loss"] = float(loss.detach().float().item())
        record["graph_kept"] = bool(loss.requires_grad)
    del out, loss, x, y
    dev.sync()
    record["peak_allocated"] = dev.peak()
    record["peak_reserved"] = dev.peak_reserved()
    record["allocated_end"] = dev.allocated()
    record["reserved_end"] = dev.reserved()
    proc, used = nvml_readings()
    record["nvml_process_bytes"] = proc
    record["nvml_device_used_bytes"] = used
    record["step_ms"] = round((time.perf_counter() - wall0) * 1e3, 3)
    model.train()


def clear_grads(model):
    if model is not None:
        for p in model.parameters():
            p.grad = None


def measure_one(cfg_in, index, holder, dev, emit, extra=None):
    """Runs one config; emits one line; returns the emitted record."""
    rec = {"index": index}
    try:
        cfg, preset = normalize_config(cfg_in)
        rec.update(cfg)
        if "batch" not in cfg:
            raise ValueError("config needs 'batch'")
    except Exception as e:
        rec.update({"config": cfg_in, "error": f"{type(e).__name__}: {e}"})
        emit(rec)
        return rec
    if extra:
        rec.update(extra)
    rec["model_id"] = preset["id"]
    oom_msg = None
    err = None
    retries0 = dev.stat("num_alloc_retries")
    try:
        model, info = holder.get(cfg, preset)
        rec.update(info)
        retries0 = dev.stat("num_alloc_retries")
        run_step(model, preset["family"], cfg, preset, dev, rec)
        rec["oom"] = False
    except torch.OutOfMemoryError as e:
        oom_msg = str(e).strip().splitlines()[0][:500] if str(e).strip() else "CUDA out of memory"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
    # out of the except block: the traceback (and the frames holding activations) is gone
    if oom_msg is not None:
        rec["oom"] = True
        rec["message"] = oom_msg
        rec["peak_allocated_before_oom"] = dev.peak()
        rec["peak_reserved_before_oom"] = dev.peak_reserved()
    if err is not None:
        rec["error"] = err
    if dev.cuda:
        # cache flushes during this config's steps (warm-up included): under a cap, a step that
        # fits only by freeing cached blocks and retrying cudaMalloc (slower)
        rec["alloc_retries"] = dev.stat("num_alloc_retries") - retries0
    clear_grads(holder.model)
    if err is not None or cfg.get("lora_merged"):
        # a failed build/step may leave half-initialised state, and merge_and_unload changed
        # the cached model in place: rebuild next time
        holder.drop()
    dev.empty_cache()
    rec["versions"] = versions()
    emit(rec)
    return rec


def read_configs(args):
    configs = []
    if getattr(args, "configs", None):
        with open(args.configs) as f:
            for ln, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#") or line.startswith("//"):
                    continue
                try:
                    configs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    configs.append({"_parse_error": f"line {ln}: {e}"})
    if getattr(args, "config", None):
        configs.append(json.loads(args.config))
    if getattr(args, "model", None):
        c = {"model": args.model}
        for k in ("batch", "image", "seq", "precision", "optimizer", "accum", "attention", "loop"):
            v = getattr(args, k, None)
            if v is not None:
                c[k] = v
        if args.checkpointing:
            c["checkpointing"] = True
        configs.append(c)
    return configs


def setup_device(args):
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("CUDA is not available (use --device cpu for a debug run)")
        if args.cap_gib is not None:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            frac = min(1.0, args.cap_gib * 2 ** 30 / total)
            torch.cuda.set_per_process_memory_fraction(frac)
            log(f"memory cap {args.cap_gib} GiB = fraction {frac:.4f} of {total / 2 ** 30:.1f} GiB")
    return Device(args.device)


def cmd_measure(args, emit):
    dev = setup_device(args)
    configs = read_configs(args)
    if not configs:
        raise SystemExit("no configs given")
    holder = ModelHolder(dev)
    extra = {"cap_gib": args.cap_gib} if args.cap_gib is not None else None
    for i, cfg in enumerate(configs):
        if "_parse_error" in cfg:
            emit({"index": i, "error": cfg["_parse_error"]})
            continue
        t0 = time.time()
        rec = measure_one(cfg, i, holder, dev, emit, extra)
        log(f"[{i + 1}/{len(configs)}] {cfg.get('model')} b={cfg.get('batch')} {cfg.get('precision', 'fp32')} "
            f"{cfg.get('optimizer', 'adamw')}: peak={rec.get('peak_allocated')} oom={rec.get('oom')} "
            f"err={rec.get('error')} ({time.time() - t0:.1f} s)")
    holder.drop()
    return 0


def cmd_max_batch(args, emit):
    if args.cap_gib is None and args.device == "cuda":
        log("warning: max-batch without --cap-gib searches the whole card")
    dev = setup_device(args)
    configs = read_configs(args)
    if len(configs) != 1:
        raise SystemExit(f"max-batch takes exactly one config (got {len(configs)})")
    base = dict(configs[0])
    base.pop("batch", None)
    holder = ModelHolder(dev)
    results = {}
    trial = [0]

    def fits(b):
        if b in results:
            return results[b]
        cfg = dict(base, batch=b)
        rec = measure_one(cfg, trial[0], holder, dev, emit,
                          {"trial": trial[0], "cap_gib": args.cap_gib, "mode": "max-batch"})
        trial[0] += 1
        if "error" in rec:
            raise RuntimeError(rec["error"])
        results[b] = not rec["oom"]
        return results[b]

    lo, hi = 0, None  # lo: largest batch known to fit (0 = none), hi: smallest known to fail
    b = max(1, args.start)
    if load_preset(base["model"])["family"] == "deeplabv3":
        b = max(b, 2)  # ASPP pooling branch: BatchNorm on (B, 256, 1, 1) needs B > 1 in training
    try:
        while b <= args.limit:  # exponential growth
            if fits(b):
                lo = b
                b *= 2
            else:
                hi = b
                break
        if hi is None and lo < args.limit:
            if fits(args.limit):
                lo = args.limit
            else:
                hi = args.limit
        if hi is not None:  # bisection in (lo, hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(mid):
                    lo = mid
                else:
                    hi = mid
        final = {"max_batch": lo, "first_oom_batch": hi}
    except Exception as e:
        final = {"max_batch": None, "error": f"{type(e).__name__}: {e}"}
    cfg_norm = {}
    try:
        cfg_norm, _ = normalize_config(base)
    except Exception:
        cfg_norm = base
    final.update({"config": cfg_norm, "cap_gib": args.cap_gib, "trials": trial[0], "limit": args.limit,
                  "versions": versions()})
    emit(final)
    holder.drop()
    return 0


def cmd_serve(args, emit):
    """Reads configs from stdin until EOF; answers each with one line. A line
    {"ready": true, "versions": ...} is sent first."""
    dev = setup_device(args)
    if dev.cuda:
        # Create the CUDA context and the cuBLAS handle (+ workspace) now, so that the
        # caller's baseline includes them and every trial returns to it.
        x = torch.ones(64, 64, device="cuda")
        (x @ x).sum().item()
        del x
        dev.empty_cache()
    emit({"ready": True, "pid": os.getpid(), "versions": versions()})
    holder = ModelHolder(dev)
    # Fault injection for vramlab's reliability tests: VRAMLAB_RUNNER_FAULT=exit:N makes the
    # process die (exit code 3, no reply) when it receives its N-th config line.
    fault = os.environ.get("VRAMLAB_RUNNER_FAULT", "")
    exit_at = int(fault.split(":")[1]) if fault.startswith("exit:") else None
    for i, line in enumerate(sys.stdin):
        line = line.strip()
        if not line:
            continue
        if exit_at is not None and i + 1 == exit_at:
            log(f"fault injection: exiting on config {i + 1}")
            os._exit(3)
        try:
            cfg = json.loads(line)
        except json.JSONDecodeError as e:
            emit({"index": i, "error": f"line {i + 1}: {e}"})
            continue
        replies = []
        measure_one(cfg, i, holder, dev, replies.append)
        # Each trial leaves the device as it found it (the model is rebuilt next time);
        # the reply goes out after, so the caller's reading of the baseline is final.
        holder.drop()
        for r in replies:
            emit(r)
    return 0


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def add_config_args(p):
    p.add_argument("configs", nargs="?", help="JSON-lines file of configs")
    p.add_argument("--config", help="one config as a JSON object")
    p.add_argument("--model", help="preset id or path (builds a config from the flags below)")
    p.add_argument("--batch", type=int)
    p.add_argument("--image", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--optimizer", choices=OPTIMIZERS)
    p.add_argument("--accum", type=int)
    p.add_argument("--attention", choices=ATTENTIONS)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--loop", choices=LOOPS)
    p.add_argument("--cap-gib", type=float, default=None, help="emulate a card with this many GiB")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu = debug run, no memory numbers")
    p.add_argument("--out", help="also append the JSON lines to this file")
    p.add_argument("--warmup", type=int, default=None, help=f"warm-up steps (default {WARMUP})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", action="store_true", help="print a versions line and exit")
    sub = ap.add_subparsers(dest="mode")

    pc = sub.add_parser("count", help="parameter counts of presets (meta device)")
    pc.add_argument("presets", nargs="*", help="preset ids or paths (default: all in presets/models)")
    pc.add_argument("--write", nargs="?", const=PARAM_COUNTS_PATH, default=None,
                    help=f"also write the lines to a file (default {PARAM_COUNTS_PATH})")
    pc.add_argument("--out", help=argparse.SUPPRESS)

    pm = sub.add_parser("measure", help="measure training steps")
    add_config_args(pm)

    px = sub.add_parser("max-batch", help="largest batch that fits under --cap-gib")
    add_config_args(px)
    px.add_argument("--limit", type=int, default=8192, help="largest batch tried")
    px.add_argument("--start", type=int, default=1, help="first batch tried")

    ps = sub.add_parser("serve", help="answer configs read from stdin (bench engine)")
    ps.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ps.add_argument("--cap-gib", type=float, default=None)
    ps.add_argument("--warmup", type=int, default=None)

    args = ap.parse_args(argv)
    if args.env:
        v = dict(versions())
        if torch.cuda.is_available():
            proc, used = nvml_readings()
            v["nvml_device_used_bytes"] = used
        print(json.dumps({"versions": v}), flush=True)
        return 0
    if not args.mode:
        ap.print_help(sys.stderr)
        return 2
    global WARMUP
    if getattr(args, "warmup", None) is not None:
        WARMUP = args.warmup
    emit = Emitter(getattr(args, "out", None))
    if args.mode == "count":
        return cmd_count(args, emit)
    if args.mode == "measure":
        return cmd_measure(args, emit)
    if args.mode == "max-batch":
        return cmd_max_batch(args, emit)
    if args.mode == "serve":
        return cmd_serve(args, emit)
    return 2


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""vramlab inference runner (issue 29): measures the GPU memory of `model.generate()` and of a
plain forward under `torch.no_grad()` for decoder models built from a config.json.

Dependencies: torch, transformers (optionally pynvml). Nothing is downloaded: each model is
built from its config.json with random weights, directly on the device and in the target
dtype.

    python3 lab/device/infer_runner.py --configs lab/grids/grid29_configs.jsonl --out $OUT/grid29.jsonl
    python3 lab/device/infer_runner.py --configs FILE --out FILE --device cpu   # dry run, no GPU

One JSON object per config line, e.g.
  {"id": "g29-007", "split": "fit", "model": "tests/data/hf_configs/Llama-3.2-1B.json",
   "step": "generate" | "prefill", "batch": 4, "prompt": 1024, "new_tokens": 64,
   "precision": "bf16" | "fp16" | "fp32", "attention": "sdpa" | "eager",
   "kv_cache": "dynamic" | "static"}
  and, for generate, optionally the decoding (lab/grids/make_grid29b.py): "do_sample": true,
  "temperature", "top_k", "top_p" (passed to generate as given; unset ones take
  transformers' defaults), "num_beams": B (beam search).
  Quantized weights or accelerate's offload (lab/grids/make_grid29c.py): "quant": "nf4" | "int8"
  ("double_quant": true | false for nf4), or "device_map": "auto" with "max_gpu_memory" and
  "max_cpu_memory" (accelerate's size strings). Such a model is saved (random weights, in the
  row's dtype, safetensors) to a folder once per model and dtype, then loaded the way a user
  loads it:
      from_pretrained(folder, dtype=dtype, attn_implementation=attention,
          quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
              bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=dtype)
          | BitsAndBytesConfig(load_in_8bit=True))                  # device_map left unset
      from_pretrained(folder, dtype=dtype, attn_implementation=attention,
          device_map="auto", max_memory={0: max_gpu_memory, "cpu": max_cpu_memory})
  and the row records `hf_device_map` (the placement accelerate chose).

What is measured (vramlab's inference plan models exactly this):

  with torch.device(dev):
      model = AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                               dtype=dtype)         # weights in dtype
  model.eval()
  input_ids = torch.randint(0, vocab, (batch, prompt), device=dev)
  call()                                   # warm-up (same call)
  torch.cuda.reset_peak_memory_stats()     # the pool keeps what the warm-up reserved
  call()                                   # measured
  generate: model.generate(input_ids, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                           cache_implementation="static" | None, disable_compile=True)
            (a row's do_sample / temperature / top_k / top_p / num_beams replace
            do_sample=False; torch.manual_seed(29) before each of the two calls)
            (transformers compiles the decode step of a static cache on CUDA by default,
            with CUDA graphs; `disable_compile=True` keeps the eager path that is planned)
  prefill:  with torch.no_grad(): out = model(input_ids); del out   # full logits, the
            forward's own DynamicCache (use_cache defaults to True)

Rows are written one per config (flushed), with the device name, driver, torch and
transformers versions. A CUDA OOM is caught per row ("oom": true). `--time-limit` stops
cleanly before a row that would start after it; re-running the same command skips the ids
already in --out.
"""
import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DROP_KEYS = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
             "auto_map", "quantization_config")


def log(*args):
    print("[infer_runner]", *args, file=sys.stderr, flush=True)


def driver_version():
    try:
        import pynvml

        pynvml.nvmlInit()
        d = pynvml.nvmlSystemGetDriverVersion()
        return d.decode() if isinstance(d, bytes) else d
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except Exception:
        return None


def versions(dev):
    import transformers

    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "cuda": torch.version.cuda, "python": platform.python_version(),
         "device_name": "cpu", "driver": None, "device_total_bytes": None,
         "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")}
    for name in ("accelerate", "bitsandbytes"):
        try:
            v[name] = __import__(name).__version__
        except Exception:  # not installed: rows that need it fail with their own error
            v[name] = None
    if dev == "cuda":
        props = torch.cuda.get_device_properties(0)
        v["device_name"] = props.name
        v["device_total_bytes"] = int(props.total_memory)
        v["driver"] = driver_version()
    return v


def check_row(row):
    for key in ("id", "model", "step", "batch", "prompt", "precision"):
        if key not in row:
            raise ValueError(f"config {row.get('id', '?')}: missing key {key!r}")
    if row["step"] not in ("generate", "prefill"):
        raise ValueError(f"config {row['id']}: step {row['step']!r} is not generate or prefill")
    if row["precision"] not in DTYPES:
        raise ValueError(f"config {row['id']}: precision {row['precision']!r} not in {list(DTYPES)}")
    if row.get("attention", "sdpa") not in ("sdpa", "eager"):
        raise ValueError(f"config {row['id']}: attention {row['attention']!r} not sdpa or eager")
    if row.get("kv_cache", "dynamic") not in ("dynamic", "static"):
        raise ValueError(f"config {row['id']}: kv_cache {row['kv_cache']!r} not dynamic or static")
    if row["step"] == "generate" and int(row.get("new_tokens", 0)) < 1:
        raise ValueError(f"config {row['id']}: generate needs new_tokens >= 1")
    dec = {k for k in DECODING_KEYS if k in row}
    if dec and row["step"] != "generate":
        raise ValueError(f"config {row['id']}: {sorted(dec)} are generate settings")
    if int(row.get("num_beams", 1)) < 1:
        raise ValueError(f"config {row['id']}: num_beams must be >= 1")
    if row.get("quant", "nf4") not in ("nf4", "int8"):
        raise ValueError(f"config {row['id']}: quant {row['quant']!r} not nf4 or int8")
    if row.get("device_map", "auto") != "auto":
        raise ValueError(f"config {row['id']}: device_map {row['device_map']!r} is not auto")
    if "quant" in row and "device_map" in row:
        raise ValueError(f"config {row['id']}: quant and device_map are measured apart")
    if "device_map" in row and "max_gpu_memory" not in row:
        raise ValueError(f"config {row['id']}: device_map needs max_gpu_memory")


DECODING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "num_beams")


def decoding_kwargs(row):
    """The generate kwargs of a row's decoding: do_sample=False (greedy) unless the row says."""
    kw = {"do_sample": bool(row.get("do_sample", False))}
    for k in ("temperature", "top_k", "top_p"):
        if k in row:
            kw[k] = row[k]
    if "num_beams" in row:
        kw["num_beams"] = int(row["num_beams"])
    return kw


def load_config(path):
    from transformers import AutoConfig

    with open(path) as f:
        cfg = json.load(f)
    model_type = cfg.pop("model_type")
    for k in DROP_KEYS:
        cfg.pop(k, None)
    return AutoConfig.for_model(model_type, **cfg)


CHECKPOINTS = os.environ.get("VRAMLAB_CKPT_DIR", "/tmp/vramlab_infer_ckpt")


def checkpoint(row, dev):
    """A folder holding the row's model with random weights in its dtype (saved once per model
    and dtype; the folder of another model is removed first, to keep the disk free)."""
    import shutil

    from transformers import AutoModelForCausalLM

    stem = os.path.splitext(os.path.basename(row["model"]))[0]
    folder = os.path.join(CHECKPOINTS, f"{stem}-{row['precision']}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    if os.path.isdir(CHECKPOINTS):
        shutil.rmtree(CHECKPOINTS)
    torch.manual_seed(29)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(load_config(row["model"]),
                                                 dtype=DTYPES[row["precision"]])
    model.save_pretrained(folder)
    del model
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return folder


def build(row, dev):
    from transformers import AutoModelForCausalLM

    attention = row.get("attention", "sdpa")
    dtype = DTYPES[row["precision"]]
    if "quant" in row or "device_map" in row:
        folder = checkpoint(row, dev)
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        kw = {}
        if row.get("quant") == "nf4":
            from transformers import BitsAndBytesConfig
            kw["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=bool(row.get("double_quant", True)),
                bnb_4bit_compute_dtype=dtype)
        elif row.get("quant") == "int8":
            from transformers import BitsAndBytesConfig
            kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        else:
            kw["device_map"] = "auto"
            kw["max_memory"] = {0: row["max_gpu_memory"], "cpu": row.get("max_cpu_memory", "200GiB")}
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype,
                                                     attn_implementation=attention, **kw)
    else:
        config = load_config(row["model"])
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                     dtype=dtype)
    got = getattr(model.config, "_attn_implementation", None)
    if got != attention:
        raise RuntimeError(f"attn_implementation {attention!r} did not take effect (got {got!r})")
    model.eval()
    return model


def make_call(model, row, input_ids):
    if row["step"] == "prefill":
        def call():
            with torch.no_grad():
                out = model(input_ids)
            del out
    else:
        n = int(row["new_tokens"])
        cache = "static" if row.get("kv_cache", "dynamic") == "static" else None
        kw = decoding_kwargs(row)

        def call():
            # the same draws in the warm-up and the measured call (sampling)
            torch.manual_seed(29)
            out = model.generate(input_ids, max_new_tokens=n, min_new_tokens=n,
                                 cache_implementation=cache, disable_compile=True, **kw)
            got = out.shape[1] - input_ids.shape[1]
            del out
            if got != n:
                raise RuntimeError(f"generated {got} tokens, expected {n}")
    return call


def param_bytes(model):
    seen = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def measure(row, dev):
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    model = build(row, dev)
    sync(dev)
    build_s = time.time() - t0
    out = {"params": sum(p.numel() for p in model.parameters()),
           "experts_implementation": getattr(model.config, "_experts_implementation", None),
           "weights_bytes": param_bytes(model), "build_s": round(build_s, 2)}
    if getattr(model, "hf_device_map", None) is not None and "device_map" in row:
        out["hf_device_map"] = {k: (v if isinstance(v, (int, str)) else str(v))
                                for k, v in model.hf_device_map.items()}
    if dev == "cuda" and ("quant" in row or "device_map" in row):
        out["load_peak_allocated"] = torch.cuda.max_memory_allocated()
        out["load_peak_reserved"] = torch.cuda.max_memory_reserved()
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator(device="cpu").manual_seed(29)
    input_ids = torch.randint(0, vocab, (int(row["batch"]), int(row["prompt"])), generator=gen).to(dev)
    out["quant_modules"] = sorted({type(m).__name__ for m in model.modules()
                                   if "bitsandbytes" in type(m).__module__})
    call = make_call(model, row, input_ids)
    if dev == "cuda":
        out["allocated_after_build"] = torch.cuda.memory_allocated()
        out["reserved_after_build"] = torch.cuda.memory_reserved()
    t0 = time.time()
    call()  # warm-up
    sync(dev)
    out["warmup_s"] = round(time.time() - t0, 2)
    gc.collect()
    if dev == "cuda":
        out["warmup_peak_allocated"] = torch.cuda.max_memory_allocated()
        out["warmup_peak_reserved"] = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        out["allocated_before"] = torch.cuda.memory_allocated()
        out["reserved_before"] = torch.cuda.memory_reserved()
    t0 = time.time()
    call()  # measured
    sync(dev)
    out["step_s"] = round(time.time() - t0, 2)
    if dev == "cuda":
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        out["device_used_after"] = total - free
        out["reserved_after"] = torch.cuda.memory_reserved()
        out["allocated_after"] = torch.cuda.memory_allocated()
    del call, input_ids, model
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True, help="JSON-lines file of configs")
    ap.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ids", default="", help="comma-separated ids to run (default: all)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds; no row starts after this (0: no limit)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available (use --device cpu for a dry run)")
    with open(args.configs) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        check_row(r)
    wanted = {s for s in args.ids.split(",") if s}
    if wanted:
        rows = [r for r in rows if r["id"] in wanted]
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                # a row that failed other than by OOM is run again
                if "id" in r and (r.get("oom") or "error" not in r):
                    done.add(r["id"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    ver = versions(args.device)
    start = time.time()
    with open(args.out, "a") as sink:
        for row in rows:
            if row["id"] in done:
                continue
            if args.time_limit and time.time() - start > args.time_limit:
                log(f"time limit reached before {row['id']}; re-run to continue")
                break
            log(f"{row['id']}: {json.dumps(row)}")
            res = dict(row)
            res.update(ver)
            try:
                res.update(measure(row, args.device))
                res["oom"] = False
            except torch.OutOfMemoryError as e:
                res["oom"] = True
                res["error"] = str(e).splitlines()[0][:300]
            except Exception as e:  # a row that cannot run is recorded, the rest go on
                res["oom"] = False
                res["error"] = f"{type(e).__name__}: {e}"[:500]
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            sink.write(json.dumps(res) + "\n")
            sink.flush()
            log(f"{row['id']}: " + ", ".join(f"{k}={res.get(k)}" for k in
                ("peak_allocated", "peak_reserved", "step_s", "oom", "error")))


if __name__ == "__main__":
    main()

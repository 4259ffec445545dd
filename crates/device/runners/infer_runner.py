#!/usr/bin/env python3
"""vramlab inference runner (issue 29): measures the GPU memory of `model.generate()` and of a
plain forward under `torch.no_grad()` for decoder models built from a config.json.

Shipped inside the vramlab binary (`vramlab bench --engine torch --step generate|prefill`,
the GUI's Run tab in Inference mode) and used by the lab (`lab/device/infer_runner.py` runs
this file's `main`).

Dependencies: torch, transformers (optionally pynvml; accelerate for a device map,
bitsandbytes for quantized weights). Nothing is downloaded: each model is built from its
config.json with random weights, directly on the device and in the target dtype.

Modes
-----
    infer_runner.py --configs FILE --out FILE [--device cuda|cpu] [--ids a,b] [--time-limit S]
        the lab's grids: one JSON row per config line appended to --out (flushed)
    infer_runner.py serve [--device cuda|cpu]
        vramlab's bench engine, the protocol of torch_runner.py serve: a line
        {"ready": true, "pid": ..., "versions": {...}} first, then one reply line per config
        line read from stdin (stdout carries JSON only; logging goes to stderr). vramlab starts
        one process per trial, as the lab measured one process per row. A reply has the row's
        measurements (below) and "step_ms", "nvml_process_bytes" (pynvml, where installed);
        a CUDA OOM answers {"oom": true, "message": ..., "peak_allocated_before_oom": ...,
        "peak_reserved_before_oom": ...}; any other failure {"error": "..."}.
    --device cpu is a dry run (no GPU, no memory numbers).

One JSON object per config, e.g.
  {"id": "g29-007", "split": "fit", "model": "tests/data/hf_configs/Llama-3.2-1B.json",
   "step": "generate" | "prefill", "batch": 4, "prompt": 1024, "new_tokens": 64,
   "precision": "bf16" | "fp16" | "fp32", "attention": "sdpa" | "eager",
   "kv_cache": "dynamic" | "static"}
  "model" is a path to a config.json, or (vramlab's bench) a vramlab preset object, whose
  config is rebuilt as torch_runner.py does; "hf_config": {...} (a config.json's object)
  takes precedence over both. A config without an eos_token_id gets one (0), as every real
  checkpoint names one: generate's min_new_tokens processor then runs, as planned.
  For generate, optionally the decoding (lab/grids/make_grid29b.py): "do_sample": true,
  "temperature", "top_k", "top_p" (passed to generate as given; unset ones take
  transformers' defaults), "num_beams": B (beam search).
  Quantized weights or accelerate's offload (lab/grids/make_grid29c.py): "quant": "nf4" |
  "fp4" | "int8" ("double_quant": true | false for 4-bit), or "device_map": "auto" with
  "max_gpu_memory" and "max_cpu_memory" (accelerate's size strings, or bytes). Such a model is
  saved (random weights, in the row's dtype, safetensors) to a folder once per model and dtype
  ($VRAMLAB_CKPT_DIR, default <tmp>/vramlab_infer_ckpt), then loaded the way a user loads it:
      from_pretrained(folder, dtype=dtype, attn_implementation=attention,
          quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
              bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=dtype)
          | BitsAndBytesConfig(load_in_8bit=True))                  # device_map left unset
      from_pretrained(folder, dtype=dtype, attn_implementation=attention,
          device_map="auto", max_memory={0: max_gpu_memory, "cpu": max_cpu_memory})
  and the row records `hf_device_map` (the placement accelerate chose). Both at once
  (lab/grids/make_grid30q.py): "quant" with "device_map": "auto" passes the
  quantization_config, device_map and max_memory together; "fp32_cpu_offload": true adds
  `llm_int8_enable_fp32_cpu_offload=True` to the BitsAndBytesConfig (transformers refuses
  modules on "cpu" / "disk" without it). Such a row records `hf_device_map` and
  `offloaded_params` (the class and dtype of each parameter under an offloaded entry, as
  "Linear4bit.weight:uint8"), so the planner's reading — the offloaded layers stay quantized —
  is checked.

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
import re
import subprocess
import sys
import tempfile
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DROP_KEYS = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
             "auto_map", "quantization_config")
QUANTS = ("nf4", "fp4", "int8")


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


DECODING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "num_beams")


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
    if int(row["batch"]) < 1 or int(row["prompt"]) < 1:
        raise ValueError(f"config {row['id']}: batch and prompt must be >= 1")
    if row["step"] == "generate" and int(row.get("new_tokens", 0)) < 1:
        raise ValueError(f"config {row['id']}: generate needs new_tokens >= 1")
    dec = {k for k in DECODING_KEYS if k in row}
    if dec and row["step"] != "generate":
        raise ValueError(f"config {row['id']}: {sorted(dec)} are generate settings")
    if int(row.get("num_beams", 1)) < 1:
        raise ValueError(f"config {row['id']}: num_beams must be >= 1")
    if row.get("quant", "nf4") not in QUANTS:
        raise ValueError(f"config {row['id']}: quant {row['quant']!r} not in {list(QUANTS)}")
    if row.get("device_map", "auto") != "auto":
        raise ValueError(f"config {row['id']}: device_map {row['device_map']!r} is not auto")
    if row.get("fp32_cpu_offload") and not ("quant" in row and "device_map" in row):
        raise ValueError(f"config {row['id']}: fp32_cpu_offload needs quant and device_map")
    if "device_map" in row and "max_gpu_memory" not in row:
        raise ValueError(f"config {row['id']}: device_map needs max_gpu_memory")


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
    """The transformers config of a config.json file."""
    with open(path) as f:
        return config_from_dict(json.load(f))


def config_from_dict(doc):
    """AutoConfig.for_model(model_type, **config) of a config.json's object."""
    from transformers import AutoConfig

    cfg = dict(doc)
    model_type = cfg.pop("model_type")
    for k in DROP_KEYS:
        cfg.pop(k, None)
    return AutoConfig.for_model(model_type, **cfg)


# the built-in Llama presets' keys (torch_runner.py LLAMA_KEYS), config.json names
LLAMA_PRESET_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                     "tie_word_embeddings", "attention_dropout")


def preset_hf_config(preset):
    """The config.json object of a vramlab preset (an imported config.json is rebuilt as
    torch_runner.py does for the training bench; a built-in Llama preset is a LlamaConfig)."""
    import torch_runner

    p = torch_runner.load_preset(preset)
    if p.get("family") == "hf":
        cfg = dict(p["hf_config"])
    elif p.get("family") == "llama":
        params = p["params"]
        cfg = {k: params[k] for k in LLAMA_PRESET_KEYS if k in params}
        cfg["model_type"] = "llama"
    else:
        raise ValueError(f"preset {p.get('id', '?')} (family {p.get('family')!r}): inference is "
                         "measured for the decoders of the Llama lineage")
    # every real checkpoint names an EOS token; with one, generate's min_new_tokens processor
    # runs (what vramlab plans)
    if cfg.get("eos_token_id") is None:
        cfg["eos_token_id"] = 0
    return cfg


def row_config(row):
    """The transformers config of a row: "hf_config", else "model" (a path or a preset)."""
    if isinstance(row.get("hf_config"), dict):
        return config_from_dict(row["hf_config"])
    if isinstance(row["model"], dict):
        return config_from_dict(preset_hf_config(row["model"]))
    return load_config(row["model"])


def model_stem(row):
    """A file-name-safe name of the row's model (checkpoint folders)."""
    m = row["model"]
    if isinstance(m, dict):
        name = str(row.get("model_id") or m.get("id") or "preset")
    else:
        name = os.path.splitext(os.path.basename(m))[0]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:120] or "model"


CHECKPOINTS = os.environ.get("VRAMLAB_CKPT_DIR",
                             os.path.join(tempfile.gettempdir(), "vramlab_infer_ckpt"))


def checkpoint(row, dev):
    """A folder holding the row's model with random weights in its dtype (saved once per model
    and dtype; the folder of another model is removed first, to keep the disk free)."""
    import shutil

    from transformers import AutoModelForCausalLM

    folder = os.path.join(CHECKPOINTS, f"{model_stem(row)}-{row['precision']}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    if os.path.isdir(CHECKPOINTS):
        shutil.rmtree(CHECKPOINTS)
    torch.manual_seed(29)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(row_config(row),
                                                 dtype=DTYPES[row["precision"]])
    model.save_pretrained(folder)
    del model
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return folder


def offloaded_params(model, device_map):
    """The class and dtype of the parameters under the map's "cpu" / "disk" entries, as
    {"Linear4bit.weight:uint8": count, ...}, read from the offloaded weights (accelerate's
    hooks keep them in `weights_map`; the module's own parameters are on meta)."""
    off = [k for k, v in device_map.items() if v in ("cpu", "disk")]
    counts = {}
    for name, m in model.named_modules():
        if not any(k == "" or name == k or name.startswith(k + ".") for k in off):
            continue
        hook = getattr(m, "_hf_hook", None)
        wmap = getattr(hook, "weights_map", None)
        for pname, p in m.named_parameters(recurse=False):
            t = p
            if wmap is not None:
                try:
                    t = wmap[pname]
                except Exception:
                    pass
            key = f"{type(m).__name__}.{pname}:{str(t.dtype).replace('torch.', '')}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def build(row, dev):
    from transformers import AutoModelForCausalLM

    attention = row.get("attention", "sdpa")
    dtype = DTYPES[row["precision"]]
    if "quant" in row or "device_map" in row:
        folder = checkpoint(row, dev)
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        kw = {}
        offload = {"llm_int8_enable_fp32_cpu_offload": True} if row.get("fp32_cpu_offload") else {}
        if row.get("quant") in ("nf4", "fp4"):
            from transformers import BitsAndBytesConfig
            kw["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type=row["quant"],
                bnb_4bit_use_double_quant=bool(row.get("double_quant", True)),
                bnb_4bit_compute_dtype=dtype, **offload)
        elif row.get("quant") == "int8":
            from transformers import BitsAndBytesConfig
            kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True, **offload)
        if "device_map" in row:
            kw["device_map"] = "auto"
            kw["max_memory"] = {0: row["max_gpu_memory"], "cpu": row.get("max_cpu_memory", "200GiB")}
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype,
                                                     attn_implementation=attention, **kw)
    else:
        config = row_config(row)
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


def nvml_process_bytes(dev):
    """NVML's memory of this process (what nvidia-smi shows), where pynvml is installed."""
    if dev != "cuda":
        return None
    try:
        import torch_runner

        proc, _ = torch_runner.nvml_readings()
        return proc
    except Exception as e:  # the sibling or pynvml missing: the figure is left out
        log(f"NVML reading unavailable: {e!r}")
        return None


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
        if "quant" in row:
            out["offloaded_params"] = offloaded_params(model, out["hf_device_map"])
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
    elapsed = time.time() - t0
    out["step_s"] = round(elapsed, 2)
    out["step_ms"] = round(elapsed * 1e3, 3)
    if dev == "cuda":
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        out["device_used_after"] = total - free
        out["reserved_after"] = torch.cuda.memory_reserved()
        out["allocated_after"] = torch.cuda.memory_allocated()
        out["nvml_process_bytes"] = nvml_process_bytes(dev)
    del call, input_ids, model
    return out


def run_row(row, dev, ver):
    """The row with its measurements (or "oom" / "error"), the lab's record."""
    res = dict(row)
    res.update(ver)
    try:
        res.update(measure(row, dev))
        res["oom"] = False
    except torch.OutOfMemoryError as e:
        res["oom"] = True
        res["error"] = str(e).splitlines()[0][:300] if str(e).strip() else "CUDA out of memory"
        if dev == "cuda":
            res["peak_allocated_before_oom"] = torch.cuda.max_memory_allocated()
            res["peak_reserved_before_oom"] = torch.cuda.max_memory_reserved()
    except Exception as e:  # a row that cannot run is recorded, the rest go on
        res["oom"] = False
        res["error"] = f"{type(e).__name__}: {e}"[:500]
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def bench_reply(res):
    """A lab record as the bench engine reads it (torch.rs `parse_reply`): an OOM's text is
    its "message" (an "error" is a failure that is not a capacity answer); the preset object
    is left out."""
    reply = {k: v for k, v in res.items() if k not in ("model", "hf_config")}
    if reply.get("oom"):
        reply["message"] = reply.pop("error", "CUDA out of memory")
    return reply


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def cmd_serve(dev):
    """Answers the config lines read from stdin (vramlab's bench engine), one line each."""
    if dev == "cuda":
        if not torch.cuda.is_available():
            sys.exit("CUDA is not available (use --device cpu for a dry run)")
        # the CUDA context, and nothing allocated: the cuBLAS workspace and every block are
        # created by the measured row itself, as in one lab process per row
        torch.cuda.mem_get_info()
    ver = versions(dev)
    emit({"ready": True, "pid": os.getpid(), "versions": ver})
    for i, line in enumerate(sys.stdin):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            row.setdefault("id", f"bench-{i}")
            check_row(row)
        except Exception as e:
            emit({"index": i, "error": f"{type(e).__name__}: {e}"})
            continue
        log(f"{row['id']}: {row['step']} batch {row['batch']} prompt {row['prompt']} "
            f"new {row.get('new_tokens', 0)} {row['precision']}")
        res = run_row(row, dev, ver)
        log(f"{row['id']}: " + ", ".join(f"{k}={res.get(k)}" for k in
            ("peak_allocated", "peak_reserved", "step_s", "oom", "error")))
        emit(bench_reply(res))
    return 0


def cmd_rows(args):
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
            res = run_row(row, args.device, ver)
            sink.write(json.dumps(res) + "\n")
            sink.flush()
            log(f"{row['id']}: " + ", ".join(f"{k}={res.get(k)}" for k in
                ("peak_allocated", "peak_reserved", "step_s", "oom", "error")))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        sp = argparse.ArgumentParser(prog="infer_runner.py serve",
                                     description="answer config lines read from stdin")
        sp.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
        return cmd_serve(sp.parse_args(argv[1:]).device)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True, help="JSON-lines file of configs")
    ap.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ids", default="", help="comma-separated ids to run (default: all)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds; no row starts after this (0: no limit)")
    return cmd_rows(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

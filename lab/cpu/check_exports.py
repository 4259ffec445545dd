#!/usr/bin/env python3
"""Checks vramlab's framework exports against the real libraries where they are installed:
transformers.TrainingArguments(**hf), lightning Trainer(**lightning), deepspeed's config
class. Usage: check_exports.py path/to/vramlab   (prints one JSON line per check)."""
import json
import subprocess
import sys

exe = sys.argv[1]
results = []
for precision in ("fp32", "amp-fp16", "amp-bf16", "bf16"):
    for optim in ("adamw", "sgd", "adafactor"):
        args = ["export", "--model", "gpt2", "--batch", "4", "--accum", "8", "--precision", precision,
                "--optimizer", optim, "--checkpointing"]
        def get(fmt):
            return json.loads(subprocess.run([exe] + args + ["--format", fmt], check=True,
                                             capture_output=True, text=True).stdout)
        hf = get("hf")
        try:
            import transformers
            kw = dict(hf)
            if precision != "fp32":
                kw["use_cpu"] = False
            ta = transformers.TrainingArguments(**kw)
            ok = (ta.per_device_train_batch_size == 4 and ta.gradient_accumulation_steps == 8
                  and ta.gradient_checkpointing and ta.bf16 == hf["bf16"] and ta.fp16 == hf["fp16"])
            results.append({"check": "hf", "precision": precision, "optim": optim, "ok": ok,
                            "transformers": transformers.__version__})
        except ImportError:
            results.append({"check": "hf", "skipped": "transformers not installed"})
        except Exception as e:  # a rejected config is what this script is for
            results.append({"check": "hf", "precision": precision, "optim": optim, "ok": False, "error": str(e)[:300]})
        pl = get("lightning")
        try:
            try:
                import lightning.pytorch as L
            except ImportError:
                import pytorch_lightning as L
            t = L.Trainer(**{**pl, "accelerator": "cpu" if not __import__("torch").cuda.is_available() else "gpu"},
                          logger=False, enable_checkpointing=False)
            results.append({"check": "lightning", "precision": precision, "ok": t.accumulate_grad_batches == 8,
                            "trainer_precision": str(t.precision)})
        except ImportError:
            results.append({"check": "lightning", "skipped": "lightning not installed"})
        except Exception as e:
            results.append({"check": "lightning", "precision": precision, "ok": False, "error": str(e)[:300]})
        ds = get("deepspeed")
        try:
            from deepspeed.runtime.config import DeepSpeedConfig
            import deepspeed
            c = DeepSpeedConfig(ds)
            ok = (c.train_micro_batch_size_per_gpu == 4 and c.gradient_accumulation_steps == 8
                  and bool(c.float16_config.enabled) == (precision == "amp-fp16")
                  and bool(c.bfloat16_config.enabled) == (precision in ("amp-bf16", "bf16")))
            results.append({"check": "deepspeed", "precision": precision, "optim": optim, "ok": ok,
                            "optimizer_name": c.optimizer_name, "fp16": bool(c.float16_config.enabled),
                            "bf16": bool(c.bfloat16_config.enabled), "deepspeed": deepspeed.__version__})
        except ImportError:
            results.append({"check": "deepspeed", "skipped": "deepspeed not installed"})
        except Exception as e:
            results.append({"check": "deepspeed", "precision": precision, "ok": False, "error": str(e)[:300]})
for r in results:
    print(json.dumps(r))
bad = [r for r in results if r.get("ok") is False]
sys.exit(1 if bad else 0)

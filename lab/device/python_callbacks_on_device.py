#!/usr/bin/env python3
"""Issue 31 on the device: vramlab's Python callbacks in a real HF Trainer run and a real
Lightning run of GPT-2 (random init, built from its config; nothing downloaded), and an
induced CUDA OOM explained by the doctor through the callback.

    pip install --no-deps .whl/py/vramlab-*.whl
    python3 lab/device/python_callbacks_on_device.py --out $OUT

Appends to $OUT/callbacks.jsonl (`--runs lightning` runs one of the three; several run each in a
process of its own): one record per run with the callback's lines, the plan's
numbers and torch's measured peaks, the versions and the device.
"""
import argparse
import json
import os
import subprocess
import sys
import traceback

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

import vramlab
import vramlab.callbacks as vc

BATCH, SEQ = 8, 512


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def versions():
    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "device": torch.cuda.get_device_name(0)}
    try:
        import lightning
        v["lightning"] = lightning.__version__
    except ImportError:
        pass
    return v


def hf_run(batch, steps, lines, cap_gib=None):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / total)
    plan = vramlab.plan(model="gpt2", batch=batch, seq=SEQ, precision="amp-bf16",
                        optimizer="adamw", loop="trainer", gpu="h200")
    cb = vc.trainer_callback(plan, log=lines.append)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    args = transformers.TrainingArguments(
        output_dir="/tmp/hf_out", per_device_train_batch_size=batch, max_steps=steps,
        bf16=True, logging_steps=1000, save_strategy="no", report_to=[], optim="adamw_torch",
        dataloader_num_workers=0)
    tr = transformers.Trainer(model=model, args=args,
                              train_dataset=Tokens(batch * steps, SEQ, 50257), callbacks=[cb])
    err = None
    try:
        tr.train()
    except torch.OutOfMemoryError as e:
        d = cb.check.on_exception(e)
        err = {"oom": str(e).splitlines()[0][:300],
               "diagnosis": d.diagnosis if d else None, "summary": d.summary if d else None}
    rec = {"run": "hf-trainer", "batch": batch, "seq": SEQ, "precision": "amp-bf16",
           "cap_gib": cap_gib, "lines": list(lines), "error": err,
           "planned_allocated": plan.peak_allocated_bytes, "planned_reserved": plan.peak_reserved_bytes,
           "measured_allocated": torch.cuda.max_memory_allocated(),
           "measured_reserved": torch.cuda.max_memory_reserved()}
    del tr, model
    if cap_gib:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return rec


def lightning_run(lines):
    import lightning as L

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    plan = vramlab.plan(model="gpt2", batch=BATCH, seq=SEQ, precision="amp-bf16",
                        optimizer="adamw", loop="lightning", gpu="h200")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.m = GPT2LMHeadModel(GPT2Config())

        def training_step(self, b, i):
            return self.m(input_ids=b["input_ids"], labels=b["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    dl = torch.utils.data.DataLoader(Tokens(BATCH * 5, SEQ, 50257), batch_size=BATCH)
    t = L.Trainer(max_steps=5, precision="bf16-mixed", accelerator="gpu", devices=1,
                  callbacks=[vc.lightning_callback(plan, log=lines.append)], logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
    t.fit(Module(), dl)
    return {"run": "lightning", "batch": BATCH, "seq": SEQ, "precision": "amp-bf16",
            "lines": list(lines), "planned_allocated": plan.peak_allocated_bytes,
            "planned_reserved": plan.peak_reserved_bytes,
            "measured_allocated": torch.cuda.max_memory_allocated(),
            "measured_reserved": torch.cuda.max_memory_reserved()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", default="hf,lightning,hf-oom",
                    help="comma-separated; with several, each runs in a process of its own "
                         "(this script again), so peaks and caches do not carry over from one "
                         "run to the next")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = a.runs.split(",")
    if len(runs) > 1:
        # session 23 ran the three in one process: the Lightning run then measured the HF
        # run's leftovers (+0.46 GiB). One process per run, always.
        for name in runs:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--out", a.out,
                                "--runs", name])
            print(f"{name}: exit {r.returncode}", flush=True)
        return
    v = versions()
    with open(os.path.join(a.out, "callbacks.jsonl"), "a") as f:
        for name, fn in (("hf", lambda: hf_run(BATCH, 5, [])),
                         ("lightning", lambda: lightning_run([])),
                         ("hf-oom", lambda: hf_run(64, 3, [], cap_gib=8))):
            if name not in runs:
                continue
            try:
                rec = fn()
            except Exception as e:
                rec = {"run": name, "failed": f"{type(e).__name__}: {e}"[:500],
                       "trace": traceback.format_exc()[-2000:]}
            rec["versions"] = v
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps(rec)[:600], flush=True)


if __name__ == "__main__":
    main()

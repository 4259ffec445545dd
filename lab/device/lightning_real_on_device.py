#!/usr/bin/env python3
"""The Lightning grid's rows (lab/grids/make_grid31_lightning.py) run by a real PyTorch Lightning
`Trainer`, to check that torch_runner's `loop: "lightning"` (Lightning's closure order,
emulated) is what Lightning does. One process per row:

    python3 lab/device/lightning_real_on_device.py ROWS.jsonl [ROWS.jsonl ...] > real.jsonl

The model is built as torch_runner builds it (on the GPU, checkpointing as it enables it);
the LightningModule's `training_step` returns the loss (`model(input_ids, labels).loss`, or
cross-entropy of a vision model's logits); the precision plugin is "32-true", "bf16-mixed",
"16-mixed" (GradScaler) or "bf16-true"; `accumulate_grad_batches` is the row's accum. The
peaks are those of the measured step: `torch.cuda.reset_peak_memory_stats()` when the
optimizer step WARMUP + 1 starts, read after its last micro-batch (the optimizer step has
run). amp-fp16 rows count the steps the GradScaler let through, as the runner does.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "crates", "device", "runners"))
PLUGIN = {"fp32": "32-true", "amp-bf16": "bf16-mixed", "amp-fp16": "16-mixed", "bf16": "bf16-true"}


def run_row(row):
    import torch
    import torch.nn.functional as F
    import lightning as L
    import torch_runner as tr

    cfg, preset = tr.normalize_config({k: v for k, v in row.items()
                                       if k not in ("grid_id", "split", "estimate_gb")})
    fam = preset["family"]
    size = cfg.get("image") if fam in tr.IMAGE_FAMILIES else cfg.get("seq")
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = tr.build_reference(preset, size, attention=cfg["attention"],
                                   dtype=torch.bfloat16 if cfg["precision"] == "bf16" else None)
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    if cfg["checkpointing"]:
        tr.enable_checkpointing(model, fam, False)
    B = cfg["batch"]
    vocab = model.config.vocab_size if fam in tr.HF_FAMILIES else None

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            if fam in tr.HF_FAMILIES:
                x = torch.randint(0, vocab, (cfg["seq"],), generator=g)
                return x, x
            img = cfg.get("image") or 224
            return torch.randn(3, img, img, generator=g), torch.randint(0, 1000, (), generator=g)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.m = model

        def training_step(self, batch, i):
            x, y = batch
            if fam in tr.HF_FAMILIES:
                return self.m(input_ids=x, labels=y).loss
            return F.cross_entropy(tr._logits(self.m(x), fam), y)

        def configure_optimizers(self):
            return tr.make_optimizer(cfg["optimizer"], self.parameters())

    rec = {}
    state = {"measure_at": tr.WARMUP}
    cuda = torch.cuda.is_available()  # a CPU run only smoke-tests this script

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class Peaks(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == state["measure_at"] and batch_idx % cfg["accum"] == 0 \
                    and "start" not in rec:
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                rec["start"] = trainer.global_step
                rec["allocated_start"] = torch.cuda.memory_allocated() if cuda else 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if "start" in rec and "peak_allocated" not in rec and trainer.global_step > rec["start"]:
                sync()
                rec["peak_allocated"] = torch.cuda.max_memory_allocated() if cuda else 0
                rec["peak_reserved"] = torch.cuda.max_memory_reserved() if cuda else 0
                trainer.should_stop = True

    dl = torch.utils.data.DataLoader(Data(), batch_size=B, shuffle=False)
    t = L.Trainer(max_steps=tr.WARMUP + 20, precision=PLUGIN[cfg["precision"]],
                  accelerator="gpu" if cuda else "cpu",
                  devices=1, accumulate_grad_batches=cfg["accum"], callbacks=[Peaks()],
                  logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0)
    t.fit(Module(), dl)
    out = dict(row)
    out.pop("estimate_gb", None)
    out.update(rec)
    out["engine"] = "lightning"
    out["steps_run"] = int(t.global_step)
    out["versions"] = {**tr.versions(), "lightning": L.__version__}
    return out


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(run_row(json.loads(sys.argv[2]))), flush=True)
        return
    for f in sys.argv[1:]:
        for line in open(f):
            if not line.strip():
                continue
            row = json.loads(line)
            p = subprocess.run([sys.executable, __file__, "--one", line.strip()],
                               capture_output=True, text=True, timeout=240)
            got = [l for l in p.stdout.splitlines() if l.startswith("{")]
            if p.returncode == 0 and got:
                print(got[-1], flush=True)
            else:
                print(json.dumps({**row, "engine": "lightning", "error": p.stderr[-2000:]}), flush=True)


if __name__ == "__main__":
    main()

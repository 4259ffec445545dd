"""`vramlab.fit(...).to_json()` is `vramlab fit … --json`, and `vramlab.export(plan, format)`
is `vramlab export … --format FORMAT`, byte for byte, for tables of configurations; every
fit candidate's `apply()` plans that candidate."""

import json
import subprocess

import pytest

import vramlab

HF = "tests/data/hf_configs"

# (name, keywords of vramlab.fit, the CLI's arguments after `fit`)
FITS = [
    ("llama3-8b-4090", dict(model="Meta-Llama-3-8B", batch=4, seq=2048, gpu="rtx-4090"),
     ["--model", "Meta-Llama-3-8B", "--batch", "4", "--seq", "2048", "--gpu", "rtx-4090"]),
    ("gpt2-fits-as-is", dict(model="gpt2", batch=8, seq=1024, gpu="a100-80gb"),
     ["--model", "gpt2", "--batch", "8", "--seq", "1024", "--gpu", "a100-80gb"]),
    ("fp32-effective-batch-top3", dict(model="gpt2-large", batch=16, seq=1024, precision="fp32",
                                       gpu="rtx-3060", effective_batch=64, top=3, margin=0.1),
     ["--model", "gpt2-large", "--batch", "16", "--seq", "1024", "--precision", "fp32",
      "--gpu", "rtx-3060", "--effective-batch", "64", "--top", "3", "--margin", "0.1"]),
    ("lora-hf-config", dict(model=f"{HF}/Qwen2.5-0.5B.json", batch=8, seq=2048, finetune="lora",
                            lora_rank=32, lora_dropout=0.05, gpu="t4"),
     ["--model", f"{HF}/Qwen2.5-0.5B.json", "--batch", "8", "--seq", "2048", "--finetune",
      "lora", "--lora-rank", "32", "--lora-dropout", "0.05", "--gpu", "t4"]),
    ("ddp-strategy-switch", dict(model="Llama-2-13b-hf", batch=2, seq=2048, gpus=4,
                                 strategy="ddp", bucket_cap_mb=50, gpu="a100-40gb"),
     ["--model", "Llama-2-13b-hf", "--batch", "2", "--seq", "2048", "--gpus", "4",
      "--strategy", "ddp", "--bucket-cap-mb", "50", "--gpu", "a100-40gb"]),
    ("nothing-fits", dict(model="Llama-2-13b-hf", batch=1, seq=4096, gpu="rtx-3060"),
     ["--model", "Llama-2-13b-hf", "--batch", "1", "--seq", "4096", "--gpu", "rtx-3060"]),
]


def run_cli(cli, args):
    return subprocess.run([cli, *args], capture_output=True, text=True)


@pytest.mark.parametrize("name,kw,args", FITS, ids=[f[0] for f in FITS])
def test_fit_json_equals_the_cli(cli, root, monkeypatch, name, kw, args):
    monkeypatch.chdir(root)
    out = run_cli(cli, ["fit", *args, "--json"])
    f = vramlab.fit(**kw)
    assert f.to_json() + "\n" == out.stdout, out.stderr
    # Nothing fits: the CLI exits 3 (EXIT_NOTHING_FITS); Python answers no candidates.
    assert out.returncode == (0 if f.fits else 3), out.stderr
    cli_json = json.loads(out.stdout)
    assert [c.changes for c in f.candidates] == [c["changes"] for c in cli_json["candidates"]]
    assert f.reason == cli_json.get("reason")
    assert f.notes == [
        line for line in out.stderr.splitlines() if line.startswith(("note:", "warning:"))
    ]


@pytest.mark.parametrize("name,kw,args", FITS, ids=[f[0] for f in FITS])
def test_every_candidate_applied_plans_that_candidate(root, monkeypatch, name, kw, args):
    monkeypatch.chdir(root)
    f = vramlab.fit(**kw)
    if name == "nothing-fits":
        assert not f.fits and f.best is None and f.reason
        return
    assert f.fits
    for c in f.candidates:
        words = c.apply()
        p = vramlab.plan(**words)
        # The configuration planned is the candidate's, and so are its peaks.
        assert p.config == c.config, (c.summary, words)
        assert p.peak_allocated_bytes == c.peak_allocated, c.summary
        assert p.fits(), c.summary
        assert words["batch"] == c.micro_batch and words.get("accum", 1) == c.accum


def test_fit_refuses_what_the_cli_refuses(cli, root, monkeypatch):
    monkeypatch.chdir(root)
    out = run_cli(cli, ["fit", "--model", "gpt2", "--top", "0"])
    assert out.returncode == 1
    with pytest.raises(ValueError) as e:
        vramlab.fit("gpt2", top=0)
    assert "error: " + str(e.value) + "\n" == out.stderr
    with pytest.raises(TypeError, match="effective_batch: expected a whole number"):
        vramlab.fit("gpt2", effective_batch="64")


# (name, keywords of vramlab.plan, format, the CLI's arguments after `export`)
EXPORTS = [
    ("gpt2-deepspeed", dict(model="gpt2", batch=8, seq=1024), "deepspeed",
     ["--model", "gpt2", "--batch", "8", "--seq", "1024"]),
    ("llama-hf-ckpt", dict(model="Meta-Llama-3-8B", batch=2, seq=2048, checkpointing=True,
                           precision="bf16", gpu="h100"), "hf",
     ["--model", "Meta-Llama-3-8B", "--batch", "2", "--seq", "2048", "--checkpointing",
      "--precision", "bf16", "--gpu", "h100"]),
    ("qlora-peft", dict(model="Meta-Llama-3-8B", batch=2, seq=1024, finetune="qlora",
                        lora_rank=16, lora_targets="all-linear", checkpointing=True), "peft",
     ["--model", "Meta-Llama-3-8B", "--batch", "2", "--seq", "1024", "--finetune", "qlora",
      "--lora-rank", "16", "--lora-targets", "all-linear", "--checkpointing"]),
    ("lightning-accum", dict(model="gpt2-medium", batch=4, seq=512, accum=8,
                             precision="amp-fp16"), "lightning",
     ["--model", "gpt2-medium", "--batch", "4", "--seq", "512", "--accum", "8", "--precision",
      "amp-fp16"]),
    ("pytorch-vision", dict(model="resnet50", batch=64, image=224, optimizer="sgd-momentum"),
     "pytorch", ["--model", "resnet50", "--batch", "64", "--image", "224", "--optimizer",
                 "sgd-momentum"]),
    ("vramlab-file-hf-config", dict(model=f"{HF}/Qwen2.5-0.5B.json", batch=4, seq=512,
                                    expandable_segments=True), "vramlab",
     ["--model", f"{HF}/Qwen2.5-0.5B.json", "--batch", "4", "--seq", "512",
      "--expandable-segments"]),
    ("env-alias", dict(model="gpt2", batch=2, max_split_size_mb=128), "alloc-conf",
     ["--model", "gpt2", "--batch", "2", "--max-split-size-mb", "128"]),
    ("zero3-deepspeed", dict(model="Llama-2-13b-hf", batch=2, seq=2048, gpus=8, strategy="zero3",
                             offload="optimizer", stage3_prefetch_bucket_size=20000000),
     "ds", ["--model", "Llama-2-13b-hf", "--batch", "2", "--seq", "2048", "--gpus", "8",
            "--strategy", "zero3", "--offload", "optimizer", "--stage3-prefetch-bucket-size",
            "20000000"]),
    ("fsdp2-accelerate", dict(model="Meta-Llama-3-8B", batch=1, seq=4096, gpus=8,
                              strategy="fsdp2", gpu="h200"), "accelerate",
     ["--model", "Meta-Llama-3-8B", "--batch", "1", "--seq", "4096", "--gpus", "8",
      "--strategy", "fsdp2", "--gpu", "h200"]),
    ("torchrun", dict(model="gpt2-large", batch=4, seq=1024, gpus=4, nodes=2, strategy="ddp"),
     "torchrun", ["--model", "gpt2-large", "--batch", "4", "--seq", "1024", "--gpus", "4",
                  "--nodes", "2", "--strategy", "ddp"]),
]


@pytest.mark.parametrize("name,kw,fmt,args", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_export_is_the_clis_bytes(cli, root, monkeypatch, name, kw, fmt, args):
    monkeypatch.chdir(root)
    out = run_cli(cli, ["export", *args, "--format", fmt])
    assert out.returncode == 0, out.stderr
    text = vramlab.export(vramlab.plan(**kw), format=fmt)
    assert text == out.stdout
    assert len(text) > 40


def test_export_refuses_what_the_cli_refuses(cli, root, monkeypatch):
    monkeypatch.chdir(root)
    out = run_cli(cli, ["export", "--model", "gpt2", "--batch", "2", "--format", "deepspeeed"])
    assert out.returncode == 1
    with pytest.raises(ValueError) as e:
        vramlab.export(vramlab.plan("gpt2", 2), format="deepspeeed")
    assert "error: " + str(e.value) + "\n" == out.stderr
    with pytest.raises(TypeError, match="expected a vramlab.Plan"):
        vramlab.export({"model": "gpt2"}, format="hf")


def test_a_fit_candidate_exports(root, monkeypatch):
    """The ranked answer, applied, exported: what a notebook does with `vramlab fit`."""
    monkeypatch.chdir(root)
    best = vramlab.fit("Meta-Llama-3-8B", batch=4, seq=2048, gpu="rtx-4090").best
    assert best is not None and best.changes
    ds = json.loads(vramlab.export(vramlab.plan(**best.apply()), format="deepspeed"))
    assert ds["train_micro_batch_size_per_gpu"] == best.micro_batch
    assert ds["gradient_accumulation_steps"] == best.accum

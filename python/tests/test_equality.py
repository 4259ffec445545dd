"""`vramlab.plan(...).to_json()` is `vramlab plan … --json`, and `vramlab.max_batch`'s is
`vramlab max-batch … --json`, for a table of configurations: presets, a Hugging Face
config.json, fine-tuning modes, strategies, a multi-GPU search, nothing fitting, aliases
(whose notes are the CLI's standard error)."""

import json
import subprocess

import pytest

import vramlab

HF = "tests/data/hf_configs"

# (name, keywords of vramlab.plan, the CLI's arguments after `plan`)
PLANS = [
    ("gpt2-amp-bf16", dict(model="gpt2", batch=8, seq=1024, precision="amp-bf16"),
     ["--model", "gpt2", "--batch", "8", "--seq", "1024", "--precision", "amp-bf16"]),
    ("llama3-8b-h100-checkpointing",
     dict(model="Meta-Llama-3-8B", batch=2, seq=2048, gpu="h100", checkpointing=True,
          precision="bf16"),
     ["--model", "Meta-Llama-3-8B", "--batch", "2", "--seq", "2048", "--gpu", "h100",
      "--checkpointing", "--precision", "bf16"]),
    ("hf-config-qwen2.5", dict(model=f"{HF}/Qwen2.5-0.5B.json", batch=4, seq=512,
                               optimizer="adam8bit", gpu="l4"),
     ["--model", f"{HF}/Qwen2.5-0.5B.json", "--batch", "4", "--seq", "512", "--optimizer",
      "adam8bit", "--gpu", "l4"]),
    ("lora-all-linear", dict(model="Llama-2-7b-hf", batch=4, seq=1024, finetune="lora",
                             lora_rank=16, lora_targets="all-linear", lora_dropout=0.05,
                             gpu="a100-40gb"),
     ["--model", "Llama-2-7b-hf", "--batch", "4", "--seq", "1024", "--finetune", "lora",
      "--lora-rank", "16", "--lora-targets", "all-linear", "--lora-dropout", "0.05",
      "--gpu", "a100-40gb"]),
    ("qlora-fp4-reentrant", dict(model="Meta-Llama-3-8B", batch=2, seq=1024, finetune="qlora",
                                 quant="fp4", no_double_quant=True, checkpointing=True,
                                 checkpointing_reentrant=True, gpu="rtx-4090"),
     ["--model", "Meta-Llama-3-8B", "--batch", "2", "--seq", "1024", "--finetune", "qlora",
      "--quant", "fp4", "--no-double-quant", "--checkpointing", "--checkpointing-reentrant",
      "--gpu", "rtx-4090"]),
    ("freeze-trainer-loop", dict(model="gpt2-medium", batch=4, seq=512, freeze_blocks=6,
                                 freeze_embeddings=True, loop="trainer", accum=4),
     ["--model", "gpt2-medium", "--batch", "4", "--seq", "512", "--freeze-blocks", "6",
      "--freeze-embeddings", "--loop", "trainer", "--accum", "4"]),
    ("zero3-offload", dict(model="Llama-2-13b-hf", batch=2, seq=2048, gpus=4, nodes=2,
                           strategy="zero3", offload="optimizer", gpu="a100-80gb",
                           stage3_prefetch_bucket_size=20000000),
     ["--model", "Llama-2-13b-hf", "--batch", "2", "--seq", "2048", "--gpus", "4",
      "--nodes", "2", "--strategy", "zero3", "--offload", "optimizer", "--gpu", "a100-80gb",
      "--stage3-prefetch-bucket-size", "20000000"]),
    ("fsdp2-no-reshard", dict(model="Meta-Llama-3-8B", batch=1, seq=4096, gpus=8,
                              strategy="fsdp2", no_reshard_after_forward=True,
                              fsdp_mixed_precision="bf16", gpu="h200"),
     ["--model", "Meta-Llama-3-8B", "--batch", "1", "--seq", "4096", "--gpus", "8",
      "--strategy", "fsdp2", "--no-reshard-after-forward", "--fsdp-mixed-precision", "bf16",
      "--gpu", "h200"]),
    ("ddp-buckets", dict(model="gpt2-large", batch=4, seq=1024, gpus=2, strategy="ddp",
                         bucket_cap_mb=50, gradient_as_bucket_view=True),
     ["--model", "gpt2-large", "--batch", "4", "--seq", "1024", "--gpus", "2", "--strategy",
      "ddp", "--bucket-cap-mb", "50", "--gradient-as-bucket-view"]),
    ("gpus-auto", dict(model="Llama-2-13b-hf", batch=4, seq=1024, gpus="auto",
                       strategy="zero3", gpu="a100-80gb", checkpointing=True),
     ["--model", "Llama-2-13b-hf", "--batch", "4", "--seq", "1024", "--gpus", "auto",
      "--strategy", "zero3", "--gpu", "a100-80gb", "--checkpointing"]),
    ("nothing-fits", dict(model="gpt2-large", batch=64, seq=1024, precision="fp32",
                          optimizer="sgd", gpu="rtx-3060"),
     ["--model", "gpt2-large", "--batch", "64", "--seq", "1024", "--precision", "fp32",
      "--optimizer", "sgd", "--gpu", "rtx-3060"]),
    ("vision-eval-aliases", dict(model="resnet50", batch=64, image=224, precision="fp16",
                                 step="eval", gpu="RTX 3090", margin=0.1),
     ["--model", "resnet50", "--batch", "64", "--image", "224", "--precision", "fp16",
      "--step", "eval", "--gpu", "RTX 3090", "--margin", "0.1"]),
    ("t5-target-seq-eager", dict(model=f"{HF}/flan-t5-base.json", batch=8, seq=512,
                                 target_seq=64, attention="eager", expandable_segments=True),
     ["--model", f"{HF}/flan-t5-base.json", "--batch", "8", "--seq", "512", "--target-seq",
      "64", "--attention", "eager", "--expandable-segments"]),
    ("moe-imbalance-timeline", dict(model=f"{HF}/Qwen3-30B-A3B.json", batch=1, seq=1024,
                                    moe_imbalance=1.5, gpu="h200", finetune="lora",
                                    timeline=True),
     ["--model", f"{HF}/Qwen3-30B-A3B.json", "--batch", "1", "--seq", "1024",
      "--moe-imbalance", "1.5", "--gpu", "h200", "--finetune", "lora", "--timeline"]),
]


def run_cli(cli, root, args):
    return subprocess.run([cli, *args, "--json"], cwd=root, capture_output=True, text=True)


@pytest.mark.parametrize("name,kw,args", PLANS, ids=[p[0] for p in PLANS])
def test_plan_json_equals_the_cli(cli, root, monkeypatch, name, kw, args):
    monkeypatch.chdir(root)
    out = run_cli(cli, root, ["plan", *args])
    assert out.returncode == 0, out.stderr
    p = vramlab.plan(**kw)
    cli_json = json.loads(out.stdout)
    # The attributes answered before the search (the plan and its verdict) are the
    # report's values.
    summary = json.loads(p._handle.summary_json())
    assert len(summary) >= 20
    for k, v in summary.items():
        assert v == cli_json.get(k), k
    if kw.get("timeline"):
        assert [list(t) for t in p.timeline] == [
            [e["index"], e["phase"], e["micro"], e["allocated"]] for e in cli_json["timeline"]
        ]
    assert json.loads(p.to_json()) == cli_json
    # Byte for byte, too: the same serialiser wrote both.
    assert p.to_json() + "\n" == out.stdout
    # What the CLI said on standard error is the plan's notes.
    assert p.notes == [line for line in out.stderr.splitlines() if line]
    assert p.peak_allocated_bytes == cli_json["peak_allocated_bytes"]
    assert p.peak_reserved_bytes == cli_json["peak_reserved_bytes"]
    assert p.nvidia_smi_bytes == cli_json["nvidia_smi_bytes"]
    assert p.fits() == cli_json["fits"]
    assert p.max_batch == cli_json["max_batch"]
    assert p.breakdown == cli_json["breakdown"]
    assert p.error_band.reserved.upper_bytes == cli_json["error_band"]["reserved"]["upper_bytes"]


MAX_BATCHES = [
    ("gpt2", dict(model="gpt2", seq=1024), ["--model", "gpt2", "--seq", "1024"]),
    ("target-batch", dict(model="Meta-Llama-3-8B", seq=2048, gpu="h100", checkpointing=True,
                          target_batch=64),
     ["--model", "Meta-Llama-3-8B", "--seq", "2048", "--gpu", "h100", "--checkpointing",
      "--target-batch", "64"]),
    ("nothing-fits", dict(model="Llama-2-13b-hf", seq=4096, precision="fp32", gpu="t4"),
     ["--model", "Llama-2-13b-hf", "--seq", "4096", "--precision", "fp32", "--gpu", "t4"]),
    ("lora-hf-config", dict(model=f"{HF}/gemma-2-2b.json", seq=1024, finetune="lora",
                            gpu="rtx-3060"),
     ["--model", f"{HF}/gemma-2-2b.json", "--seq", "1024", "--finetune", "lora", "--gpu",
      "rtx-3060"]),
]


@pytest.mark.parametrize("name,kw,args", MAX_BATCHES, ids=[m[0] for m in MAX_BATCHES])
def test_max_batch_json_equals_the_cli(cli, root, monkeypatch, name, kw, args):
    monkeypatch.chdir(root)
    out = run_cli(cli, root, ["max-batch", *args])
    m = vramlab.max_batch(**kw)
    assert m.to_json() + "\n" == out.stdout, out.stderr
    cli_json = json.loads(out.stdout)
    assert m.max_batch == cli_json["max_batch"]
    # Nothing fits: the CLI exits 3 (EXIT_NOTHING_FITS); Python answers max_batch None.
    assert out.returncode == (0 if m.fits else 3)
    assert m.notes == [
        line for line in out.stderr.splitlines() if line.startswith(("note:", "warning:"))
    ]


# (keywords, the CLI's arguments after `plan`): refused with the CLI's message.
ERRORS = [
    (dict(model="gpt2", batch=2, optimizer="adamww"),
     ["--model", "gpt2", "--batch", "2", "--optimizer", "adamww"]),
    (dict(model="gpt2", batch=2, image=224), ["--model", "gpt2", "--batch", "2", "--image", "224"]),
    (dict(model="gpt2", batch=2, lora_rank=8), ["--model", "gpt2", "--batch", "2", "--lora-rank", "8"]),
    (dict(model="gpt2", batch=2, strategy="zero3", bucket_cap_mb=10),
     ["--model", "gpt2", "--batch", "2", "--strategy", "zero3", "--bucket-cap-mb", "10"]),
    (dict(model="gpt2", batch=2, gpu="a100-90gb"), ["--model", "gpt2", "--batch", "2", "--gpu", "a100-90gb"]),
    (dict(model="lama-3-8b", batch=2), ["--model", "lama-3-8b", "--batch", "2"]),
    (dict(model="gpt2", batch=2, margin=1.5), ["--model", "gpt2", "--batch", "2", "--margin", "1.5"]),
]


@pytest.mark.parametrize("kw,args", ERRORS, ids=[" ".join(e[1][4:]) for e in ERRORS])
def test_errors_are_the_clis(cli, root, monkeypatch, kw, args):
    monkeypatch.chdir(root)
    out = run_cli(cli, root, ["plan", *args])
    assert out.returncode == 1
    with pytest.raises(ValueError) as e:
        vramlab.plan(**kw)
    assert "error: " + str(e.value) + "\n" == out.stderr

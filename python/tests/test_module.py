"""`vramlab.plan_module`: a live module captured in-process on fake tensors and planned by
the core is `vramlab capture` + `vramlab plan --model graph.json`; the module is left as it
was, and so is torch (the CPU policies the capture registers are taken back). Skipped where
torch is not installed."""

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import vramlab  # noqa: E402

FACTORY = textwrap.dedent(
    """
    import torch.nn as nn

    def factory():
        return nn.Sequential(
            nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1),
            nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(3)]),
            nn.LayerNorm(256), nn.Linear(256, 10),
        )
    """
)


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("module") / "tiny.py"
    path.write_text(FACTORY)
    scope = {}
    exec(compile(FACTORY, str(path), "exec"), scope)
    return path, scope["factory"]


# (keywords of plan_module and the capture, keywords of the plan)
CASES = [
    (dict(precision="fp32", optimizer="adamw"), dict(gpu="t4")),
    (dict(precision="amp-bf16", optimizer="sgd-momentum", loop="trainer"), dict(gpu="rtx-4090")),
    (dict(precision="bf16", optimizer="adam", checkpointing=True), dict(gpu="l4", margin=0.1)),
]


@pytest.mark.parametrize("cap,kw", CASES, ids=[c[0]["precision"] for c in CASES])
def test_plan_module_is_capture_then_plan(cli, factory, tmp_path, cap, kw):
    path, make = factory
    graph = tmp_path / "tiny.vramlab-graph.json"
    args = [cli, "capture", "--module", f"{path}:factory", "--input", "64",
            "--python", sys.executable, "--precision", cap["precision"],
            "--optimizer", cap["optimizer"], "--loop", cap.get("loop", "plain"), "-o", str(graph)]
    if cap.get("checkpointing"):
        args.append("--checkpointing")
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    plan_args = [cli, "plan", "--model", str(graph), "--batch", "48", "--gpu", kw["gpu"], "--json"]
    if "margin" in kw:
        plan_args += ["--margin", str(kw["margin"])]
    out = subprocess.run(plan_args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = json.loads(out.stdout)

    model = make()
    p = vramlab.plan_module(model, torch.randn(5, 64), batch=48, **cap, **kw)
    got = p.to_dict()
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "nvidia_smi_bytes", "breakdown",
                "params", "fits", "max_batch", "peak_phase"):
        assert got[key] == want[key], key
    # The input's size is a label of a captured graph: the CLI's `--input 64` of a module
    # records the default image side (224), plan_module the example's last dimension.
    assert {**got["config"], "size": None} == {**want["config"], "size": None}
    assert got["config"]["size"] == 64
    assert p.peak_allocated_bytes > 0 and p.params == sum(q.numel() for q in model.parameters())
    # fits() on another card plans the same captured graph again
    assert p.fits("h100") is True


def test_the_module_and_torch_are_left_as_they_were(factory):
    _, make = factory
    model = make().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    clear = torch.clear_autocast_cache
    p = vramlab.plan_module(model, torch.randn(1, 64), batch=8, precision="amp-bf16",
                            checkpointing=True)
    assert p.batch == 8
    assert not model.training
    assert [type(m) for m in model.modules()] == kinds  # no checkpoint wrappers
    for k, v in model.state_dict().items():
        assert v.device.type == "cpu" and not isinstance(v, torch._subclasses.FakeTensor)
        assert torch.equal(v, before[k]), k
    # CUDA's autocast lists and SDPA/dropout kernels were registered for the capture only
    assert torch.clear_autocast_cache is clear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(torch.randn(2, 64))
    assert y.dtype == torch.bfloat16
    assert torch.equal(model(torch.ones(1, 64)), model(torch.ones(1, 64)))


def test_dict_inputs_a_loss_fn_and_the_exports():
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.out = torch.nn.Linear(32, 100)

        def forward(self, input_ids, labels):
            logits = self.out(self.emb(input_ids))
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                               labels.flatten()),
                    "logits": logits}

    ids = torch.zeros(2, 16, dtype=torch.long)
    p = vramlab.plan_module(WithLoss(), {"input_ids": ids, "labels": ids}, batch=4)
    assert p.config["size"] == 16  # a token model: the sequence length
    q = vramlab.plan_module(WithLoss(), {"input_ids": ids, "labels": ids}, batch=4,
                            loss_fn=lambda out, x: out["logits"].float().sum())
    assert q.peak_allocated_bytes != p.peak_allocated_bytes
    assert '"train_micro_batch_size_per_gpu": 4' in vramlab.export(p, format="deepspeed")


def test_bad_arguments_name_the_setting(factory):
    _, make = factory
    with pytest.raises(ValueError, match="precision: .*amp-bf16"):
        vramlab.plan_module(make(), torch.randn(1, 64), batch=4, precision="amp-bf61")
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        vramlab.plan_module("gpt2", torch.randn(1, 64), batch=4)
    with pytest.raises(TypeError, match="example_input"):
        vramlab.plan_module(make(), [1, 2], batch=4)
    with pytest.raises(ValueError, match="batch: must be a whole number"):
        vramlab.plan_module(make(), torch.randn(1, 64), batch=0)
    with pytest.raises(ValueError, match="capture: .*optimizer adafactor"):
        vramlab.plan_module(make(), torch.randn(1, 64), batch=4, optimizer="adafactor")

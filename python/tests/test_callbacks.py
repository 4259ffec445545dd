"""The live checks of vramlab.callbacks against a stand-in `torch.cuda` (no GPU here): the
start line or the stop, the plan-vs-measured line after the first steps and its warning past
the band, the doctor on an OOM; and the Lightning / transformers wrappers over stand-in base
classes (the frameworks are not installed in CI)."""

import sys
import types

import pytest

import vramlab
from vramlab import callbacks


class FakeCuda:
    def __init__(self, allocated, reserved):
        self.allocated, self.reserved = allocated, reserved

    def is_available(self):
        return True

    def max_memory_allocated(self, device=None):
        return self.allocated

    def max_memory_reserved(self, device=None):
        return self.reserved


@pytest.fixture
def plan():
    return vramlab.plan(model="gpt2", batch=8, seq=1024, gpu="a100-40gb", loop="trainer")


def fake_torch(monkeypatch, allocated, reserved):
    torch = types.ModuleType("torch")
    torch.cuda = FakeCuda(allocated, reserved)
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_within_the_band_is_one_line_and_no_warning(plan, monkeypatch, recwarn):
    fake_torch(monkeypatch, plan.peak_allocated_bytes, plan.peak_reserved_bytes)
    c = callbacks.PlanCheck(plan, log=lambda _: None)
    c.at_start()
    assert "plan fits a100-40gb" in c.lines[0]
    assert c.after_step(1) is None and c.after_step(2) is None
    line = c.after_step(3)
    assert "+0.0 %" in line and "past" not in line
    assert c.after_step(4) is None, "checked once"
    assert not [w for w in recwarn if "vramlab" in str(w.message)]


def test_past_the_band_warns(plan, monkeypatch):
    upper = plan.error_band.allocated.upper_bytes
    fake_torch(monkeypatch, upper + 1, plan.peak_reserved_bytes)
    c = callbacks.PlanCheck(plan, check_after_steps=1, log=lambda _: None)
    with pytest.warns(RuntimeWarning, match="past the measured band"):
        c.after_step(1)


def test_a_plan_that_does_not_fit_warns_or_stops():
    big = vramlab.plan(model="gpt2-large", batch=64, seq=1024, precision="fp32", gpu="rtx-3060")
    with pytest.warns(RuntimeWarning, match="will not fit rtx-3060"):
        callbacks.PlanCheck(big, log=lambda _: None).at_start()
    with pytest.raises(callbacks.PlanDoesNotFit, match="largest micro-batch"):
        callbacks.PlanCheck(big, on_not_fitting="stop").at_start()
    with pytest.raises(ValueError, match="on_not_fitting"):
        callbacks.PlanCheck(big, on_not_fitting="explode")


def test_an_oom_gets_the_doctor(plan, root):
    text = (root / "tests" / "data" / "doctor" / "fragmentation.message.txt").read_text()
    c = callbacks.PlanCheck(plan, log=lambda _: None)
    assert c.on_exception(ValueError("not an OOM")) is None
    with pytest.warns(RuntimeWarning, match="vramlab doctor: fragmentation"):
        d = c.on_exception(RuntimeError(text))
    assert d.diagnosis == "fragmentation"


def test_the_framework_wrappers_call_the_checks(plan, monkeypatch):
    fake_torch(monkeypatch, plan.peak_allocated_bytes, plan.peak_reserved_bytes)
    lightning = types.ModuleType("lightning")
    lp = types.ModuleType("lightning.pytorch")
    lp.Callback = type("Callback", (), {})
    lightning.pytorch = lp
    monkeypatch.setitem(sys.modules, "lightning", lightning)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", lp)
    transformers = types.ModuleType("transformers")
    transformers.TrainerCallback = type("TrainerCallback", (), {})
    monkeypatch.setitem(sys.modules, "transformers", transformers)

    lplan = vramlab.plan(model="gpt2", batch=8, seq=1024, gpu="a100-40gb", loop="lightning")
    fake_torch(monkeypatch, lplan.peak_allocated_bytes, lplan.peak_reserved_bytes)
    cb = callbacks.lightning_callback(lplan, check_after_steps=2, log=lambda _: None)
    assert isinstance(cb, lp.Callback)
    trainer = types.SimpleNamespace(global_step=2)
    cb.on_fit_start(trainer, None)
    cb.on_train_batch_end(trainer, None, None, None, 0)
    assert len(cb.check.lines) == 2 and "after 2 steps" in cb.check.lines[1]

    # A plan of another loop: Lightning zeroes gradients after the forward; the user's log
    # gets the warning too.
    got = []
    with pytest.warns(RuntimeWarning, match="loop='trainer'"):
        cb = callbacks.lightning_callback(plan, log=got.append)
    assert got and 'loop="lightning"' in got[0]
    assert lplan.peak_allocated_bytes >= plan.peak_allocated_bytes, "the gradients live through the forward"
    fake_torch(monkeypatch, plan.peak_allocated_bytes, plan.peak_reserved_bytes)

    hf = callbacks.trainer_callback(plan, log=lambda _: None)
    assert isinstance(hf, transformers.TrainerCallback)
    hf.on_train_begin(None, types.SimpleNamespace(global_step=0), None)
    hf.on_step_end(None, types.SimpleNamespace(global_step=3), None)
    assert "after 3 steps" in hf.check.lines[-1]

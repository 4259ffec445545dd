"""`runners/capture.py` writes the committed CPU captures again, byte for byte (issue 32: the
capture got faster, its graphs must not change).

tests/data/captured_cpu/*.vramlab-graph.json were written by the runner before the speed-up
with torch 2.11.0 and timm 1.0.29 on a CPU-only machine. Each case here runs the current
runner with the same arguments (read back from the graph: model, precision, optimizer, loop,
checkpointing, input size, batches) and compares the two files with `capture.seconds` (the
wall-clock time the runner measured) set aside: every other byte must be the same.

Needs a Python with those versions of torch, timm, transformers 5.17.0 (and torchvision): $VRAMLAB_CAPTURE_PYTHON,
else the Python running pytest. Skipped where there is none (CI's venv has no torch):

    VRAMLAB_CAPTURE_PYTHON=/work/venv/bin/python python3 -m pytest -q python/tests/test_capture_golden.py
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# the CPU build after the failed fake attempt (timm), checkpointing, a module file,
# torchvision, and a Hugging Face config (built under fake tensors)
CASES = ["convnextv2_t", "deit_s_ckpt", "oddnet", "lraspp_mnv3", "qwen25_05b"]
VERSIONS = ("import torch, timm, torchvision, transformers; "
            "print(torch.__version__.split('+')[0], timm.__version__, transformers.__version__)")


def capture_python():
    py = os.environ.get("VRAMLAB_CAPTURE_PYTHON", sys.executable)
    try:
        p = subprocess.run([py, "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None, "no such Python"
    if p.returncode != 0:
        return None, "no torch, timm, torchvision and transformers"
    have = p.stdout.split()
    if have != ["2.11.0", "1.0.29", "5.17.0"]:
        return None, (f"torch, timm, transformers {' '.join(have)}: the committed graphs are "
                      "torch 2.11.0, timm 1.0.29, transformers 5.17.0")
    return py, None


def arguments(doc, golden):
    """The runner's arguments that wrote `doc` (a committed graph)."""
    kind, _, name = doc["model"].partition(":")
    if kind == "timm":
        src = ["--timm", name]
    elif kind == "torchvision":
        src = ["--torchvision", name]
    elif kind == "module":
        src = ["--module", str(ROOT / "lab" / "models" / name)]
    elif kind == "hf":
        src = ["--hf", str(ROOT / "tests" / "data" / "hf_configs" / name)]
    else:
        pytest.fail(f"{golden}: no rule for model {doc['model']}")
    s = doc["settings"]
    args = [*src, "--precision", s["precision"], "--optimizer", s["optimizer"], "--loop", s["loop"],
            "--batches", ",".join(str(b["batch"]) for b in doc["batches"])]
    args += ["--seq" if doc["input"]["kind"] == "tokens" else "--image", str(doc["input"]["size"])]
    if s["checkpointing"]:
        args.append("--checkpointing")
    return args


def without_seconds(text):
    """The graph without what describes the capturing run rather than the model: the
    wall-clock seconds and the model libraries' versions (written since session 18; the
    committed graphs and the reference runner predate it)."""
    doc = json.loads(text)
    doc["capture"].pop("seconds")
    doc.pop("libraries", None)
    return doc


@pytest.mark.parametrize("case", CASES)
def test_capture_writes_the_committed_graph(case, tmp_path):
    py, why = capture_python()
    if py is None:
        pytest.skip(f"capture Python: {why} (set VRAMLAB_CAPTURE_PYTHON)")
    golden = ROOT / "tests" / "data" / "captured_cpu" / f"{case}.vramlab-graph.json"
    want = golden.read_text()
    out = tmp_path / "g.vramlab-graph.json"
    p = subprocess.run([py, str(ROOT / "runners" / "capture.py"), *arguments(json.loads(want), golden),
                        "--device", "cpu", "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    got = out.read_text()
    a, b = without_seconds(want), without_seconds(got)
    for key in a:
        assert a[key] == b.get(key), f"{case}: field {key} differs from {golden.name}"
    assert a == b
    # and the bytes: the same writer (json.dump, compact), so the text matches once the
    # seconds are put back
    b_doc = json.loads(got)
    b_doc["capture"]["seconds"] = json.loads(want)["capture"]["seconds"]
    if "libraries" not in json.loads(want):
        b_doc.pop("libraries", None)
    assert json.dumps(b_doc, separators=(",", ":")) == want.rstrip("\n")


def _runner(tmp_path, name, script):
    """`script` copied into its own folder with the modules it imports from beside itself."""
    d = tmp_path / name
    d.mkdir()
    (d / "capture.py").write_text(script.read_text())
    for mod in ("cuda_autocast.py", "cuda_composites.py"):
        (d / mod).write_text((ROOT / "runners" / mod).read_text())
    return d / "capture.py"


def _both(tmp_path, args):
    """(returncode, last stderr line, graph without seconds or None) of the reference runner
    (lab/cpu/capture_ref: the runner before issue 32) and of runners/capture.py."""
    py, why = capture_python()
    if py is None:
        pytest.skip(f"capture Python: {why} (set VRAMLAB_CAPTURE_PYTHON)")
    got = []
    for name, script in (("old", ROOT / "lab" / "cpu" / "capture_ref" / "capture.py"),
                         ("new", ROOT / "runners" / "capture.py")):
        out = tmp_path / f"{name}.vramlab-graph.json"
        p = subprocess.run([py, str(_runner(tmp_path, name, script)), *args, "-o", str(out)],
                           capture_output=True, text=True, cwd=ROOT)
        lines = p.stderr.strip().splitlines()
        graph = without_seconds(out.read_text()) if p.returncode == 0 else None
        got.append((p.returncode, lines[-1] if lines else "", graph))
    return got


def test_one_time_allocation_is_captured_again_like_the_reference(tmp_path):
    """The first capture of a process (and the forked child's) holds a one-time allocation:
    both are captured again, and the graph is the reference runner's."""
    old, new = _both(tmp_path, ["--module", str(ROOT / "lab" / "models" / "capture_one_time_model.py") + ":build",
                                "--input", "64", "--device", "cpu"])
    assert old[0] == 0, old[1]
    assert new == old


@pytest.mark.parametrize("factory,code", [("data_dependent", 5), ("not_affine", 6), ("fails_at_batch_6", 1)])
def test_errors_are_the_reference_runners(tmp_path, factory, code):
    """Exit status and message as before, also where only the child's batch fails."""
    old, new = _both(tmp_path, ["--module", str(ROOT / "lab" / "models" / "capture_error_models.py") + ":" + factory,
                                "--input", "32", "--device", "cpu"])
    assert old[0] == code, old
    assert new[:2] == old[:2]

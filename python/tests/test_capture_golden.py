"""`runners/capture.py` writes the committed CPU captures again, byte for byte (issue 32: the
capture got faster, its graphs must not change).

tests/data/captured_cpu/*.vramlab-graph.json were written by the runner before the speed-up
with torch 2.11.0 and timm 1.0.29 on a CPU-only machine. Each case here runs the current
runner with the same arguments (read back from the graph: model, precision, optimizer, loop,
checkpointing, input size, batches) and compares the two files with `capture.seconds` (the
wall-clock time the runner measured) set aside: every other byte must be the same.

Needs a Python with those versions of torch and timm (and torchvision): $VRAMLAB_CAPTURE_PYTHON,
else the Python running pytest. Skipped where there is none (CI's venv has no torch):

    VRAMLAB_CAPTURE_PYTHON=/work/venv/bin/python python3 -m pytest -q python/tests/test_capture_golden.py
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

CASES = ["convnextv2_t", "deit_s_ckpt", "oddnet", "lraspp_mnv3"]
VERSIONS = "import torch, timm, torchvision; print(torch.__version__.split('+')[0], timm.__version__)"


def capture_python():
    py = os.environ.get("VRAMLAB_CAPTURE_PYTHON", sys.executable)
    try:
        p = subprocess.run([py, "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None, "no such Python"
    if p.returncode != 0:
        return None, "no torch, timm and torchvision"
    have = p.stdout.split()
    if have != ["2.11.0", "1.0.29"]:
        return None, f"torch {have[0]}, timm {have[1]}: the committed graphs are torch 2.11.0, timm 1.0.29"
    return py, None


def arguments(doc, golden):
    """The runner's arguments that wrote `doc` (a committed graph)."""
    kind, _, name = doc["model"].partition(":")
    if kind == "timm":
        src = ["--timm", name]
    elif kind == "torchvision":
        src = ["--torchvision", name]
    elif kind == "module":
        src = ["--module", str(ROOT / "tools" / name)]
    else:
        pytest.fail(f"{golden}: no rule for model {doc['model']}")
    s = doc["settings"]
    args = [*src, "--precision", s["precision"], "--optimizer", s["optimizer"], "--loop", s["loop"],
            "--batches", ",".join(str(b["batch"]) for b in doc["batches"])]
    args += ["--image", str(doc["input"]["size"])]
    if s["checkpointing"]:
        args.append("--checkpointing")
    return args


def without_seconds(text):
    doc = json.loads(text)
    doc["capture"].pop("seconds")
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
    assert json.dumps(b_doc, separators=(",", ":")) == want.rstrip("\n")

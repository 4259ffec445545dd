"""`lab/cpu/infer_trace_cpu.py` writes the committed CPU traces again, byte for byte (issue 29):
`tests/data/infer/trace_cpu.jsonl` holds what transformers' own modules allocate (MoE blocks,
decoder layers of every type inference plans), and `crates/core/tests/infer_moe.rs` checks the
planner against it; this test checks that the file is what the tool writes.

Needs a Python with torch 2.11.0 and transformers 5.17.0: $VRAMLAB_CAPTURE_PYTHON, else the
Python running pytest. Skipped where there is none (CI's venv has no transformers):

    VRAMLAB_CAPTURE_PYTHON=/tmp/tv/bin/python python3 -m pytest -q python/tests/test_infer_trace.py
"""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

VERSIONS = "import torch, transformers; print(torch.__version__.split('+')[0], transformers.__version__)"


def trace_python():
    py = os.environ.get("VRAMLAB_CAPTURE_PYTHON", sys.executable)
    try:
        p = subprocess.run([py, "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None, "no such Python"
    if p.returncode != 0:
        return None, "no torch and transformers"
    if p.stdout.split() != ["2.11.0", "5.17.0"]:
        return None, f"torch / transformers {p.stdout.strip()}, not 2.11.0 / 5.17.0"
    return py, ""


def test_the_committed_traces_are_what_the_tool_writes():
    py, why = trace_python()
    if py is None:
        pytest.skip(f"lab/cpu/infer_trace_cpu.py needs torch 2.11.0 + transformers 5.17.0: {why}")
    out = subprocess.run([py, os.path.join(ROOT, "lab", "cpu", "infer_trace_cpu.py")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    with open(os.path.join(ROOT, "tests", "data", "infer", "trace_cpu.jsonl")) as f:
        committed = f.read()
    assert out.stdout == committed

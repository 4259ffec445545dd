#!/usr/bin/env python3
"""Old vs new `runners/capture.py`: the same graph, and how long each took (issue 32).

    /work/venv/bin/python lab/cpu/capture_equal.py                 # the default cases
    /work/venv/bin/python lab/cpu/capture_equal.py --case "timm:convnextv2_tiny fp32"

Runs the reference copy of the capture runner as it was before the speed-up
(lab/cpu/capture_ref/capture.py, kept for this check and lab/cpu/bench_capture.py only; the binary
embeds runners/capture.py) and the current runner, one after the other for each case, with the
Python this script runs in (it needs torch, timm and, for the torchvision case, torchvision).
Each pair of graph files must be identical byte for byte once `capture.seconds` (the
wall-clock time the runner measured) and `libraries` (the model libraries' versions, which the
reference runner predates) are set aside; the script prints each case's two times and
their ratio, and exits 1 on the first case whose graphs differ (naming the first differing
field), 0 when every graph is identical.

A case is "SOURCE PRECISION [extra runner arguments]": SOURCE is timm:NAME, tv:NAME (a
torchvision model) or module:PATH:FACTORY (lab/models/handwritten_models.py's models).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = [
    "timm:convnextv2_tiny amp-bf16",
    "timm:convnextv2_tiny fp32",
    "timm:resnet50 amp-bf16",
    "timm:resnet50 fp32",
    "timm:vit_base_patch16_224 amp-bf16",
    "timm:vit_base_patch16_224 fp32",
    "module:lab/models/handwritten_models.py:seg_unet amp-bf16 --image 64",
    "module:lab/models/handwritten_models.py:seg_unet fp32 --image 64",
    "module:lab/models/handwritten_models.py:spec_conformer amp-bf16 --input 1x80x256",
    "module:lab/models/handwritten_models.py:spec_conformer fp32 --input 1x80x256",
    # the other build paths: pure bf16 (parameters made in bf16), checkpointing, a torchvision
    # model, a Hugging Face config (built under fake tensors: no CPU build at all)
    "timm:convnextv2_tiny bf16",
    "timm:deit_small_patch16_224 amp-bf16 --checkpointing",
    "tv:mobilenet_v3_small amp-bf16",
    "hf:tests/data/hf_configs/gpt2.json amp-bf16 --seq 128",
    # a one-time allocation in the first capture of a process: captured again (also the
    # forked child's first capture)
    "module:lab/models/capture_one_time_model.py:build amp-bf16 --input 64",
]


def runner_dirs(tmp):
    """Two folders, each with a capture.py and the modules it imports from beside itself."""
    dirs = {}
    for name, script in (("old", os.path.join(ROOT, "lab", "cpu", "capture_ref", "capture.py")),
                         ("new", os.path.join(ROOT, "runners", "capture.py"))):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        shutil.copy(script, os.path.join(d, "capture.py"))
        for mod in ("cuda_autocast.py", "cuda_composites.py"):
            shutil.copy(os.path.join(ROOT, "runners", mod), os.path.join(d, mod))
        dirs[name] = d
    return dirs


def case_args(case):
    parts = case.split()
    source, precision, extra = parts[0], parts[1], parts[2:]
    kind, _, name = source.partition(":")
    flag = {"timm": "--timm", "tv": "--torchvision", "module": "--module", "hf": "--hf"}[kind]
    if kind in ("module", "hf"):
        name = os.path.join(ROOT, name)
    return [flag, name, "--precision", precision, *extra]


def run(python, runner_dir, args, out):
    t = time.perf_counter()
    p = subprocess.run([python, os.path.join(runner_dir, "capture.py"), *args, "-o", out],
                       capture_output=True, text=True, cwd=ROOT)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return secs


def comparable(path):
    with open(path) as fh:
        doc = json.load(fh)
    doc["capture"].pop("seconds", None)
    # the model libraries' versions (written since session 18) describe the capturing run, and
    # the reference runner predates them: set aside as python/tests/test_capture_golden.py does
    doc.pop("libraries", None)
    return doc


def first_difference(a, b, where=""):
    if type(a) is not type(b):
        return where or "/"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}/{k}"
            d = first_difference(a[k], b[k], f"{where}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{where}/{i}")
            if d:
                return d
        return None
    return None if a == b else where


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", action="append", help="a case (repeatable) instead of the defaults")
    ap.add_argument("--keep", help="copy the graph files into this folder")
    a = ap.parse_args()
    cases = a.case or CASES
    with tempfile.TemporaryDirectory() as tmp:
        dirs = runner_dirs(tmp)
        print(f"{'case':58} {'old s':>7} {'new s':>7} {'old/new':>7}  graph")
        bad = 0
        for case in cases:
            args = case_args(case)
            outs, secs = {}, {}
            for name in ("old", "new"):
                outs[name] = os.path.join(tmp, f"{name}.vramlab-graph.json")
                secs[name] = run(sys.executable, dirs[name], args, outs[name])
            old, new = comparable(outs["old"]), comparable(outs["new"])
            same = json.dumps(old, separators=(",", ":")) == json.dumps(new, separators=(",", ":"))
            verdict = "identical" if same else f"DIFFERS at {first_difference(old, new)}"
            print(f"{case:58} {secs['old']:7.2f} {secs['new']:7.2f} "
                  f"{secs['old'] / secs['new']:6.2f}x  {verdict}", flush=True)
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
                stem = case.split()[0].replace(":", "_").replace("/", "_") + "_" + case.split()[1]
                for name in ("old", "new"):
                    shutil.copy(outs[name], os.path.join(a.keep, f"{stem}.{name}.vramlab-graph.json"))
            if not same:
                bad += 1
        print(f"{len(cases) - bad} identical, {bad} differ")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

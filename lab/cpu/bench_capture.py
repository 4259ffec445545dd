#!/usr/bin/env python3
"""Capture speed, old vs new side by side in one run (issue 32; quoted in docs/speed.md).

    /work/venv/bin/python lab/cpu/bench_capture.py                       # convnextv2_tiny, 5 runs each
    /work/venv/bin/python lab/cpu/bench_capture.py --runs 7 --binary target/debug/vramlab \\
        -- --timm vit_base_patch16_224

Times whole processes, as a user runs `vramlab capture`: Python starts, imports torch and timm,
captures at the default batches 2, 4, 6 and writes the graph. "old" is the runner as it was
before the speed-up (lab/cpu/capture_ref/capture.py, kept for this bench and
lab/cpu/capture_equal.py only), "new" is runners/capture.py (what the binary embeds), and with
--binary also `vramlab capture --python THIS_PYTHON` (the new runner through the binary: the
whole command). The runs alternate (old, new, [binary], old, new, ...) so that a change of the
machine's load falls on all of them alike; each run's wall-clock and CPU time (user + sys of the
child) is kept and the medians printed, with their ratios and the load average before and after.
Prints the numbers only: nothing here asserts on time.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def runner_dir(tmp, name, script):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    shutil.copy(script, os.path.join(d, "capture.py"))
    for mod in ("cuda_autocast.py", "cuda_composites.py"):
        shutil.copy(os.path.join(ROOT, "runners", mod), os.path.join(d, mod))
    return os.path.join(d, "capture.py")


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--binary", help="also time `BINARY capture --python THIS_PYTHON ...`")
    ap.add_argument("capture_args", nargs="*", help="after --: the capture's arguments "
                    "[default: --timm convnextv2_tiny]")
    a = ap.parse_args()
    cargs = a.capture_args or ["--timm", "convnextv2_tiny"]
    with tempfile.TemporaryDirectory() as tmp:
        cmds = {
            "old runner": [sys.executable,
                           runner_dir(tmp, "old", os.path.join(ROOT, "lab", "cpu", "capture_ref", "capture.py")),
                           *cargs, "-o", os.path.join(tmp, "old.json")],
            "new runner": [sys.executable, runner_dir(tmp, "new", os.path.join(ROOT, "runners", "capture.py")),
                           *cargs, "-o", os.path.join(tmp, "new.json")],
        }
        if a.binary:
            cmds["vramlab capture"] = [os.path.abspath(a.binary), "capture", "--python", sys.executable,
                                       *cargs, "-o", os.path.join(tmp, "bin.json")]
        load0 = os.getloadavg()
        res = {k: ([], []) for k in cmds}
        for _ in range(a.runs):
            for k, cmd in cmds.items():
                w, c = timed(cmd)
                res[k][0].append(w)
                res[k][1].append(c)
        load1 = os.getloadavg()
    print(f"capture {' '.join(cargs)}: {a.runs} runs each, alternating; "
          f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before, {load1[0]:.1f} after")
    print(f"{'':16} {'median wall s':>14} {'min wall s':>11} {'median CPU s':>13}   runs (wall s)")
    for k, (w, c) in res.items():
        print(f"{k:16} {statistics.median(w):14.2f} {min(w):11.2f} {statistics.median(c):13.2f}   "
              + " ".join(f"{x:.2f}" for x in w))
    ow, oc = statistics.median(res["old runner"][0]), statistics.median(res["old runner"][1])
    for k in list(cmds)[1:]:
        w, c = statistics.median(res[k][0]), statistics.median(res[k][1])
        print(f"old / {k}: {ow / w:.2f}x wall, {oc / c:.2f}x CPU")


if __name__ == "__main__":
    main()

"""How long `vramlab.plan` takes in-process, beside the same plan as a `vramlab` process.

    python python/tests/bench_plan.py [--reps N] [--bin PATH]

Plans Llama-3-8B (batch 1, seq 2048, the CLI's defaults otherwise: amp-bf16, AdamW,
RTX 4090): `vramlab.plan(...)` (the plan, its verdict and band: the peaks and `fits()`),
and with `.to_json()` the whole `plan --json` answer (the largest micro-batch, a search of
many plans, and every remedy, each planned). Prints the median and the spread of each, and
the ratios to the process. Not collected by pytest (a timing, not a check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import vramlab

ROOT = Path(__file__).resolve().parents[2]
KW = dict(model="Meta-Llama-3-8B", batch=1, seq=2048)
ARGS = ["plan", "--model", "Meta-Llama-3-8B", "--batch", "1", "--seq", "2048", "--json"]


def timed(f, reps):
    f()  # warm: the first plan reads the presets and the measured bands
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def line(name, ts):
    ms = sorted(t * 1e3 for t in ts)
    q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]  # noqa: E731
    print(f"{name:<44} median {statistics.median(ms):9.3f} ms   p10 {q(0.1):9.3f}   p90 {q(0.9):9.3f}   ({len(ms)} runs)")
    return statistics.median(ms)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--bin", default=os.environ.get("VRAMLAB_BIN"))
    a = ap.parse_args()
    binary = a.bin or next(
        (str(p) for p in (ROOT / "target/release/vramlab", ROOT / "target/debug/vramlab") if p.exists()),
        None,
    )
    print(f"vramlab {vramlab.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    full = line("vramlab.plan(...): the plan and its verdict", timed(lambda: vramlab.plan(**KW), a.reps))
    raw = line("vramlab.plan(...).to_json(): the whole report", timed(
        lambda: vramlab.plan(**KW).to_json(), a.reps))
    if binary:
        reps = max(5, a.reps // 10)
        proc = line(f"{Path(binary).parent.name}/vramlab plan --json (a process)", timed(
            lambda: subprocess.run([binary, *ARGS], check=True, capture_output=True), reps))
        print(f"in-process is {proc / full:.0f}x faster than the process ({proc:.2f} ms / {full:.3f} ms)")
    if binary:
        print(f"the whole report in-process is {proc / raw:.0f}x faster than the process")
    return 0


if __name__ == "__main__":
    sys.exit(main())

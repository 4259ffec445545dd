#!/usr/bin/env python3
"""Issue 32's search benchmark: `vramlab fit` and `vramlab plan` as whole processes, the
binaries given side by side in one run (alternated, so that a change of the machine's load
falls on all of them alike). Prints medians of wall-clock time and their ratios to the
first binary; asserts nothing about time.

    python3 lab/cpu/bench_search.py --runs 21 before=/path/to/old/vramlab now=target/release/vramlab
    python3 lab/cpu/bench_search.py now1=target/release/vramlab:VRAMLAB_THREADS=1 now=target/release/vramlab

A binary is NAME=PATH, optionally :VAR=VALUE,... for its environment (VRAMLAB_THREADS=1
runs the search on one thread). Every binary's outputs must be equal byte for byte (checked
on the first run: the benchmark compares the time of the same answer).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = [
    ("fit Llama-3-8B seq 2048 b4, RTX 4090",
     ["fit", "--model", "Meta-Llama-3-8B", "--seq", "2048", "--batch", "4", "--gpu", "rtx-4090"]),
    ("plan Llama-3-8B seq 2048 b4, H200 (remedies)",
     ["plan", "--model", "Meta-Llama-3-8B", "--seq", "2048", "--batch", "4", "--gpu", "h200"]),
    ("plan Llama-3-8B seq 2048 b4, RTX 4090 (remedies + fit search)",
     ["plan", "--model", "Meta-Llama-3-8B", "--seq", "2048", "--batch", "4", "--gpu", "rtx-4090"]),
    ("fit GPT-2 seq 1024 b32, T4",
     ["fit", "--model", "gpt2", "--seq", "1024", "--batch", "32", "--gpu", "t4"]),
]


def parse_binary(spec):
    name, _, rest = spec.partition("=")
    path, _, env = rest.partition(":")
    extra = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return name, path, extra


def run(path, env, args):
    e = dict(os.environ)
    e.update(env)
    t = time.perf_counter()
    p = subprocess.run([path] + args + ["--json"], capture_output=True, env=e)
    return time.perf_counter() - t, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    bins = [parse_binary(b) for b in a.binaries]
    load = os.getloadavg()[0]
    print(f"{a.runs} runs each, alternated; {os.cpu_count()} CPUs, load average {load:.1f} before")
    for label, args in CASES:
        times = {n: [] for n, _, _ in bins}
        outputs = {}
        for r in range(a.runs):
            for n, path, env in bins:
                t, out = run(path, env, args)
                times[n].append(t)
                if r == 0:
                    outputs[n] = out
        # `--json` carries no timing: the outputs of the same answer are equal byte for byte
        first = bins[0][0]
        same = all(outputs[n] == outputs[first] for n in outputs)
        print(f"\n{label}: vramlab {' '.join(args)}  (outputs equal: {'yes' if same else 'NO'})")
        base = statistics.median(times[first])
        for n, _, _ in bins:
            m = statistics.median(times[n])
            print(f"  {n:<12} median {m * 1e3:7.1f} ms  min {min(times[n]) * 1e3:7.1f} ms"
                  f"  {base / m:5.2f}x vs {first}")
    print(f"\nload average {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    sys.exit(main())

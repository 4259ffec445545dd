#!/usr/bin/env python3
"""Markdown tables of recorded bench runs (tests/data/bench/*.json) for the README."""
import glob
import json
import os
import sys

GIB = 2 ** 30
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "bench")
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(root, "*.json"))) if "profile" not in p]


def g(b):
    return "—" if b is None else f"{b / GIB:.2f}"


def num(v, digits):
    return "—" if v is None else f"{v:.{digits}f}"


def err(p, m):
    return "—" if p is None or not m else f"{(p - m) / m * 100:+.1f} %"


print("| model | config | engine | predicted max batch | largest batch that ran | first OOM | trials |")
print("|---|---|---|---:|---:|---:|---:|")
for r in runs:
    ran = [t["batch"] for t in r["trials"] if t["outcome"]["kind"] == "ran"]
    oom = [t["batch"] for t in r["trials"] if t["outcome"]["kind"] == "oom"]
    c = r["config"]
    print(f"| {r['model']} | {c['precision']} {c['optimizer']} size {r['size']} | {r['engine']} | "
          f"{r.get('predicted_max_batch') or '—'} | {max(ran) if ran else '—'} | {min(oom) if oom else '—'} | {len(r['trials'])} |")
print()
print("| model | engine | batch | allocated meas. / pred. (GiB) | err | reserved meas. / pred. (GiB) | err | nvidia-smi meas. / pred. (GiB) | err | step ms | TFLOP/s |")
print("|---|---|---:|---|---:|---|---:|---|---:|---:|---:|")
for r in runs:
    for t in sorted(r["trials"], key=lambda t: t["batch"]):
        if t["outcome"]["kind"] != "ran":
            continue
        p = t.get("predicted") or {}
        if r["engine"] == "native":
            # The native engine replays the plan: its allocated/reserved are not measurements.
            alloc_res = f"plan replayed | — | plan replayed | — | "
        else:
            alloc_res = (f"{g(t.get('peak_allocated'))} / {g(p.get('allocated'))} | "
                         f"{err(p.get('allocated'), t.get('peak_allocated'))} | {g(t.get('peak_reserved'))} / {g(p.get('reserved'))} | "
                         f"{err(p.get('reserved'), t.get('peak_reserved'))} | ")
        print(f"| {r['model']} | {r['engine']} | {t['batch']} | {alloc_res}{g(t.get('process_bytes'))} / {g(p.get('nvidia_smi'))} | "
              f"{err(p.get('nvidia_smi'), t.get('process_bytes'))} | "
              f"{num(t.get('step_ms'), 1)} | {num(t.get('tflops'), 0)} |")

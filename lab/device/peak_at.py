#!/usr/bin/env python3
"""What is alive at a measured row's peak: runs one grid row through torch_runner's `measure`
with PyTorch's memory history recording (python stacks), replays the trace, and prints the
blocks live at the peak of allocated memory, largest first, each with the Python frames
that allocated it (none for allocations made by the autograd engine's backward thread) and
the index of its allocation in the trace.

    python3 lab/device/peak_at.py ROWS.jsonl GRID_ID [GRID_ID ...] > peak.txt

A debugging aid for a row the planner misses: the sizes at the peak (s x s score matrices,
dropout masks, ...) name the tensors the plan lacks.
"""
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "crates", "device", "runners"))

import torch  # noqa: E402
import torch_runner  # noqa: E402


def frames_of(e):
    out = []
    for f in e.get("frames", []):
        fn = f.get("filename", "")
        if any(k in fn for k in ("transformers/", "torch/nn/", "torch/utils/checkpoint", "torch/autograd",
                                 "torch_runner")):
            out.append(f"{os.path.basename(fn)}:{f.get('line')}:{f.get('name')}")
    return out[:4]


def analyse(snap, label):
    trace = snap["device_traces"][0]
    live, cur, peak, at = {}, 0, 0, None
    for i, e in enumerate(trace):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = (e["size"], i, e)
            cur += e["size"]
            if cur > peak:
                peak, at = cur, i
        elif a == "free_requested" and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
    # replay again up to the peak to list what is live then
    live, cur = {}, 0
    for i, e in enumerate(trace[: at + 1]):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], i, e)
        elif e["action"] == "free_requested" and e["addr"] in live:
            live.pop(e["addr"])
    print(f"== {label}: {len(trace)} trace entries, peak {peak} B at entry {at}")
    rows = sorted(live.values(), key=lambda t: -t[0])
    small = sum(s for s, _, _ in rows if s < 16 << 20)
    for s, i, e in rows:
        if s >= 16 << 20:
            print(f"  {s:>14}  #{i:<8} {' < '.join(frames_of(e)) or '(no python frame: backward)'}")
    print(f"  {small:>14}  (blocks under 16 MiB)")
    print(f"  last 12 entries before the peak:")
    for e in trace[max(0, at - 11): at + 1]:
        print(f"    {e['action']:<15} {e['size']:>14}  {' < '.join(frames_of(e))[:150]}")
    sys.stdout.flush()


def main():
    rows_file, ids = sys.argv[1], set(sys.argv[2:])
    rows = [json.loads(l) for l in open(rows_file) if l.strip()]
    for r in rows:
        if r.get("grid_id") not in ids:
            continue
        cfg = {k: v for k, v in r.items() if k not in ("estimate_gb", "model_type")}
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(json.dumps(cfg) + "\n")
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        old = sys.stdout
        sys.stdout = sys.stderr  # the runner's JSON lines
        try:
            torch_runner.main(["measure", f.name])
        finally:
            sys.stdout = old
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        analyse(snap, f"{r['grid_id']} {r.get('model')} b{r.get('batch')} s{r.get('seq')} "
                      f"{r.get('precision')} ckpt={r.get('checkpointing')} {r.get('attention')}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

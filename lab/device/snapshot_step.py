#!/usr/bin/env python3
"""The caching allocator's history of one training step of the shipped runner, the way a user
records it: `torch.cuda.memory._record_memory_history()` (Python stacks only: sizes and addresses
are what is read), switched on after the model is built (the runner's `run_step`: the warm-up steps and the measured one), then
`torch.cuda.memory._snapshot()` pickled. The planner's events replay against it locally
(`crates/core/examples/replay_trace.rs` reads `a SIZE ID` / `f ID` lines made from it).

    PYTHONPATH=/tmp/bnb python3 lab/device/snapshot_step.py --config JSON --out snap.pickle [--cap-gib X]

Under a cap the history of a step that runs out of memory is written too (the OOM's request is
its last event).
"""
import argparse
import os
import pickle
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "device", "runners"))
import torch_runner as tr  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--cap-gib", help="the runner's per-process cap (a capped max-batch row's cap_gib)")
a = ap.parse_args()

inner = tr.run_step


def recorded(*args, **kw):
    torch.cuda.memory._record_memory_history(stacks="python")  # sizes and addresses are what is read
    try:
        return inner(*args, **kw)
    finally:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(a.out, "wb") as f:
            pickle.dump(snap, f)


tr.run_step = recorded
cap = ["--cap-gib", a.cap_gib] if a.cap_gib else []
sys.exit(tr.main(["measure", "--config", a.config, *cap]))

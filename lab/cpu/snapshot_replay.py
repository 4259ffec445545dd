#!/usr/bin/env python3
"""A recorded allocator history (`torch.cuda.memory._snapshot()` pickled, gzip or not, e.g. from
lab/device/snapshot_step.py) as the `a SIZE ID` / `f ID` lines that
`cargo run --release -p vramlab-core --example replay_trace -- FILE [--cap GIB]` replays through
the planner's allocator model: the blocks alive when recording began first (those the history
frees without allocating them, and those alive at the end that it never allocated, in address
order), then the history's allocations and frees in order. An `oom` event ends the lines with a
comment. Where the replay of the real event order through the model keeps the real segments
(and, under a cap, the real flushes), a difference between the plan and the measurement is in
the planner's events, not in its allocator.

    python3 lab/cpu/snapshot_replay.py SNAP.pickle[.gz] > events.txt
"""
import sys

from snapshot_events import load


def main():
    snap = load(sys.argv[1])
    trace = snap["device_traces"][0]
    seen, initial = set(), {}
    for e in trace:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in seen:
            initial.setdefault(e["addr"], e["size"])
    for s in snap["segments"]:
        if s.get("device", 0) != 0:
            continue
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and addr not in seen:
                initial.setdefault(addr, b["size"])
            addr += b["size"]
    for addr in sorted(initial):
        print(f"a {initial[addr]} i{addr}")
    live = set()
    for e in trace:
        a = e["action"]
        if a == "alloc":
            live.add(e["addr"])
            print(f"a {e['size']} {e['addr']}")
        elif a == "free_completed":
            print(f"f {e['addr']}" if e["addr"] in live else f"f i{e['addr']}")
            live.discard(e["addr"])
        elif a == "oom":
            print(f"# oom {e.get('size')}")
            break


if __name__ == "__main__":
    main()

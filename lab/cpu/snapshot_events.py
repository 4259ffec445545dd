#!/usr/bin/env python3
"""A recorded allocator history (`torch.cuda.memory._snapshot()` pickled, gzip or not, e.g. from
lab/device/snapshot_step.py) as one line per event, to set beside the planner's events
(`cargo run --release -p vramlab-core --example alloc_trace -- --row JSON`):

    python3 lab/cpu/snapshot_events.py SNAP.pickle[.gz] [--segments]

Lines: `a SIZE ADDR ALLOCATED FRAME` (an allocation, the bytes allocated after it, the innermost
frame outside torch), `f SIZE ADDR ALLOCATED`, `S+ SIZE RESERVED` / `S- SIZE RESERVED` (a segment
cudaMalloc'd or released, the bytes reserved after it). ALLOCATED and RESERVED start from the
snapshot's state before the history (the segments and blocks alive when recording began are
counted from the final segments less what the history changed). `--segments` prints only the
segment lines, each with the allocation it was made for.
"""
import gzip
import pickle
import sys


def load(path):
    with open(path, "rb") as f:
        head = f.read(2)
    op = gzip.open if head == b"\x1f\x8b" else open
    with op(path, "rb") as f:
        return pickle.load(f)


def frame(e):
    for fr in e.get("frames") or []:
        name = fr.get("filename", "")
        if "/torch/" not in name and "torch_runner" not in name and "snapshot_step" not in name:
            return f"{name.rsplit('/', 1)[-1]}:{fr.get('line')}:{fr.get('name')}"
    fr = (e.get("frames") or [{}])[0]
    return f"{fr.get('filename', '?').rsplit('/', 1)[-1]}:{fr.get('line')}:{fr.get('name')}"


def main():
    snap = load(sys.argv[1])
    only_segments = "--segments" in sys.argv
    trace = snap["device_traces"][0]
    # State at the end, then undo the history to find the state at its start.
    reserved_end = sum(s["total_size"] for s in snap["segments"] if s.get("device", 0) == 0)
    allocated_end = sum(b["size"] for s in snap["segments"] if s.get("device", 0) == 0
                        for b in s["blocks"] if b["state"] == "active_allocated")
    d_res = d_alloc = 0
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            d_res += e["size"]
        elif a == "segment_free":
            d_res -= e["size"]
        elif a == "alloc":
            d_alloc += e["size"]
        elif a == "free_completed":
            d_alloc -= e["size"]
    reserved, allocated = reserved_end - d_res, allocated_end - d_alloc
    print(f"# start: reserved {reserved} allocated {allocated}; end: reserved {reserved_end} "
          f"allocated {allocated_end}; {len(trace)} events")
    pending = None
    peak_res, peak_alloc = reserved, allocated
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            reserved += e["size"]
            peak_res = max(peak_res, reserved)
            pending = f"S+ {e['size']} {reserved}"
        elif a == "segment_free":
            reserved -= e["size"]
            print(f"S- {e['size']} {reserved}")
        elif a == "alloc":
            allocated += e["size"]
            peak_alloc = max(peak_alloc, allocated)
            if pending:
                print(f"{pending} for {e['size']} at {frame(e)} (allocated {allocated})")
                pending = None
            if not only_segments:
                print(f"a {e['size']} {e['addr']} {allocated} {frame(e)}")
        elif a == "free_completed":
            allocated -= e["size"]
            if not only_segments:
                print(f"f {e['size']} {e['addr']} {allocated}")
        elif a == "oom" and not only_segments:
            print(f"oom {e.get('size')}")
    print(f"# peak reserved {peak_res} peak allocated {peak_alloc} (history only)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A recorded allocator history (`torch.cuda.memory._snapshot()` pickled, gzip or not, e.g. from
lab/device/snapshot_step.py) as lines that replay it through the planner's allocator model:

    python3 lab/cpu/snapshot_replay.py SNAP.pickle[.gz] > events.txt            # replay_trace's
    cargo run --release -p vramlab-core --example replay_trace -- events.txt [--cap GIB]
    python3 lab/cpu/snapshot_replay.py --compact SNAP.pickle[.gz] > fixture.txt  # a test's

First the state when recording began: each large segment alive then is made at its size and
filled with its live blocks at their offsets (and placeholders for its free gaps, released after
every segment is made), the live small blocks (their 2 MiB segments' layout is not kept); then
the history's allocations and frees in order, up to an `oom` event.

Default lines: `a SIZE ID` / `f ID` (ID a recorded address, or a placeholder's name).
`--compact` lines: `+SIZE` (an allocation; its number is the count of `+` lines before it),
`-N` (free allocation N), and comments for what PyTorch did before an allocation of the
history: `# segment SIZE` (cudaMalloc'd a segment for it), `# released SIZE` (a cached segment
went back: a cache flush), `# oom SIZE` (the request that failed).
"""
import sys

from snapshot_events import load

SMALL_SEGMENT = 2 << 20


def state_at_start(snap, trace):
    """(segments alive when recording began {address: (size, type)}, live blocks {address: size})."""
    made = {e["addr"] for e in trace if e["action"] == "segment_alloc"}
    seen, blocks = set(), {}
    for e in trace:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in seen:
            blocks.setdefault(e["addr"], e["size"])
    segments = {}
    for s in snap["segments"]:
        if s.get("device", 0) != 0:
            continue
        if s["address"] not in made:
            segments[s["address"]] = (s["total_size"], s["segment_type"])
        a = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and a not in seen:
                blocks.setdefault(a, b["size"])
            a += b["size"]
    for e in trace:
        if e["action"] == "segment_free" and e["addr"] not in made:
            segments.setdefault(e["addr"], (e["size"], "small" if e["size"] <= SMALL_SEGMENT else "large"))
    return segments, blocks


def lines(snap):
    """(op, size or id, comment) tuples: ("a", size, id), ("f", id), ("#", text)."""
    trace = snap["device_traces"][0]
    segments, blocks = state_at_start(snap, trace)
    out, gaps = [], []
    addrs = sorted(blocks)
    for sa in sorted(segments):
        size, kind = segments[sa]
        inside = [(a, blocks[a]) for a in addrs if sa <= a < sa + size]
        if kind == "small" or size <= SMALL_SEGMENT:
            out += [("a", sz, f"i{a}") for a, sz in inside]
            continue
        out += [("a", size, f"s{sa}"), ("f", f"s{sa}")]
        off = 0
        for a, sz in inside:
            if a - sa > off:
                out.append(("a", a - sa - off, f"g{sa}_{off}"))
                gaps.append(f"g{sa}_{off}")
            out.append(("a", sz, f"i{a}"))
            off = a - sa + sz
        if off < size:
            out.append(("a", size - off, f"g{sa}_{off}"))
            gaps.append(f"g{sa}_{off}")
    out += [("f", g) for g in gaps]
    out.append(("#", "history"))
    live, pending = set(), []
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            pending.append(f"segment {e['size']}")
        elif a == "segment_free":
            pending.append(f"released {e['size']}")
        elif a == "alloc":
            out += [("#", p) for p in pending]
            pending = []
            live.add(e["addr"])
            out.append(("a", e["size"], str(e["addr"])))
        elif a == "free_completed":
            out.append(("f", str(e["addr"]) if e["addr"] in live else f"i{e['addr']}"))
            live.discard(e["addr"])
        elif a == "oom":
            out += [("#", p) for p in pending]
            out.append(("#", f"oom {e.get('size')}"))
            break
    return out


def main():
    compact = "--compact" in sys.argv
    path = [a for a in sys.argv[1:] if not a.startswith("--")][0]
    if not compact:
        for op in lines(load(path)):
            print(f"# {op[1]}" if op[0] == "#" else " ".join(map(str, op)))
        return
    number, count = {}, 0
    for op in lines(load(path)):
        if op[0] == "#":
            print(f"# {op[1]}")
        elif op[0] == "a":
            number[op[2]] = count
            count += 1
            print(f"+{op[1]}")
        elif op[1] in number:
            print(f"-{number.pop(op[1])}")


if __name__ == "__main__":
    main()

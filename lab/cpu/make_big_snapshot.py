#!/usr/bin/env python3
"""Writes a large memory snapshot the way a user gets one, no GPU needed.

    python3 lab/cpu/make_big_snapshot.py OUT.pickle [--mb 150] [--steps N]
        [--template tests/data/doctor/real_all_gpt2.snapshot.pickle]

A user records a training loop with PyTorch's defaults --
`torch.cuda.memory._record_memory_history()` (stacks="all": C++ and Python frames,
context "all", max_entries unlimited) -- and writes `torch.cuda.memory._dump_snapshot()`,
which is `pickle.dump(torch.cuda.memory._snapshot(), f)` at the default protocol (4). The
file is dominated by trace entries. This script builds the same Python object graph that
PyTorch builds (`_cuda_memorySnapshot` in torch/csrc/cuda/memory_snapshot.cpp and
`py_symbolize` in torch/csrc/profiler/python/combined_traceback.cpp) and writes it with
`pickle.dump` too, so the opcodes, the memo and what is shared are Python's own:

* key strings (`action`, `addr`, ..., `frames`; `name`, `filename`, `line` of frames) and
  the action strings are one object each (pybind `py::str` made once per call): the file
  stores them once, every later use is a memo get;
* frames are deduplicated into one `{name, filename, line}` dict per distinct frame
  (`SymbolizedTracebacks::all_frames`), their strings made fresh per frame (CPython shares
  only '' and one-character strings);
* each gathered traceback (one per allocator call: `alloc`, `free_requested`,
  `segment_alloc`, `oom`) becomes a new list of those dicts; `free_completed` shares its
  `free_requested`'s list, an `alloc` that needed a new segment shares the
  `segment_alloc`'s, and a live block shares its `alloc`'s (the same `CapturedTraceback`);
* `compile_context` is a fresh "N/A" string per entry, `user_metadata` the shared ''.

These properties were checked on the H200 fixtures in tests/data/doctor/real_all_*.
The stacks themselves are the template's (a real GPT-2 run recorded on the H200 with the
default settings), cycled over a training loop: a persistent part (weights, gradients,
AdamW states) made in the first step, then per step a forward that stacks activations,
a backward that frees them in reverse while making gradient temporaries, and an
optimizer step; an out-of-memory error ends the trace. Large requests are multiples of
2 MiB and small ones of 512 B inside 2 MiB small segments, so the replay's rounding and
splitting rules are exercised without ambiguity. The output is deterministic (no
randomness): the same arguments give the same bytes.
"""
import argparse
import os
import pickle
import sys

MiB = 1 << 20
BASE = 0x7F4000000000


def fresh(s):
    """A new str object equal to `s` (what pybind makes from a std::string)."""
    return (s + ".")[:-1]


class Frames:
    """`py_symbolize`: one dict per distinct frame, one new list per traceback."""

    def __init__(self):
        self.name_s, self.filename_s, self.line_s = fresh("name"), fresh("filename"), fresh("line")
        self.dicts = {}

    def frame(self, f):
        d = self.dicts.get(f)
        if d is None:
            name, filename, line = f
            d = {self.name_s: fresh(name), self.filename_s: fresh(filename), self.line_s: line}
            self.dicts[f] = d
        return d

    def traceback(self, stack):
        return [self.frame(f) for f in stack]


def harvest(template):
    """Distinct alloc, free and segment stacks of a real snapshot, in trace order."""
    with open(template, "rb") as f:
        snap = pickle.load(f)
    out = {"alloc": [], "free_requested": [], "segment_alloc": [], "oom": []}
    seen = {k: set() for k in out}
    for trace in snap["device_traces"]:
        for e in trace:
            a = e["action"]
            if a not in out:
                continue
            st = tuple((fr["name"], fr["filename"], fr["line"]) for fr in e.get("frames", []))
            if st and st not in seen[a]:
                seen[a].add(st)
                out[a].append(st)
    for k, v in out.items():
        if not v:
            sys.exit(f"{template}: no {k} stacks to use as a template")
    return out, snap.get("allocator_settings", {})


class Gen:
    def __init__(self, stacks, settings):
        self.stacks = stacks
        self.settings = settings
        self.fr = Frames()
        keys = ["action", "addr", "size", "stream", "time_us", "compile_context",
                "user_metadata", "frames", "device_free"]
        self.k = {k: fresh(k) for k in keys}
        self.act = {a: fresh(a) for a in ["alloc", "free_requested", "free_completed",
                                          "segment_alloc", "segment_free", "oom"]}
        self.empty = ""
        self.trace = []
        self.time = 1796405192655705
        self.segments = []  # [addr, size, is_small, frames list, pool_top]
        self.live = {}  # addr -> (size, requested, frames list)
        self.next_addr = BASE
        self.site = 0

    def entry(self, action, addr, size, frames, oom_free=None):
        self.time += 7
        k = self.k
        e = {k["action"]: self.act[action]}
        if action == "oom":
            e[k["device_free"]] = oom_free
        else:
            e[k["addr"]] = addr
        e[k["size"]] = size
        e[k["stream"]] = 0
        e[k["time_us"]] = self.time
        e[k["compile_context"]] = fresh("N/A")
        e[k["user_metadata"]] = self.empty
        e[k["frames"]] = frames
        self.trace.append(e)

    def stack(self, kind):
        v = self.stacks[kind]
        self.site += 1
        return self.fr.traceback(v[(self.site * 7919) % len(v)])

    def segment(self, size, small):
        frames = self.stack("segment_alloc")
        addr = self.next_addr
        self.next_addr += size + 2 * MiB
        self.entry("segment_alloc", addr, size, frames)
        seg = {"addr": addr, "size": size, "small": small, "frames": frames, "top": addr}
        self.segments.append(seg)
        return seg, frames

    def alloc(self, seg, size, requested=None, frames=None):
        requested = size if requested is None else requested
        frames = frames if frames is not None else self.stack("alloc")
        addr = seg["top"]
        assert addr + size <= seg["addr"] + seg["size"], "pool too small"
        seg["top"] += size
        self.entry("alloc", addr, requested, frames)
        self.live[addr] = (size, requested, frames)
        return addr

    def free(self, seg, addr):
        size, requested, _ = self.live.pop(addr)
        assert addr + size == seg["top"], "frees are LIFO within a pool"
        seg["top"] = addr
        frames = self.stack("free_requested")
        self.entry("free_requested", addr, requested, frames)
        self.entry("free_completed", addr, requested, frames)

    def run(self, steps, layers):
        # Persistent state: weights, gradients and AdamW's two moments per layer.
        weights, wf = self.segment(layers * 4 * 8 * MiB, False)
        first = True
        for _ in range(layers * 4):
            self.alloc(weights, 8 * MiB, frames=wf if first else None)
            first = False
        acts, af = self.segment(layers * 6 * 12 * MiB + 64 * MiB, False)
        small, sf = self.segment(2 * MiB, True)
        first_a = first_s = True
        for step in range(steps):
            live = []
            for layer in range(layers):
                for j in range(6):
                    size = (2 + 2 * ((layer + j + step) % 5)) * MiB
                    live.append(("a", self.alloc(acts, size, size - 1000 * (j + 1),
                                                 frames=af if first_a else None)))
                    first_a = False
                for j in range(3):
                    size = 512 * (1 + (layer * 3 + j) % 40)
                    live.append(("s", self.alloc(small, size, size - 17 * j,
                                                 frames=sf if first_s else None)))
                    first_s = False
            # Backward: activations go in reverse, a gradient temporary per layer.
            for pool, addr in reversed(live):
                seg = acts if pool == "a" else small
                if pool == "a" and addr % (3 * MiB) == 0:
                    t = self.alloc(acts, 4 * MiB)
                    self.free(acts, t)
                self.free(seg, addr)
            # Optimizer step: a temporary per layer.
            for _ in range(layers):
                t = self.alloc(acts, 8 * MiB)
                self.free(acts, t)
        self.entry("oom", 0, 80 << 30, self.stack("oom"), oom_free=3 << 30)

    def snapshot(self):
        k = self.k
        segs = []
        for s in self.segments:
            blocks = []
            addr = s["addr"]
            allocated = 0
            for a in sorted(x for x in self.live if s["addr"] <= x < s["addr"] + s["size"]):
                size, req, frames = self.live[a]
                if a > addr:
                    blocks.append({"address": addr, "size": a - addr, "requested_size": 0,
                                   "state": "inactive", k["frames"]: []})
                blocks.append({"address": a, "size": size, "requested_size": req,
                               "state": "active_allocated", k["frames"]: frames})
                allocated += size
                addr = a + size
            end = s["addr"] + s["size"]
            if addr < end:
                blocks.append({"address": addr, "size": end - addr, "requested_size": 0,
                               "state": "inactive", k["frames"]: []})
            segs.append({
                "device": 0, "address": s["addr"], "total_size": s["size"],
                "allocated_size": allocated, "active_size": allocated,
                "requested_size": sum(b["requested_size"] for b in blocks),
                k["stream"]: 0, "segment_type": "small" if s["small"] else "large",
                "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks,
                k["frames"]: s["frames"],
            })
        return {"segments": segs, "device_traces": [self.trace],
                "allocator_settings": self.settings, "external_annotations": []}


def build(stacks, settings, steps, layers):
    g = Gen(stacks, settings)
    g.run(steps, layers)
    return g.snapshot(), len(g.trace)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=150.0, help="target size in MB (10^6 bytes)")
    ap.add_argument("--steps", type=int, help="training steps (overrides --mb)")
    ap.add_argument("--layers", type=int, default=24)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--template", default=os.path.join(
        here, "..", "..", "tests", "data", "doctor", "real_all_gpt2.snapshot.pickle"))
    a = ap.parse_args()
    stacks, settings = harvest(a.template)
    steps = a.steps
    if steps is None:
        # Size is affine in the step count: measure two small runs.
        s1 = len(pickle.dumps(build(stacks, settings, 1, a.layers)[0]))
        s3 = len(pickle.dumps(build(stacks, settings, 3, a.layers)[0]))
        per = (s3 - s1) / 2
        steps = max(1, round((a.mb * 1e6 - (s1 - per)) / per))
    snap, entries = build(stacks, settings, steps, a.layers)
    with open(a.out, "wb") as f:
        pickle.dump(snap, f)  # torch.cuda.memory._dump_snapshot: the default protocol
    size = os.path.getsize(a.out)
    print(f"{a.out}: {size / 1e6:.1f} MB, {steps} steps, {entries} trace entries, "
          f"pickle protocol {pickle.DEFAULT_PROTOCOL}")


if __name__ == "__main__":
    main()

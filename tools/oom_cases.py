#!/usr/bin/env python3
"""Real "CUDA out of memory" cases for `vramlab doctor` (run on the GPU machine).

    python3 tools/oom_cases.py OUTDIR            # every case, each in a fresh process
    python3 tools/oom_cases.py OUTDIR --case NAME

Cases:
  capacity        an MLP training step whose batch does not fit the card
  fragmentation   blocks carved out of one cached segment, every other one freed, the rest of
                  the card filled, then a request larger than any hole
  fragmentation_expandable   the same under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  outside         memory taken with the CUDA driver's cuMemAlloc (outside the caching
                  allocator) in the same process, then a training step
  process_cap     torch.cuda.set_per_process_memory_fraction(0.25), then a training step
  other_process   a second process holds most of the card, then a training step
  no_grad_eval    validation without torch.no_grad(): outputs kept in a list keep every graph
  normal          a normal training step (no OOM)

For each case OUTDIR gets NAME.message.txt (the traceback and the exception text, empty for
`normal`), NAME.snapshot.pickle (torch.cuda.memory._dump_snapshot's format, frames trimmed
to the innermost few) and one line of OUTDIR/cases.jsonl with torch.cuda.max_memory_allocated
and max_memory_reserved read in the same process, and the device/driver/torch versions.
"""
import argparse
import ctypes
import json
import os
import pickle
import subprocess
import sys
import time
import traceback

CASES = [
    "capacity",
    "fragmentation",
    "fragmentation_expandable",
    "outside",
    "process_cap",
    "other_process",
    "no_grad_eval",
    "normal",
]
MAX_FRAMES = 4
GiB = 1 << 30
MiB = 1 << 20


def mlp(torch, width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, device="cuda"), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def train_step(torch, model, batch, width):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def case_capacity(torch):
    model = mlp(torch, 8192, 48)
    train_step(torch, model, 131072, 8192)


def case_fragmentation(torch):
    big = torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
    del big  # one cached 8 GiB segment
    # 64 x 128 MiB fill the whole cached segment: no free tail is left behind them
    blocks = [torch.empty(128 * MiB, dtype=torch.uint8, device="cuda") for _ in range(64)]
    for i in range(0, len(blocks), 2):
        blocks[i] = None  # 32 holes of 128 MiB, each between two live blocks
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(free - 64 * MiB, dtype=torch.uint8, device="cuda")  # noqa: F841
    torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # larger than any hole


def case_fragmentation_expandable(torch):
    case_fragmentation(torch)


def case_outside(torch):
    torch.zeros(1, device="cuda")  # creates the primary context, current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64(0)
    free, _ = torch.cuda.mem_get_info()
    size = free - 24 * GiB
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
    if rc != 0:
        raise RuntimeError(f"cuMemAlloc_v2 failed: {rc}")
    print(f"outside: cuMemAlloc_v2 took {size / GiB:.2f} GiB", file=sys.stderr)
    model = mlp(torch, 8192, 24)
    train_step(torch, model, 65536, 8192)


def case_process_cap(torch):
    torch.cuda.set_per_process_memory_fraction(0.25)
    model = mlp(torch, 8192, 24)
    train_step(torch, model, 65536, 8192)


def case_other_process(torch):
    free, _ = torch.cuda.mem_get_info()
    hold = free - 24 * GiB
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time,torch;"
         f"x=torch.empty({hold},dtype=torch.uint8,device='cuda');"
         "print('ready',flush=True);time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if "ready" not in line:
            raise RuntimeError("the holder process did not start")
        model = mlp(torch, 8192, 24)
        train_step(torch, model, 65536, 8192)
    finally:
        child.kill()
        child.wait()


def validate(torch, model, batches, width):
    outputs = []
    for _ in range(batches):
        x = torch.randn(65536, width, device="cuda")
        outputs.append(model(x))  # no torch.no_grad(): each output keeps its graph
    return outputs


def case_no_grad_eval(torch):
    model = mlp(torch, 8192, 16)
    model.eval()
    validate(torch, model, 64, 8192)


def case_normal(torch):
    model = mlp(torch, 4096, 8)
    for _ in range(2):
        train_step(torch, model, 8192, 4096)


def trim(snapshot):
    def cut(frames):
        return frames[:MAX_FRAMES]

    for seg in snapshot.get("segments", []):
        seg["frames"] = cut(seg.get("frames", []))
        for b in seg.get("blocks", []):
            b["frames"] = cut(b.get("frames", []))
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            e["frames"] = cut(e.get("frames", []))
    return snapshot


def versions(torch):
    p = torch.cuda.get_device_properties(0)
    drv = ""
    try:
        drv = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return {"device": p.name, "total_memory": p.total_memory, "driver": drv,
            "torch": torch.__version__, "cuda": torch.version.cuda}


def run_case(name, outdir):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    message = ""
    t0 = time.time()
    try:
        globals()["case_" + name](torch)
    except torch.OutOfMemoryError:
        message = traceback.format_exc()
    snap = trim(torch.cuda.memory._snapshot())
    path = os.path.join(outdir, f"{name}.snapshot.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f)  # what torch.cuda.memory._dump_snapshot does
    with open(os.path.join(outdir, f"{name}.message.txt"), "w") as f:
        f.write(message)
    row = {
        "case": name,
        "oom": bool(message),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_allocated_at_end": torch.cuda.memory_allocated(),
        "memory_reserved_at_end": torch.cuda.memory_reserved(),
        "snapshot_bytes": os.path.getsize(path),
        "seconds": round(time.time() - t0, 2),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        **versions(torch),
    }
    with open(os.path.join(outdir, "cases.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--case", choices=CASES)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if a.case:
        run_case(a.case, a.outdir)
        return
    for name in CASES:
        env = dict(os.environ)
        if name.endswith("_expandable"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        r = subprocess.run([sys.executable, os.path.abspath(__file__), a.outdir, "--case", name],
                           timeout=240, env=env)
        if r.returncode != 0:
            print(f"case {name}: exit {r.returncode}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Real "CUDA out of memory" cases for `vramlab doctor` (run on the GPU machine).

    python3 lab/device/oom_cases.py OUTDIR            # every case, each in a fresh process
    python3 lab/device/oom_cases.py OUTDIR --case NAME
    python3 lab/device/oom_cases.py OUTDIR --set stacks [--budget SECONDS]

`--set stacks` records the cases below with PyTorch's default history settings, as a user
records them: `torch.cuda.memory._record_memory_history()` (stacks="all": C++ frames
interleaved with the Python ones) for names starting `all_`, and stacks="python" for
names starting `py_`; the snapshot is written by `torch.cuda.memory._dump_snapshot`, frames
untrimmed. Cases run in priority order until the budget is spent:
  eval_unet      a UNet-like conv net's validation loop without torch.no_grad(): the losses
                 kept in a list keep every batch's graph (the seed articles' UNet++ story)
  gpt2           a 4-layer GPT-2 (transformers, random weights) training step at batch 8, then
                 at batch 256, whose logits do not fit
  frag_cap       a 7.5 GiB cached segment carved into 128 MiB blocks, every other one freed,
                 under an 8 GiB set_per_process_memory_fraction cap, then 1 GiB: an
                 unfragmented pool would have held it under the cap
  capacity       an MLP training step whose batch does not fit the card
  optimizer      AdamW's first step under a 6 GiB cap: its state does not fit
  fragmentation  the card filled around a fragmented 8 GiB segment (no cap), then 256 MiB
  outside        cuMemAlloc (outside the caching allocator) takes all but 24 GiB
  compile        a torch.compile'd MLP whose batch does not fit a 4 GiB cap
  ddp            DistributedDataParallel (one rank, NCCL) whose batch does not fit a 6 GiB cap

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
STACKS_CASES = [
    "all_eval_unet",
    "all_gpt2",
    "all_frag_cap",
    "all_capacity",
    "all_optimizer",
    "py_eval_unet",
    "py_frag_cap",
    "all_fragmentation",
    "all_outside",
    "all_compile",
    "py_optimizer",
    "all_ddp",
    "py_capacity",
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


def cap(torch, nbytes):
    torch.cuda.set_per_process_memory_fraction(
        nbytes / torch.cuda.get_device_properties(0).total_memory)


def unet(torch, ch=32, depth=3):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.c2 = nn.Conv2d(cout, cout, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.c2(torch.relu(self.c1(x))))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            chans = [ch * 2 ** i for i in range(depth)]
            self.down = nn.ModuleList()
            cin = 3
            for c in chans:
                self.down.append(Block(cin, c))
                cin = c
            self.mid = Block(cin, cin * 2)
            cin *= 2
            self.upconv = nn.ModuleList()
            self.up = nn.ModuleList()
            for c in reversed(chans):
                self.upconv.append(nn.ConvTranspose2d(cin, c, 2, stride=2))
                self.up.append(Block(2 * c, c))
                cin = c
            self.head = nn.Conv2d(cin, 1, 1)

        def forward(self, x):
            skips = []
            for b in self.down:
                x = b(x)
                skips.append(x)
                x = torch.nn.functional.max_pool2d(x, 2)
            x = self.mid(x)
            for uc, b, sk in zip(self.upconv, self.up, reversed(skips)):
                x = b(torch.cat([uc(x), sk], 1))
            return self.head(x)

    return UNet().cuda()


def seg_batch(torch, n, size):
    x = torch.randn(n, 3, size, size, device="cuda")
    y = (torch.rand(n, 1, size, size, device="cuda") > 0.5).float()
    return x, y


def train_unet_step(torch, model, opt, size):
    model.train()
    x, y = seg_batch(torch, 4, size)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def validate_unet(torch, model, batches, size):
    model.eval()
    losses = []
    for _ in range(batches):
        x, y = seg_batch(torch, 16, size)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        losses.append(loss)  # no torch.no_grad(), and the loss tensor kept: every graph stays
    return torch.stack(losses).mean().item()


def case_eval_unet(torch):
    model = unet(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_unet_step(torch, model, opt, 512)
    validate_unet(torch, model, 400, 512)


def case_gpt2(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=4)).cuda()  # random weights, no download
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in (8, 256):  # one step that fits, then one whose logits do not
        ids = torch.randint(0, 50257, (batch, 1024), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def case_frag_cap(torch):
    cap(torch, 8 * GiB)
    big = torch.empty(7 * GiB + 512 * MiB, dtype=torch.uint8, device="cuda")
    del big  # one cached 7.5 GiB segment
    blocks = [torch.empty(128 * MiB, dtype=torch.uint8, device="cuda") for _ in range(60)]
    for i in range(0, len(blocks), 2):
        blocks[i] = None  # 30 holes of 128 MiB between live blocks: 3.75 GiB cached, unused
    torch.empty(GiB, dtype=torch.uint8, device="cuda")  # 7.5 + 1 GiB > the cap


def case_optimizer(torch):
    cap(torch, 6 * GiB)
    model = mlp(torch, 4096, 28)  # 470 M parameters: 1.75 GiB, as much again for gradients
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 4096, device="cuda")
    model(x).float().pow(2).mean().backward()
    opt.step()  # exp_avg and exp_avg_sq: 3.5 GiB more


def compiled_step(torch, model, x, backend):
    cmodel = torch.compile(model, backend=backend)
    cmodel(x).float().pow(2).mean().backward()


def case_compile(torch):
    cap(torch, 4 * GiB)
    model = mlp(torch, 4096, 4)  # 256 MiB of weights
    x = torch.randn(65536, 4096, device="cuda")  # 1 GiB; each saved activation as much
    try:
        compiled_step(torch, model, x, "inductor")
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- no compiler for Triton's launcher, say
        print(f"compile: inductor failed ({type(e).__name__}: {e}); aot_eager instead",
              file=sys.stderr, flush=True)
        torch._dynamo.reset()
        compiled_step(torch, model, x, "aot_eager")


def case_ddp(torch):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        cap(torch, 6 * GiB)
        model = torch.nn.parallel.DistributedDataParallel(mlp(torch, 4096, 16), device_ids=[0])
        train_step(torch, model, 131072, 4096)
    finally:
        dist.destroy_process_group()


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
    stacks_set = name.startswith(("all_", "py_"))
    if name.startswith("all_"):
        torch.cuda.memory._record_memory_history()  # the defaults: stacks="all"
    elif name.startswith("py_"):
        torch.cuda.memory._record_memory_history(stacks="python")
    else:
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    func = name.split("_", 1)[1] if stacks_set else name
    message = ""
    error = ""
    t0 = time.time()
    try:
        globals()["case_" + func](torch)
    except torch.OutOfMemoryError:
        message = traceback.format_exc()
    except Exception:  # noqa: BLE001 -- recorded, the snapshot is still written
        error = traceback.format_exc()
        print(f"case {name}: {error}", file=sys.stderr)
    t1 = time.time()
    path = os.path.join(outdir, f"{name}.snapshot.pickle")
    if stacks_set:
        torch.cuda.memory._dump_snapshot(path)
    else:
        snap = trim(torch.cuda.memory._snapshot())
        with open(path, "wb") as f:
            pickle.dump(snap, f)  # what torch.cuda.memory._dump_snapshot does
    with open(os.path.join(outdir, f"{name}.message.txt"), "w") as f:
        f.write(message)
    row = {
        "case": name,
        "stacks": "all" if name.startswith("all_") else "python",
        "error": error.strip().splitlines()[-1] if error else "",
        "dump_seconds": round(time.time() - t1, 2),
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
    ap.add_argument("--case", choices=CASES + STACKS_CASES)
    ap.add_argument("--set", choices=["v1", "stacks"], default="v1")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for the whole set")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if a.case:
        run_case(a.case, a.outdir)
        return
    t0 = time.time()
    for name in STACKS_CASES if a.set == "stacks" else CASES:
        left = a.budget - (time.time() - t0)
        if left < 15:
            print(f"case {name}: skipped (budget spent)", file=sys.stderr, flush=True)
            continue
        env = dict(os.environ)
        if name.endswith("_expandable"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        try:
            r = subprocess.run(
                [sys.executable, os.path.abspath(__file__), a.outdir, "--case", name],
                timeout=min(240, left), env=env)
        except subprocess.TimeoutExpired:
            print(f"case {name}: timed out", file=sys.stderr, flush=True)
            continue
        if r.returncode != 0:
            print(f"case {name}: exit {r.returncode}", file=sys.stderr)


if __name__ == "__main__":
    main()

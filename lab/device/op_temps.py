#!/usr/bin/env python3
"""What fake tensors cannot see: the memory each ATen op allocates for itself on a real GPU.

Runs the training step of runners/capture.py (same model factories, same loop) for real on
CUDA, and during the third (measured) step wraps every ATen op in a TorchDispatchMode that
reads the caching allocator around it:

  before  = torch.cuda.memory_allocated()        (peak statistics reset just before the op)
  peak    = torch.cuda.max_memory_allocated()     (highest point while the op ran)
  new     = bytes of the op's output storages that did not exist before (512-byte rounded)
  hidden  = peak - before - new                   (> 0: the op's own temporaries / workspace)

One JSON line per op with hidden > 0: phase, op@module, hidden, new, the tensor arguments'
shapes and dtypes. The first line is a summary (model, batch, peaks). Diagnostic only: the
planner's rules for kernel temporaries are derived from these lines.

  python3 op_temps.py --timm deit_small_patch16_224 --batch 32 > deit_b32.jsonl
(accepts capture.py's model and settings flags)
"""

import json
import sys

import capture as C
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def rnd(n):
    return (n + 511) // 512 * 512


class Probe(TorchDispatchMode):
    def __init__(self, out):
        super().__init__()
        self.out = out
        self.phase = "setup"
        self.module = []
        self.n_ops = 0
        self.events = []  # train_steps reads len(tr.events)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        seen = set()
        shapes = []
        for t in flat_in:
            if isinstance(t, torch.Tensor):
                try:
                    seen.add(t.untyped_storage().data_ptr())
                except Exception:
                    pass
                shapes.append([list(t.shape), str(t.dtype).replace("torch.", "")])
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = func(*args, **kwargs)
        peak = torch.cuda.max_memory_allocated()
        after = torch.cuda.memory_allocated()
        new = 0
        flat_out, _ = tree_flatten(out)
        for t in flat_out:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                st = t.untyped_storage()
                if st.data_ptr() not in seen and st.nbytes() > 0:
                    seen.add(st.data_ptr())
                    new += rnd(st.nbytes())
        hidden = peak - before - new
        self.n_ops += 1
        if hidden > 0:
            name = str(func.overloadpacket.__name__)
            where = self.module[-1] if (self.module and self.phase == "forward") else ""
            self.out.write(json.dumps({
                "phase": self.phase, "op": f"{name}@{where}" if where else name,
                "hidden": int(hidden), "new": int(new), "kept": int(after - before),
                "args": shapes[:6],
            }) + "\n")
        return out


def main():
    ap = C.argparse.ArgumentParser(description="per-op hidden CUDA allocations")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--timm")
    src.add_argument("--torchvision")
    src.add_argument("--hf")
    src.add_argument("--module")
    ap.add_argument("--input")
    ap.add_argument("--image", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--precision", default="amp-bf16")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--loop", default="plain")
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--batch", type=int, required=True)
    args = ap.parse_args()
    factory, kind, size, name = C.build_factory(args)
    if args.hf and args.vocab == 1000:
        with open(args.hf) as fh:
            args.vocab = int(json.load(fh).get("vocab_size", 1000))
    dev = torch.device("cuda")
    with torch.device(dev):
        model = factory()
    if args.precision == "bf16":
        model.to(torch.bfloat16)
    if args.checkpointing:
        C.enable_checkpointing(model)
    model.train()
    probe_shape = C.probe_output(model, args, kind, size, dev)
    opt = C.make_optimizer(args.optimizer, [p for p in model.parameters() if p.requires_grad])
    C.train_steps(model, opt, args, kind, size, args.batch, dev, probe_shape, None, 2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    C.train_steps(model, opt, args, kind, size, args.batch, dev, probe_shape, None, 1)
    torch.cuda.synchronize()
    peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    lines = []

    class W:
        def write(self, s):
            lines.append(s)

    pr = Probe(W())
    hooks = C.module_hooks(model, pr)
    with pr:
        # train_steps sets tr.phase on its tracker argument; the probe has the same field
        C.train_steps(model, opt, args, kind, size, args.batch, dev, probe_shape, pr, 1)
    for h in hooks:
        h.remove()
    torch.cuda.synchronize()
    print(json.dumps({"model": name, "batch": args.batch, "precision": args.precision,
                      "loop": args.loop, "checkpointing": args.checkpointing,
                      "start": int(start), "peak_allocated": int(peak), "peak_reserved": int(reserved),
                      "ops": pr.n_ops, "ops_with_hidden": len(lines),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}))
    sys.stdout.write("".join(lines))


if __name__ == "__main__":
    main()

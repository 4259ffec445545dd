#!/usr/bin/env python3
"""vramlab capture: record the tensor allocations of one training step of any PyTorch model.

Runs the training step vramlab plans (the loop of crates/device/runners/torch_runner.py) on fake tensors
(torch._subclasses.FakeTensorMode: no GPU, no weights, no data) and records every storage
allocation (raw bytes, dtype, the op and module that made it) and every free (a weakref
finalizer on the storage, as torch/distributed/_tools/mem_tracker.py does), at several batch
sizes. vramlab (the Rust side) fits each allocation as per_sample x batch + fixed and replays
the events through its caching-allocator model: the allocator's rounding is NOT applied here.

  model = factory()                      # built under the fake mode, on the fake device
  if precision == "bf16": model.to(torch.bfloat16)
  if checkpointing: every block-like child list wrapped in torch.utils.checkpoint
  opt = AdamW(lr=1e-4) | Adam(lr=1e-4) | SGD(lr=1e-3)  (foreach, as on CUDA)
  for step in (warm-up, measured):
      opt.zero_grad(set_to_none=True)
      x, y = batch
      with torch.autocast("cuda", dtype, enabled=amp):
          out = model(x); loss = loss_fn(out, y)        # loop "trainer": the output dies here
      loss.backward(); del out, loss, x, y
      opt.step()

Output: a JSON file, {"format": "vramlab-graph", "version": 1, ...} (see
crates/core/src/model/captured.rs for every field).

Exit codes: 0 ok; 2 usage; 3 torch (or timm/transformers) missing; 4 the model factory failed;
5 an op does not run under fake tensors (data-dependent shape; try --real-cpu at a small
batch); 6 an allocation does not scale affinely with the batch; 7 measurement (--measure) failed.

--measure: also run the same step for real on CUDA at each batch and write the measured
peaks (max_memory_allocated / max_memory_reserved) as JSON lines to --measure-out.

Speed (issue 32; docs/speed.md): the values of the weights never matter (every parameter and
buffer gets a fresh fake storage), so a model built on the CPU has its parameters on the meta
device (no weight initialisation), and the fake-tensor attempt that fails for it is made once;
the garbage collector walks only what each capture makes (gc.freeze); with two CPUs a forked
child captures the last half of the batches at the same time; the script's process ends without
the interpreter's teardown (`exit_now`). The graph is the same byte for byte
(lab/cpu/capture_equal.py, python/tests/test_capture_golden.py).
"""

import argparse
import copy
import gc
import importlib.util
import json
import os
import pickle
import signal
import sys
import tempfile
import time
import warnings
import weakref

FORMAT_VERSION = 1


class CaptureError(Exception):
    """A capture that cannot be made: the exit code (see above) and the message. The script
    prints it and exits with the code; `vramlab.plan_module` (in-process) raises it."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code
        self.msg = msg


def fail(code, msg):
    raise CaptureError(code, msg)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
except ImportError as e:  # pragma: no cover
    print(f"capture: error: PyTorch is not importable from {sys.executable} ({e}); install torch "
          f"or pass --python", file=sys.stderr)
    sys.exit(3)

# The sibling modules (cuda_autocast, cuda_composites) by name when they do not come from
# this file's folder: `vramlab.plan_module` runs the copies embedded in the package.
SIBLINGS = {}


def sibling(name):
    """The sibling module `name`: given in SIBLINGS, else imported from this file's folder."""
    if name in SIBLINGS:
        return SIBLINGS[name]
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)

PHASE_CODES = {"setup": "s", "zero_grad": "z", "forward": "f", "backward": "b", "optimizer": "o"}


# --------------------------------------------------------------------------- models
def build_factory(args):
    """(factory, kind, size, description); kind is 'image' or 'tokens'."""
    if args.timm:
        try:
            import timm
        except ImportError as e:
            fail(3, f"--timm needs the timm package ({e})")
        img = args.image or 224
        name = args.timm

        def f():
            kw = {}
            try:
                return timm.create_model(name, pretrained=False, img_size=img, **kw)
            except TypeError:
                return timm.create_model(name, pretrained=False, **kw)

        return f, "image", img, f"timm:{name}"
    if args.torchvision:
        try:
            import torchvision
        except ImportError as e:
            fail(3, f"--torchvision needs the torchvision package ({e})")
        name = args.torchvision
        img = args.image or 224

        def f():
            return torchvision.models.get_model(name, weights=None, weights_backbone=None) \
                if "segmentation" in torchvision.models.get_model_builder(name).__module__ \
                else torchvision.models.get_model(name, weights=None)

        return f, "image", img, f"torchvision:{name}"
    if args.hf:
        try:
            from transformers import AutoConfig, AutoModelForCausalLM
        except ImportError as e:
            fail(3, f"--hf needs the transformers package ({e})")
        with open(args.hf) as fh:
            cfg = json.load(fh)
        mt = cfg.pop("model_type", None)
        if mt is None:
            fail(2, f"--hf {args.hf}: no model_type in the config")
        for k in ("architectures", "transformers_version", "torch_dtype", "dtype", "auto_map"):
            cfg.pop(k, None)
        seq = args.seq or 512

        def f():
            c = AutoConfig.for_model(mt, **cfg)
            c._attn_implementation = "sdpa"
            return AutoModelForCausalLM.from_config(c)

        return f, "tokens", seq, f"hf:{os.path.basename(args.hf)}"
    if args.module:
        path, _, fac = args.module.rpartition(":")
        if not path or not fac:
            fail(2, f"--module {args.module}: expected path/to/file.py:factory")
        spec = importlib.util.spec_from_file_location("vramlab_user_module", path)
        if spec is None or spec.loader is None:
            fail(4, f"--module: cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            fail(4, f"--module: importing {path} failed: {type(e).__name__}: {e}")
        factory = getattr(mod, fac, None)
        if factory is None:
            names = [n for n in dir(mod) if callable(getattr(mod, n)) and not n.startswith("_")]
            fail(4, f"--module: {path} has no `{fac}` (callables: {', '.join(names[:12])})")
        kind = "tokens" if args.seq else "image"
        size = args.seq or args.image or 224
        return factory, kind, size, f"module:{os.path.basename(path)}:{fac}"
    fail(2, "one of --timm, --torchvision, --hf, --module is required")


def input_shape(args, kind, size, batch):
    if kind == "given":
        return (batch, *args.sample_shape)
    if args.input:
        dims = [int(d) for d in args.input.lower().replace("x", ",").split(",") if d.strip()]
        return (batch, *dims)
    if kind == "tokens":
        return (batch, size)
    return (batch, 3, size, size)


def loss_of(out):
    """The loss a model's output carries (a Hugging Face model given `labels`), or None."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    return loss


def logits_of(out):
    if isinstance(out, dict) or hasattr(out, "keys"):
        for k in ("out", "logits"):
            if k in out:
                return out[k]
        return next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


# --------------------------------------------------------------------------- checkpointing
class _Ckpt(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *a, **k):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *a, use_reentrant=False, **k)


def enable_checkpointing(model):
    """Wraps the blocks: HF models through gradient_checkpointing_enable, timm models through
    their own set_grad_checkpointing (what a timm user calls; it checkpoints where the model's
    author says blocks may be recomputed — wrapping arbitrary children breaks models whose
    blocks modify their input in place, NFNet's), others: the children of the longest
    nn.Sequential/ModuleList of repeated blocks."""
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return 1
    if hasattr(model, "set_grad_checkpointing") and hasattr(model, "default_cfg"):
        model.set_grad_checkpointing(True)
        return 1
    best = None
    for name, m in model.named_modules():
        if isinstance(m, (nn.Sequential, nn.ModuleList)) and len(m) >= 2:
            if best is None or len(m) > len(best[1]):
                best = (name, m)
    if best is None:
        return 0
    for i in range(len(best[1])):
        best[1][i] = _Ckpt(best[1][i])
    return len(best[1])


# --------------------------------------------------------------------------- kernel calls
# Ops whose CUDA kernels allocate temporaries of their own through the caching allocator,
# which fake tensors cannot see (measured per op on the H200 with lab/device/op_temps.py). The
# capture records the shapes the planner's rules need (crates/core/src/plan/kernel_temps.rs).
REDUCTIONS = {"sum", "mean", "linalg_vector_norm", "norm", "amax", "amin"}
KERNEL_OPS = REDUCTIONS | {"roll", "_softmax_backward_data", "native_layer_norm",
                           "native_layer_norm_backward",
                           "_scaled_dot_product_cudnn_attention_backward",
                           "_scaled_dot_product_flash_attention_backward",
                           "_scaled_dot_product_efficient_attention_backward"}


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _reduced_dims(name, x, args, kwargs):
    nd = x.dim()
    if name == "linalg_vector_norm":
        dims = args[2] if len(args) > 2 else kwargs.get("dim")
    else:
        dims = args[1] if len(args) > 1 and not isinstance(args[1], torch.dtype) else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(nd))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({int(d) % max(nd, 1) for d in dims})


def kernel_features(name, args, kwargs, out):
    """The scalars the planner's rule for `name` needs (sizes at this batch), or None."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None:
        return None
    es = x.element_size()
    if name in REDUCTIONS:
        red = _reduced_dims(name, x, args, kwargs)
        shape = list(x.shape)
        ins = _numel([shape[d] for d in red])
        outs = _numel(shape) // max(ins, 1)
        if outs * ins == 0:
            return None
        # the fastest-moving (stride 1) dimension of the input: reduced or not
        strides = list(x.stride())
        fast = min((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: strides[d], default=0)
        # output vectorisation (Reduce.cuh get_output_vec_size): 4, 2 or 1 dividing the
        # fastest kept dimension's size and the other strides
        vec = 4
        kept = [d for d in range(len(shape)) if d not in red and shape[d] > 1]
        nums = [shape[fast]] + [strides[d] for d in range(len(shape)) if d != fast and shape[d] > 1]
        for v in nums:
            while vec > 1 and v % vec:
                vec //= 2
        return {"outs": outs, "ins": ins, "fast_reduced": fast in red, "vec": vec,
                "reduce_dims": len(red), "kept_dims": len(kept)}
    if name == "roll" or name == "_softmax_backward_data":
        return {"bytes": x.numel() * es}
    if name == "native_layer_norm":
        return {"bytes": 0 if x.is_contiguous() else x.numel() * es}
    if name == "native_layer_norm_backward":
        inp = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else x
        copies = (0 if x.is_contiguous() else x.numel() * es) + \
                 (0 if inp.is_contiguous() else inp.numel() * inp.element_size())
        return {"bytes": copies}
    if name.startswith("_scaled_dot_product_") and x.dim() == 4:
        q = args[1] if isinstance(args[1], torch.Tensor) else x  # (grad_out, query, ...)
        b, h, s, d = (int(v) for v in q.shape)
        return {"bh": b * h, "s": s, "d": d, "elem": q.element_size()}
    return None


def fit_kernels(recs):
    """Each kernel call's scalars as [per_sample, fixed] over the captured batches (the calls
    line up: the event structure is checked equal first)."""
    b0, b1 = recs[0]["batch"], recs[-1]["batch"]
    out = []
    for k0, k1 in zip(recs[0]["kernels"], recs[-1]["kernels"]):
        f = {}
        for key, v1 in k1[4].items():
            v0 = k0[4].get(key)
            if isinstance(v1, bool) or not isinstance(v1, int):
                f[key] = v1
                continue
            ps = (v1 - v0) // (b1 - b0) if (v1 - v0) % (b1 - b0) == 0 else None
            if ps is None or v1 - ps * b1 < 0:
                f[key] = [0, v1]  # does not scale affinely: kept at the last batch's value
            else:
                f[key] = [ps, v1 - ps * b1]
        out.append([max(k1[0] + k1[1] - 1 if k1[1] else k1[0] - 1, 0), k1[2], k1[3], f])
    return out


# --------------------------------------------------------------------------- the tracker
_DTYPE_NAMES = {}


def dtype_name(dtype):
    """"bfloat16" for torch.bfloat16 (str(dtype) without "torch.", computed once a dtype)."""
    s = _DTYPE_NAMES.get(dtype)
    if s is None:
        s = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return s


def leaves(out):
    """`tree_flatten(out)[0]` (the same values in the same order) for what an op returns,
    without the pytree walk for the common shape, a tuple or list of tensors and Nones (a
    None is a node without leaves); anything else goes through tree_flatten."""
    if type(out) in (tuple, list) and all(o is None or isinstance(o, torch.Tensor) for o in out):
        return [o for o in out if o is not None]
    return tree_flatten(out)[0]


class Tracker(TorchDispatchMode):
    """Records storage allocations (first time a storage is seen as an op output) and
    frees (the storage's Python object dies: a weakref callback)."""

    def __init__(self):
        super().__init__()
        self.events = []  # [1, id, nbytes, phase, op] | [0, id, phase]
        self.live = {}  # id(storage) -> buffer id
        self.refs = {}  # buffer id -> weakref
        self.next_id = 0
        self.phase = "setup"
        self.module = []
        self.ops = {}
        self.op_names = []
        self.dtypes = {}
        self.convs = []
        self.kernels = []  # [event, outputs allocated, op, phase, features] (kernel_features)
        self.names = {}  # op overload -> its packet's name

    def op_index(self, name):
        i = self.ops.get(name)
        if i is None:
            i = len(self.op_names)
            self.ops[name] = i
            self.op_names.append(name)
        return i

    def _freed(self, bid, key):
        def cb(_ref):
            if self.live.get(key) == bid:
                del self.live[key]
            self.refs.pop(bid, None)
            self.events.append([0, bid, PHASE_CODES[self.phase]])

        return cb

    def track(self, t, op):
        if not isinstance(t, torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except Exception:
            return
        key = id(st)
        if key in self.live:
            return
        bid = self.next_id
        self.next_id += 1
        self.live[key] = bid
        self.refs[bid] = weakref.ref(st, self._freed(bid, key))
        self.dtypes[bid] = dtype_name(t.dtype)
        where = self.module[-1] if (self.module and self.phase == "forward") else ""
        name = f"{op}@{where}" if where else op
        self.events.append([1, bid, int(st.nbytes()), PHASE_CODES[self.phase], self.op_index(name)])

    def buffer_of(self, t):
        if t is None:
            return None
        return self.live.get(id(t.untyped_storage()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = self.names.get(func)
        if name is None:
            name = self.names[func] = str(func.overloadpacket.__name__)
        n = len(self.events)
        if isinstance(out, torch.Tensor):
            self.track(out, name)
        else:
            for t in leaves(out):
                self.track(t, name)
        if name in KERNEL_OPS:
            f = kernel_features(name, args, kwargs or {}, out)
            if f is not None:
                self.kernels.append([n, len(self.events) - n, name, PHASE_CODES[self.phase], f])
        if name == "convolution" and len(args) >= 9:
            # for cuDNN workspace rules: [event, input shape, weight shape, stride, padding,
            # dilation, transposed, groups, dtype, phase]
            self.convs.append([n, list(args[0].shape), list(args[1].shape), list(args[3]),
                               list(args[4]), list(args[5]), bool(args[6]), int(args[8]),
                               dtype_name(args[0].dtype), self.phase])
        elif name == "convolution_backward" and len(args) >= 10:
            # [event, input shape, weight shape, stride, padding, dilation, transposed, groups,
            #  dtype, phase, number of outputs allocated, output mask (input, weight, bias)]
            self.convs.append([n, list(args[1].shape), list(args[2].shape), list(args[4]),
                               list(args[5]), list(args[6]), bool(args[7]), int(args[9]),
                               dtype_name(args[0].dtype), self.phase,
                               len(self.events) - n,
                               [bool(m) for m in args[10]] if len(args) > 10 else [True, True, True]])
        return out


def module_hooks(model, tr):
    hs = []
    for name, m in model.named_modules():
        def pre(_m, _a, name=name or "model"):
            tr.module.append(name)

        def post(_m, _a, _o):
            if tr.module:
                tr.module.pop()

        hs.append(m.register_forward_pre_hook(pre))
        hs.append(m.register_forward_hook(post))
    return hs


# --------------------------------------------------------------------------- the step
def make_optimizer(name, params):
    fe = {"foreach": True}
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, **fe)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **fe)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, **fe)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **fe)
    fail(2, f"--optimizer {name}: unknown (sgd, sgd-momentum, adam, adamw)")


def make_batch(args, kind, size, batch, device, target_shape, n_classes, dtype):
    if kind == "given":  # `vramlab.plan_module`'s inputs; class targets unless it has a loss
        x = args.make_batch(batch, device, dtype)
        if target_shape is None:
            return x, None
        return x, torch.randint(0, n_classes, (batch, *target_shape), device=device,
                                dtype=torch.int64)
    shape = input_shape(args, kind, size, batch)
    if kind == "tokens":
        x = torch.randint(0, args.vocab, shape, device=device, dtype=torch.int64)
        return x, x
    x = torch.randn(shape, device=device, dtype=dtype)
    y = torch.randint(0, n_classes, (batch, *target_shape), device=device, dtype=torch.int64)
    return x, y


def forward_loss(model, kind, x, y, loop, args=None):
    if kind == "given":  # `vramlab.plan_module`: its call, its loss or the output's, else CE
        out = args.call(model, x)
        if args.loss_fn is not None:
            loss = args.loss_fn(out, x)
        elif y is None:
            loss = loss_of(out)
        else:
            loss = F.cross_entropy(logits_of(out), y)
        return (None, loss) if loop == "trainer" else (out, loss)
    if kind == "tokens":
        if loop == "trainer":
            return None, model(input_ids=x, labels=y).loss
        out = model(input_ids=x, labels=y)
        return out, out.loss
    if loop == "trainer":
        return None, F.cross_entropy(logits_of(model(x)), y)
    out = model(x)
    return out, F.cross_entropy(logits_of(out), y)


_CUDA_POLICY = {}


def release_cpu_policies():
    """Takes back what a capture on the CPU registered with torch (CUDA's autocast lists, its
    SDPA backend and fused dropout): `vramlab.plan_module` captures in the user's process,
    whose own CPU runs must not keep them. The script's process ends instead."""
    for policy in reversed(list(_CUDA_POLICY.values())):
        policy.close()
    _CUDA_POLICY.clear()
    if "cuda_composites" in SIBLINGS or "cuda_composites" in sys.modules:
        sibling("cuda_composites").uninstall()


def autocast_region(device, amp_dtype, amp):
    """The step's autocast region. On the CPU (a machine without a GPU) with CUDA's op lists,
    not the CPU's (runners/cuda_autocast.py): the graph is the GPU host's."""
    if device.type == "cuda" or not amp:
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp)
    if amp_dtype not in _CUDA_POLICY:
        _CUDA_POLICY[amp_dtype] = sibling("cuda_autocast").CudaAutocast(amp_dtype)
    return _CUDA_POLICY[amp_dtype].region(True)


def train_steps(model, opt, args, kind, size, batch, device, probe, tr, steps):
    amp = args.precision in ("amp-bf16", "amp-fp16")
    amp_dtype = torch.float16 if args.precision == "amp-fp16" else torch.bfloat16
    in_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    target_shape, n_classes = probe
    marks = []
    for _step in range(steps):
        if tr:
            tr.phase = "zero_grad"
            gc.collect()  # cyclic garbage dies here, not when the collector happens to run
        marks.append(len(tr.events) if tr else 0)
        if tr:
            tr.phase = "zero_grad"
        opt.zero_grad(set_to_none=True)
        if tr:
            tr.phase = "forward"
        x, y = make_batch(args, kind, size, batch, device, target_shape, n_classes, in_dtype)
        with autocast_region(device, amp_dtype, amp):
            out, loss = forward_loss(model, kind, x, y, args.loop, args)
        if tr:
            tr.phase = "backward"
        loss.backward()
        del out, loss, x, y
        if tr:
            tr.phase = "optimizer"
        opt.step()
    return marks


def probe_output(model, args, kind, size, device):
    """Target shape per sample and class count, from one no-grad forward at batch 1."""
    if kind == "tokens":
        return ((), 0)
    if kind == "given" and args.loss_fn is not None:
        return (None, 0)  # the caller's loss: no class targets
    in_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    with torch.no_grad():
        was = model.training
        model.eval()
        if kind == "given":
            out = args.call(model, args.make_batch(1, device, in_dtype))
            if loss_of(out) is not None:
                model.train(was)
                return (None, 0)  # the output's own loss: no class targets
        else:
            out = model(torch.randn(input_shape(args, kind, size, 1), device=device, dtype=in_dtype))
        out = logits_of(out)
        model.train(was)
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        fail(2, "the model's output has no `loss` and no logits of shape (batch, classes, ...): "
                "pass loss_fn=lambda output, inputs: ... returning the scalar loss")
    shape = tuple(int(d) for d in out.shape)
    if len(shape) == 2:
        return ((), shape[1])
    return (shape[2:], shape[1])


class BuildState:
    """What the first capture learned about building the model, reused by the captures at the
    other batches (the factory and the process are the same, so the answer is the same):
    whether the factory runs under fake tensors, and, where it does not, what the failed
    attempt left in the tracker (op names seen before it failed, and any kernel or
    convolution rows), so that a later capture starts from the same tables without
    re-running the attempt."""

    def __init__(self):
        self.fake_fails = False
        self.left = None  # (ops, op_names, dtypes, convs, kernels) after the failed attempt

    def remember(self, tr):
        self.fake_fails = True
        self.left = copy.deepcopy((tr.ops, tr.op_names, tr.dtypes, tr.convs, tr.kernels))

    def seed(self, tr):
        tr.ops, tr.op_names, tr.dtypes, tr.convs, tr.kernels = copy.deepcopy(self.left)


def _meta_attribute(model):
    """The name of a plain tensor attribute (neither a parameter nor a buffer) left on the
    meta device by a build with meta parameters, or None: such a tensor (computed from a
    parameter in `__init__`) would reach the forward as meta where the real build has it on
    the CPU, so that build is not used."""
    for mname, m in model.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and v.is_meta and k not in m._parameters \
                    and k not in m._buffers:
                return f"{mname}.{k}" if mname else k
    return None


def build_with_meta_parameters(factory):
    """The factory run on the CPU with every parameter moved to the meta device as it is
    registered (accelerate's `init_empty_weights()`, include_buffers=False: buffers and other
    tensors stay real, so a value the build reads — timm's drop-path rates — is there): the
    weight initialisation then costs nothing. The capture replaces every parameter and buffer
    with a fresh storage (`to_empty`), so the values never mattered. None when the factory
    fails this way (it reads a parameter's value) or leaves a meta tensor outside the
    parameters: the caller builds for real."""
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            p = module._parameters[name]
            q = type(p)(p.to("meta"), requires_grad=p.requires_grad)
            q.__dict__.update(p.__dict__)
            module._parameters[name] = q

    nn.Module.register_parameter = register_on_meta
    try:
        with torch.device("cpu"):
            model = factory()
    except Exception:
        return None
    finally:
        nn.Module.register_parameter = register
    if not isinstance(model, nn.Module) or _meta_attribute(model) is not None:
        return None
    return model


def build_model(factory, device, fake, tr, dtype=None, state=None):
    """The model on the (fake) device. Under fake tensors first; a factory that reads tensor
    values while it builds (timm's drop-path rates: `.item()`) is built on the CPU with its
    parameters on the meta device (no weight initialisation: `build_with_meta_parameters`;
    for real where that fails) and moved onto the fake device (to_empty: fresh storages,
    allocated in module order).
    dtype (pure bf16): the parameters are made in it (the default dtype while the factory
    runs, as `from_pretrained(dtype=...)` does; on the CPU path `.to(dtype)` before
    `to_empty`) — `module.to(dtype)` on fake parameters the tracker holds weak references to
    cannot swap them ("_apply(): Couldn't swap Conv2d.weight").
    state (a BuildState shared by the captures of one run): once the fake build has failed,
    later captures go to the CPU build directly, starting from the tables it left."""
    if state is not None and state.fake_fails and fake is not None:
        state.seed(tr)
    else:
        prev = torch.get_default_dtype()
        try:
            if dtype is not None:
                torch.set_default_dtype(dtype)
            with torch.device(device):
                return factory()
        except Exception as e:
            if fake is None:
                fail(4, f"the model factory failed: {type(e).__name__}: {e}")
        finally:
            torch.set_default_dtype(prev)
        tr.events.clear()
        tr.live.clear()
        tr.refs.clear()
        tr.next_id = 0
        if state is not None:
            state.remember(tr)
    with torch.utils._python_dispatch._disable_current_modes():
        model = build_with_meta_parameters(factory)
        if model is None:
            try:
                with torch.device("cpu"):
                    model = factory()
            except Exception as e:
                fail(4, f"the model factory failed: {type(e).__name__}: {e}")
        if dtype is not None:
            model.to(dtype)
    return model.to_empty(device=device)


def to_precision(model, dtype):
    """`model.to(dtype)` for what the build left in another floating dtype (tensors a module
    creates with an explicit dtype); nothing when every floating tensor is in it already."""
    ts = list(model.parameters()) + list(model.buffers())
    if any(t.is_floating_point() and t.dtype != dtype for t in ts):
        model.to(dtype)


def describe_unsupported(e):
    op = getattr(e, "func", None)
    name = str(op) if op is not None else type(e).__name__
    return name


def capture_one(args, factory, kind, size, batch, device_name, state=None):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = args.real_cpu
    device = torch.device("cpu" if real else device_name)
    if device.type == "cpu" and not real:
        # fake CPU tensors stand for the GPU host's: its SDPA backends and fused dropout
        # (runners/cuda_composites.py)
        sibling("cuda_composites").install()
    # What is alive now (the modules imported so far, the previous captures' leftovers) goes
    # to the collector's permanent generation: the collection at the start of each step
    # (where the capture's cyclic garbage dies) walks only what this capture makes.
    gc.freeze()
    tr = Tracker()
    ctx = None if real else FakeTensorMode(allow_non_fake_inputs=True)
    if ctx:
        ctx.__enter__()
    try:
        with tr:
            bf16 = args.precision == "bf16"
            model = build_model(factory, device, ctx, tr, torch.bfloat16 if bf16 else None, state)
            if bf16:
                to_precision(model, torch.bfloat16)
            if args.checkpointing and enable_checkpointing(model) == 0:
                fail(2, "--checkpointing: no block list found in the model to checkpoint")
            model.train()
            params = list(model.parameters())
            n_params = sum(p.numel() for p in params)
            n_train = sum(p.numel() for p in params if p.requires_grad)
            tr.phase = "setup"
            probe = probe_output(model, args, kind, size, device)
            opt = make_optimizer(args.optimizer, [p for p in params if p.requires_grad])
            hooks = module_hooks(model, tr)
            marks = train_steps(model, opt, args, kind, size, batch, device, probe, tr, 2)
            for h in hooks:
                h.remove()
            cats = {}
            for p in params:
                b = tr.buffer_of(p)
                if b is not None:
                    cats[b] = "p"
                if p.grad is not None:
                    g = tr.buffer_of(p.grad)
                    if g is not None:
                        cats[g] = "g"
            for st in opt.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor) and v.numel() > 1:
                        b = tr.buffer_of(v)
                        if b is not None:
                            cats[b] = "o"
            # grads of the warm-up step are freed by zero_grad: mark buffers allocated for .grad
            # by the measured step's grads' op names is not possible; reuse the measured ones.
    except (SystemExit, CaptureError):
        raise
    except Exception as e:
        cls = type(e).__name__
        if cls in ("DynamicOutputShapeException", "DataDependentOutputException",
                   "UnsupportedOperatorException", "GuardOnDataDependentSymNode"):
            fail(5, f"op {describe_unsupported(e)} does not run under fake tensors ({cls}: "
                    f"its output shape depends on tensor values); capture for real on the CPU "
                    f"at a small batch with --real-cpu --batches 1,2,3")
        raise
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    return {
        "batch": batch,
        "measured_start": marks[1],
        "events": canonical_frees(tr.events),
        "categories": cats,
        "ops": tr.op_names,
        "dtypes": tr.dtypes,
        "params": n_params,
        "trainable": n_train,
        "convs": tr.convs,
        "kernels": tr.kernels,
    }


def canonical_frees(events):
    """Sorts each run of consecutive frees of one phase by buffer id: storages released
    together (the autocast weight cache, a tuple of saved tensors) die in hash-map order,
    which differs between runs; the order inside such a run changes no allocation."""
    out, run = [], []
    for e in events:
        if e[0] == 0 and (not run or run[-1][2] == e[2]):
            run.append(e)
            continue
        out.extend(sorted(run, key=lambda r: r[1]))
        run = []
        if e[0] == 0:
            run.append(e)
        else:
            out.append(e)
    out.extend(sorted(run, key=lambda r: r[1]))
    return out


# --------------------------------------------------------------------------- fit check
def structure(rec):
    return [(e[0], e[1], e[3] if e[0] else e[2]) for e in rec["events"]]


def check_affine(recs):
    """Refuses (exit 6) traces whose event order differs between batches, or whose sizes
    are not per_sample x batch + fixed (fit on the first two, checked on the rest)."""
    base = recs[0]
    for r in recs[1:]:
        s0, s1 = structure(base), structure(r)
        if s0 != s1:
            i = next((k for k, (a, b) in enumerate(zip(s0, s1)) if a != b), min(len(s0), len(s1)))
            e = (base["events"] + [None])[i]
            op = base["ops"][e[4]] if e and e[0] else "?"
            if os.environ.get("VRAMLAB_CAPTURE_DEBUG"):
                for rec in (base, r):
                    print(f"batch {rec['batch']}, events {max(0, i - 12)}..{i + 12}:", file=sys.stderr)
                    for k in range(max(0, i - 12), min(len(rec["events"]), i + 12)):
                        ev = rec["events"][k]
                        what = f"alloc {ev[2]} B by {rec['ops'][ev[4]]}" if ev[0] else "free"
                        print(f"  {k}: {what} buffer {ev[1]} phase {ev[3] if ev[0] else ev[2]}",
                              file=sys.stderr)
            fail(6, f"the allocations differ between batch {base['batch']} and {r['batch']} "
                    f"at event {i} (op {op}; {len(s0)} vs {len(s1)} events): the graph does not "
                    f"scale with the batch; capture at the batch you will train with")
    if len(recs) < 3:
        return
    b0, b1 = recs[0]["batch"], recs[1]["batch"]
    for r in recs[2:]:
        for k, e in enumerate(base["events"]):
            if not e[0]:
                continue
            s0, s1, s2 = e[2], recs[1]["events"][k][2], r["events"][k][2]
            num = (s1 - s0)
            if num % (b1 - b0):
                bad = True
            else:
                ps = num // (b1 - b0)
                # a slightly negative intercept is accepted (kernels that pad a per-sample
                # size and subtract a small header: 978432 x batch - 24); vramlab plans it as 0
                bad = s0 - ps * b0 < -4096 or s0 + ps * (r["batch"] - b0) != s2
            if bad:
                fail(6, f"op {base['ops'][e[4]]}: allocation {e[1]} is {s0}, {s1}, {s2} bytes at "
                        f"batches {b0}, {b1}, {r['batch']}: not per_sample x batch + fixed")


# --------------------------------------------------------------------------- the batches
def can_fork(args):
    """Whether the captures may be split over two processes: fake tensors on the CPU (no
    CUDA context a child would inherit, no real kernels and their thread pools), fork
    available, and at least two CPUs this process may run on."""
    if args.real_cpu or args.device != "cpu" or not hasattr(os, "fork"):
        return False
    if getattr(args, "in_process", False):
        # `vramlab.plan_module` captures inside the user's process (a notebook, a training
        # script): it is not forked
        return False
    if os.environ.get("VRAMLAB_CAPTURE_SEQUENTIAL"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return cpus >= 2 and not torch.cuda.is_initialized()


def capture_in_child(args, factory, kind, size, batches):
    """Forks a process that captures `batches` in turn and pickles the records into a file
    (stdout and stderr closed: the parent decides what is reported). Called before any
    backward pass has run here (autograd refuses to run in a child forked after one: "Unable
    to handle autograd's threading in combination with fork-based multiprocessing").
    Returns (pid, path)."""
    fd, path = tempfile.mkstemp(prefix="vramlab-capture-", suffix=".pickle")
    os.close(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # Python 3.12+ warns on fork() in a process with a second OS thread (torch's import
        # starts one); nothing here runs on it and no backward has run yet
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            state = BuildState()
            recs = [capture_one(args, factory, kind, size, b, args.device, state) for b in batches]
            with open(path, "wb") as fh:
                pickle.dump(recs, fh, protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid, path


def child_records(pid, path):
    """The child's records, or None where it failed."""
    try:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        with open(path, "rb") as fh:
            return pickle.load(fh)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def stop_child(pid, path):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    child_records(pid, path)


def capture_batches(args, factory, kind, size, batches):
    """One record per batch, in order, each as the sequential run makes it: batch after batch
    in one process, the first captured again when a one-time allocation of the process
    landed in it (its events differ from the second's).

    With two CPUs (`can_fork`) the batches are split: a forked child captures the last
    half while this process captures the first half, so two captures run at once. The
    child starts as fresh as this process, so its first capture is the cold one there; where
    its events differ from this process's second (warm) capture, that batch is captured again
    here, warm, as the sequential run has it; a child that failed has its batches captured
    here in turn (the sequential run's errors, from this process)."""
    state = BuildState()
    mine, theirs, child = batches, [], None
    if len(batches) >= 3 and can_fork(args):
        k = len(batches) // 2
        mine, theirs = batches[:-k], batches[-k:]
        child = capture_in_child(args, factory, kind, size, theirs)
    try:
        recs = [capture_one(args, factory, kind, size, b, args.device, state) for b in mine]
    except BaseException:
        if child:
            stop_child(*child)
        raise
    debug = os.environ.get("VRAMLAB_CAPTURE_DEBUG")
    if theirs:
        more = child_records(*child)
        if more is None:
            if debug:
                print(f"capture: the child failed; batches {theirs} captured here", file=sys.stderr)
            more = [capture_one(args, factory, kind, size, b, args.device, state) for b in theirs]
        elif structure(more[0]) != structure(recs[1]):
            if debug:
                print(f"capture: the child's first capture (batch {theirs[0]}) differs from batch "
                      f"{mine[1]}'s: captured again here", file=sys.stderr)
            more[0] = capture_one(args, factory, kind, size, theirs[0], args.device, state)
        recs += more
    if structure(recs[0]) != structure(recs[1]):
        if debug:
            print(f"capture: batch {batches[0]} captured again (its events differ from batch "
                  f"{batches[1]}'s)", file=sys.stderr)
        # a one-time allocation of the process (a cache built on first use, e.g. by a
        # library while the first model is built) lands in the first capture only: capture
        # the first batch again, now in the same state as the others
        recs[0] = capture_one(args, factory, kind, size, batches[0], args.device, state)
    return recs


def capture_graph(args, factory, kind, size, name):
    """The captured graph document (the `*.vramlab-graph.json` object) and the per-batch
    records: every batch of `args.batches` captured, the first again when a one-time
    allocation of the process landed in it, the fit checked."""
    try:
        batches = sorted({int(b) for b in str(args.batches).split(",")})
    except ValueError:
        fail(2, f"--batches {args.batches}: expected a comma list of whole numbers")
    if len(batches) < 2 or batches[0] < 1:
        fail(2, "--batches: at least two batch sizes of at least 1")
    t0 = time.perf_counter()
    gc.disable()
    try:
        recs = capture_batches(args, factory, kind, size, batches)
    finally:
        gc.enable()
        gc.unfreeze()
    check_affine(recs)
    secs = time.perf_counter() - t0
    cats = recs[-1]["categories"]
    doc = {
        "format": "vramlab-graph",
        "version": FORMAT_VERSION,
        "model": name,
        "torch": torch.__version__,
        # The model's own library decides what it runs (timm 1.0.31's NFNet made two
        # activations out of place that 1.0.29's ran in place): a CPU capture and a GPU-host
        # capture compare only at the same versions.
        "libraries": {m: getattr(sys.modules[m], "__version__", None)
                      for m in ("timm", "torchvision", "transformers", "peft")
                      if m in sys.modules},
        "capture": {"fake": not args.real_cpu, "device": args.device, "seconds": round(secs, 3)},
        # `vramlab.plan_module`'s inputs are planned as tokens (integer inputs) or images
        "input": {"kind": getattr(args, "graph_kind", kind), "size": size,
                  "shape": list(input_shape(args, kind, size, 1)[1:])},
        "settings": {
            "precision": args.precision,
            "optimizer": args.optimizer,
            "loop": args.loop,
            "checkpointing": args.checkpointing,
        },
        "params": {"count": recs[0]["params"], "trainable": recs[0]["trainable"]},
        "ops": recs[-1]["ops"],
        "buffers": [
            {"dtype": recs[-1]["dtypes"].get(i, "?"), "category": cats.get(i, "")}
            for i in range(max((e[1] for e in recs[-1]["events"]), default=-1) + 1)
        ],
        "batches": [
            {
                "batch": r["batch"],
                "measured_start": r["measured_start"],
                "events": [[e[0], e[1], e[2], e[3]] if e[0] else [0, e[1], 0, e[2]] for e in r["events"]],
            }
            for r in recs
        ],
        "event_ops": [e[4] if e[0] else -1 for e in recs[-1]["events"]],
        "convolutions": {"batch": recs[-1]["batch"], "calls": recs[-1]["convs"]},
        # [event after which the kernel runs, op, phase, {scalar: [per_sample, fixed] | value}]
        "kernels": fit_kernels(recs),
    }
    return doc, recs


# --------------------------------------------------------------------------- measure
def measure(args, factory, kind, size, batch):
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.device(dev):
        model = factory()
    if args.precision == "bf16":
        model.to(torch.bfloat16)
    if args.checkpointing:
        enable_checkpointing(model)
    model.train()
    probe = probe_output(model, args, kind, size, dev)
    opt = make_optimizer(args.optimizer, [p for p in model.parameters() if p.requires_grad])
    train_steps(model, opt, args, kind, size, batch, dev, probe, None, 2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    train_steps(model, opt, args, kind, size, batch, dev, probe, None, 1)
    torch.cuda.synchronize()
    rec = {
        "batch": batch,
        "allocated_start": int(start),
        "peak_allocated": int(torch.cuda.max_memory_allocated()),
        "peak_reserved": int(torch.cuda.max_memory_reserved()),
    }
    del model, opt
    torch.cuda.empty_cache()
    return rec


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--timm")
    src.add_argument("--torchvision")
    src.add_argument("--hf", help="a Hugging Face config.json (causal LM, random init)")
    src.add_argument("--module", help="path/to/file.py:factory (a zero-argument callable)")
    ap.add_argument("--input", help="per-sample input shape, e.g. 3x256x256")
    ap.add_argument("--image", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--precision", default="amp-bf16", choices=["fp32", "amp-bf16", "amp-fp16", "bf16"])
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--loop", default="plain", choices=["plain", "trainer"])
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--batches", default="2,4,6", help="batch sizes to capture (>= 2; the last is held out)")
    ap.add_argument("--device", default=None,
                    help="the fake device [default: cuda where CUDA is available, else cpu: "
                         "backward on fake CUDA tensors needs a CUDA driver; on cpu, autocast follows CUDA's "
                         "op lists (runners/cuda_autocast.py), so the graph is the GPU host's]")
    ap.add_argument("--real-cpu", action="store_true", help="run for real on the CPU instead of fake tensors")
    ap.add_argument("--measure", help="also measure on CUDA at these batches (comma list)")
    ap.add_argument("--measure-out", help="JSON lines file for --measure")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    if args.real_cpu:
        args.device = "cpu"
    elif args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        batches = sorted({int(b) for b in args.batches.split(",")})
    except ValueError:
        fail(2, f"--batches {args.batches}: expected a comma list of whole numbers")
    if len(batches) < 2 or batches[0] < 1:
        fail(2, "--batches: at least two batch sizes of at least 1")
    factory, kind, size, name = build_factory(args)
    if args.hf and args.vocab == 1000:
        with open(args.hf) as fh:
            args.vocab = int(json.load(fh).get("vocab_size", 1000))
    doc, recs = capture_graph(args, factory, kind, size, name)
    secs = doc["capture"]["seconds"]
    tmp = args.output + ".tmp"
    with open(tmp, "w") as fh:
        # json.dumps, not json.dump: the same bytes, from the C encoder in one piece (json.dump
        # writes through the pure-Python encoder, chunk by chunk: 0.05 s for convnextv2_tiny's
        # 600 KB against 0.015 s)
        fh.write(json.dumps(doc, separators=(",", ":")))
    os.replace(tmp, args.output)
    print(json.dumps({"output": args.output, "model": name, "params": doc["params"]["count"],
                      "events": len(recs[-1]["events"]), "seconds": round(secs, 3)}))
    if args.measure:
        if not torch.cuda.is_available():
            fail(7, "--measure needs CUDA")
        out = open(args.measure_out, "a") if args.measure_out else sys.stdout
        for b in [int(x) for x in args.measure.split(",")]:
            try:
                rec = measure(args, factory, kind, size, b)
            except torch.OutOfMemoryError:
                rec = {"batch": b, "oom": True}
            rec.update({"model": name, "precision": args.precision, "optimizer": args.optimizer,
                        "loop": args.loop, "checkpointing": args.checkpointing, "size": size,
                        "graph": os.path.basename(args.output)})
            out.write(json.dumps(rec) + "\n")
            out.flush()


def exit_now(code):
    """Ends the script's process with `code` once everything is written, without the
    interpreter's teardown: after a capture it frees the whole heap of torch, timm, dynamo and
    their modules object by object (about 0.6 s of CPU for convnextv2_tiny, more than writing
    the graph), work whose result nobody sees. The exit handlers run as on a normal exit
    (`atexit`: logging's flush, the libraries' own), the standard streams are flushed; where
    another Python thread is still alive (a user's module started one) the normal exit waits
    for it, as before."""
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    try:
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    try:
        main()
    except CaptureError as e:
        print(f"capture: error: {e.msg}", file=sys.stderr)
        exit_now(e.code)
    exit_now(0)

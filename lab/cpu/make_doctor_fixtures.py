#!/usr/bin/env python3
"""Writes the doctor's stack-format fixtures (tests/data/doctor/stacks_*), no GPU needed.

    python3 lab/cpu/make_doctor_fixtures.py tests/data/doctor

Each fixture is a `torch.cuda.memory._snapshot()` dict written with `pickle.dump` (what
`torch.cuda.memory._dump_snapshot` does), its stacks in the two forms PyTorch records:

* `stacks="all"` -- the default of `_record_memory_history()`. PyTorch's `symbolize`
  (torch/csrc/profiler/combined_traceback.cpp) walks the unwound C++ frames innermost
  first and, before each frame whose name holds `PyEval_EvalFrame`, inserts the next
  gathered Python frame; Python frames left over go at the end. Frames are
  `{"filename", "line", "name"}` dicts: `co_filename`/`co_name` for Python, the
  symbolizer's file and function for C++ (`??` when unknown). Threads without Python
  (autograd's backward workers) record C++ frames only.
* `stacks="python"` -- the Python frames alone.

The events are those of small runs (a GPT-2-like training step, a validation loop without
`no_grad`, a fragmented cache under `set_per_process_memory_fraction`); sizes are chosen so
each case's figures are exact. The message files use PyTorch 2.11's wording
(c10/cuda/CUDACachingAllocator.cpp).
"""
import os
import pickle
import sys

MiB = 1 << 20
GiB = 1 << 30
TOTAL = 150109880320  # an H200 as torch.cuda.get_device_properties reports it
BASE = 0x7F0000000000

USER = "/home/user/project/train.py"
SITE = "/usr/lib/python3.12/site-packages"

# C++ frames (innermost first) above the allocator and below Python.
CPP_TOP = [
    ("??", 0, "torch::unwind::unwind()"),
    ("/pytorch/torch/csrc/profiler/combined_traceback.cpp", 0,
     "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("/pytorch/torch/csrc/cuda/memory_snapshot.cpp", 0,
     "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 0,
     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
     "(signed char, unsigned long, CUstream_st*)"),
    ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 0,
     "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
    ("/pytorch/aten/src/ATen/EmptyTensor.cpp", 0,
     "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
     "c10::ScalarType, std::optional<c10::MemoryFormat>)"),
    ("/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 0,
     "at::native::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&, at::Tensor const&, "
     "at::Tensor const&, c10::Scalar const&, c10::Scalar const&, at::native::Activation)"),
    ("/pytorch/aten/src/ATen/core/boxing/impl/WrapFunctionIntoFunctor.h", 0,
     "c10::impl::wrap_kernel_functor_unboxed_"),
    ("/pytorch/torch/csrc/autograd/generated/python_torch_functions_0.cpp", 0,
     "torch::autograd::THPVariable_addmm(_object*, _object*, _object*)"),
    ("/usr/local/src/conda/python-3.12.3/Objects/methodobject.c", 0, "cfunction_call"),
]
EVAL = ("/usr/local/src/conda/python-3.12.3/Python/ceval.c", 0, "_PyEval_EvalFrameDefault")
CPP_BOTTOM = [
    ("/usr/local/src/conda/python-3.12.3/Python/pythonrun.c", 0, "_PyRun_SimpleFileObject"),
    ("/usr/local/src/conda/python-3.12.3/Modules/main.c", 0, "Py_RunMain"),
    ("??", 0, "__libc_start_main"),
    ("??", 0, "_start"),
]
BACKWARD_CPP = [
    ("??", 0, "torch::unwind::unwind()"),
    ("/pytorch/torch/csrc/profiler/combined_traceback.cpp", 0,
     "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("/pytorch/torch/csrc/cuda/memory_snapshot.cpp", 0,
     "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 0,
     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
     "(signed char, unsigned long, CUstream_st*)"),
    ("/pytorch/aten/src/ATen/native/cuda/Blas.cpp", 0, "at::native::mm_out_cuda(...)"),
    ("/pytorch/torch/csrc/autograd/generated/Functions.cpp", 0,
     "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
    ("/pytorch/torch/csrc/autograd/engine.cpp", 0,
     "torch::autograd::Engine::evaluate_function(...)"),
    ("/pytorch/torch/csrc/autograd/engine.cpp", 0,
     "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ("/pytorch/torch/csrc/autograd/python_engine.cpp", 0,
     "torch::autograd::python::PythonEngine::thread_init(int, ...)"),
    ("??", 0, "start_thread"),
    ("??", 0, "clone3"),
]


def fr(t):
    return {"filename": t[0], "line": t[1], "name": t[2]}


def stack(python, stacks):
    """`python`: (filename, line, name) innermost first. Mirrors `symbolize`."""
    py = [fr(p) for p in python]
    if stacks == "python":
        return py
    out = [fr(c) for c in CPP_TOP]
    for p in py:  # one interpreter frame per Python frame
        out.append(p)
        out.append(fr(EVAL))
    out += [fr(c) for c in CPP_BOTTOM]
    return out


def backward_stack(stacks):
    return [] if stacks == "python" else [fr(c) for c in BACKWARD_CPP]


class Trace:
    def __init__(self, stacks):
        self.stacks = stacks
        self.entries = []
        self.t = 1_700_000_000_000_000
        self.segments = {}  # addr -> size
        self.next_seg = BASE

    def add(self, action, addr, size, frames, **kw):
        self.t += 10
        e = {"action": action, "addr": addr, "size": size, "stream": 0,
             "time_us": self.t, "frames": frames}
        e.update(kw)
        self.entries.append(e)

    def segment(self, size, frames):
        addr = self.next_seg
        self.next_seg += size + 64 * MiB
        self.add("segment_alloc", addr, size, frames)
        self.segments[addr] = size
        return addr


def final_segments(tr, live):
    """`segments` in the final state: `live` = {addr: (size, frames)} of live blocks."""
    segs = []
    for addr, size in sorted(tr.segments.items()):
        blocks, at = [], addr
        allocated = 0
        for b in sorted(a for a in live if addr <= a < addr + size):
            if b > at:
                blocks.append({"address": at, "size": b - at, "requested_size": 0,
                               "state": "inactive", "frames": []})
            bsize, frames = live[b]
            blocks.append({"address": b, "size": bsize, "requested_size": bsize,
                           "state": "active_allocated", "frames": frames})
            allocated += bsize
            at = b + bsize
        if at < addr + size:
            blocks.append({"address": at, "size": addr + size - at, "requested_size": 0,
                           "state": "inactive", "frames": []})
        segs.append({"device": 0, "address": addr, "total_size": size,
                     "allocated_size": allocated, "active_size": allocated,
                     "requested_size": allocated, "stream": 0, "segment_type": "large",
                     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                     "blocks": blocks})
    return segs


def snapshot(tr, live, settings=None):
    return {"segments": final_segments(tr, live), "device_traces": [tr.entries],
            "allocator_settings": settings or {"PYTORCH_CUDA_ALLOC_CONF": "",
                                               "max_split_size": -1,
                                               "garbage_collection_threshold": 0.0,
                                               "expandable_segments": False,
                                               "pinned_num_register_threads": 1,
                                               "release_lock_on_cudamalloc": False,
                                               "pinned_use_cuda_host_register": False,
                                               "roundup_power2_divisions": {}}}


def gpt2_py(fn, line, user_fn, user_line):
    return [
        (f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
        (f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        (f"{SITE}/transformers/pytorch_utils.py", 117, "forward") if fn == "conv1d" else
        (f"{SITE}/transformers/models/gpt2/modeling_gpt2.py", line, fn),
        (f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        (f"{SITE}/transformers/models/gpt2/modeling_gpt2.py", 1100, "forward"),
        (f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        (USER, user_line, user_fn),
        (USER, 88, "main"),
        (USER, 92, "<module>"),
    ]


def training_step(stacks):
    """Weights, a forward through 12 blocks, backward on autograd's thread, then an OOM."""
    tr = Trace(stacks)
    live = {}
    seg = tr.segment(2 * GiB, [])
    load = stack([(f"{SITE}/torch/nn/modules/module.py", 1355, "convert"),
                  (f"{SITE}/torch/nn/modules/module.py", 942, "_apply"),
                  (USER, 70, "main"), (USER, 92, "<module>")], stacks)
    at = seg
    for _ in range(4):  # 4 x 128 MiB of weights
        tr.add("alloc", at, 128 * MiB, load)
        live[at] = (128 * MiB, load)
        at += 128 * MiB
    act = tr.segment(8 * GiB, [])
    at = act
    for layer in range(12):
        for fn, line in (("forward", 390), ("conv1d", 117)):
            fs = stack(gpt2_py(fn, line, "train_step", 41), stacks)
            tr.add("alloc", at, 256 * MiB, fs)
            live[at] = (256 * MiB, fs)
            at += 256 * MiB
    bw = backward_stack(stacks)
    for _ in range(6):
        tr.add("alloc", at, 128 * MiB, bw)
        live[at] = (128 * MiB, bw)
        at += 128 * MiB
    # backward asks for more than the card has left
    tr.add("oom", 0, 4 * GiB, bw, device_free=512 * MiB)
    return snapshot(tr, live)


def validation_loop(stacks):
    """Outputs of a validation loop without no_grad kept in a list, each with its graph."""
    tr = Trace(stacks)
    live = {}
    seg = tr.segment(16 * GiB, [])
    at = seg
    for step in range(30):
        fs = stack(gpt2_py("forward", 390, "validate", 57), stacks)
        tr.add("alloc", at, 512 * MiB, fs)
        live[at] = (512 * MiB, fs)
        at += 512 * MiB
    tr.add("oom", 0, 3 * GiB, stack(gpt2_py("forward", 390, "validate", 57), stacks),
           device_free=1 * GiB)
    return snapshot(tr, live)


def fragmented_under_cap(stacks):
    """Issue 27's case: an 8 GiB cap (fraction 8 GiB / total), 4 segments with live blocks and
    holes (3.73 GiB free in them, none as large as the request), a 1.40 GiB request."""
    tr = Trace(stacks)
    live = {}
    seg_size = 2030 * MiB
    hole = 955 * MiB
    for i in range(4):
        seg = tr.segment(seg_size, [])
        fs = stack(gpt2_py("forward", 390, "train_step", 41), stacks)
        a = seg
        tr.add("alloc", a, hole, fs)
        b = seg + hole
        tr.add("alloc", b, seg_size - hole, fs)
        live[b] = (seg_size - hole, fs)
        tr.add("free_requested", a, hole, fs)
        tr.add("free_completed", a, hole, fs)
    request = 1434 * MiB  # "1.40 GiB"
    tr.add("oom", 0, request, stack(gpt2_py("conv1d", 117, "train_step", 41), stacks),
           device_free=120 * GiB)
    reserved = 4 * seg_size
    allocated = 4 * (seg_size - hole)
    return snapshot(tr, live), request, reserved, allocated


def format_size(n):
    # c10::CachingAllocator::format_size
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1048576:
        return f"{n / 1024:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


def cap_message(request, reserved, allocated, allowed, free):
    process = reserved + 532 * MiB  # the CUDA context and cuBLAS workspace
    return (
        "Traceback (most recent call last):\n"
        f'  File "{USER}", line 92, in <module>\n    main()\n'
        f'  File "{USER}", line 88, in main\n    train_step(model, batch)\n'
        f'  File "{USER}", line 41, in train_step\n    loss = model(**batch).loss\n'
        "torch.OutOfMemoryError: CUDA out of memory. "
        f"Tried to allocate {format_size(request)}. GPU 0 has a total capacity of "
        f"{format_size(TOTAL)} of which {format_size(free)} is free. Including non-PyTorch "
        f"memory, this process has {format_size(process)} memory in use. "
        f"{format_size(allowed)} allowed; Of the allocated memory {format_size(allocated)} is "
        f"allocated by PyTorch, and {format_size(reserved - allocated)} is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-"
        "pytorch-cuda-alloc-conf)\n"
    )


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/doctor"
    os.makedirs(out, exist_ok=True)
    for stacks in ("all", "python"):
        cases = {
            "train": training_step(stacks),
            "eval": validation_loop(stacks),
        }
        frag, request, reserved, allocated = fragmented_under_cap(stacks)
        cases["frag_cap"] = frag
        for name, snap in cases.items():
            path = os.path.join(out, f"stacks_{stacks}_{name}.snapshot.pickle")
            with open(path, "wb") as f:
                pickle.dump(snap, f, protocol=4)
            print(path, os.path.getsize(path))
    with open(os.path.join(out, "stacks_frag_cap.message.txt"), "w") as f:
        f.write(cap_message(request, reserved, allocated, 8 * GiB, 120 * GiB))


if __name__ == "__main__":
    main()

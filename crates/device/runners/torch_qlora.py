"""QLoRA / LLM.int8 base layers and the bitsandbytes optimizers, for crates/device/runners/torch_runner.py.

The base model is built in fp32 (random init), then every Linear / GPT-2 Conv1D except the
output embedding is replaced the way transformers' bitsandbytes integration loads a
checkpoint with `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=torch.bfloat16)` and `dtype=bfloat16`:
the weight is taken in bf16 and quantized by `Params4bit` / `Int8Params` on its move to the
GPU. Then peft's `prepare_model_for_kbit_training` (all params frozen, the non-quantized
ones cast to fp32) and `get_peft_model`. Needs bitsandbytes (0.50.2 as a carried wheel).
"""

import torch
import torch.nn as nn

QUANTS = ("nf4", "fp4", "int8")
BNB_OPTIMIZERS = ("adam8bit", "adamw-8bit", "paged-adamw-8bit", "paged-adamw")


def _conv1d_cls():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return ()
    return (Conv1D,)


def quantized_copy(child, quant, double_quant, out_emb, conv1d):
    """`child`'s bnb Linear4bit / Linear8bitLt, its weight taken in bf16 and not quantized yet
    (that happens on its move to the GPU), on the CPU; None for a module that stays (not a
    Linear / GPT-2 Conv1D, or the output embedding)."""
    import bitsandbytes as bnb

    if child is out_emb:
        return None
    if isinstance(child, nn.Linear):
        w = child.weight.data
    elif conv1d and isinstance(child, conv1d):
        w = child.weight.data.t()  # Conv1D keeps (in, out)
    else:
        return None
    outf, inf = w.shape
    has_bias = child.bias is not None
    w = w.to(torch.bfloat16).contiguous().cpu()
    if quant == "int8":
        new = bnb.nn.Linear8bitLt(inf, outf, bias=has_bias, has_fp16_weights=False, threshold=6.0)
        new.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        new = bnb.nn.Linear4bit(inf, outf, bias=has_bias, compute_dtype=torch.bfloat16,
                                compress_statistics=double_quant, quant_type=quant,
                                quant_storage=torch.uint8)
        new.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=double_quant,
                                       quant_type=quant, quant_storage=torch.uint8)
    if has_bias:
        new.bias = nn.Parameter(child.bias.data.to(torch.bfloat16).cpu(), requires_grad=False)
    return new


def quantize_model(model, quant, double_quant, device="cuda"):
    """Replaces the linears (not the output embedding) by bnb Linear4bit / Linear8bitLt on
    `device` (the runner's: `--device cpu` too). Returns (number replaced, bytes of the
    quantized storage: weights + QuantState tensors)."""
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    conv1d = _conv1d_cls()
    count = 0
    for _, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            new = quantized_copy(child, quant, double_quant, out_emb, conv1d)
            if new is None:
                continue
            setattr(parent, name, new.to(device))  # quantizes on the move
            count += 1
    return count, quant_storage_bytes(model)


def load_quantized(model, quant, double_quant, device):
    """Moves `model`, built on the CPU, to `device` as `from_pretrained(checkpoint,
    quantization_config=BitsAndBytesConfig(...), dtype=torch.bfloat16, device_map={"": device})`
    loads it: module by module in the model's order (a checkpoint's), every Linear / GPT-2
    Conv1D but the output embedding quantized on its move, every other floating parameter in
    bf16 and every buffer as it is. The GPU never holds the unquantized model, as a user's
    load never does; `quantize_model` (the model built on the GPU in fp32 first) leaves the
    freed fp32 weights' segments cached, and the quantized weights land in them (the
    allocator history of tests/data/traces/h200-fresh29-histories.tgz, f29-09).
    Returns (number quantized, bytes of the quantized storage)."""
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    conv1d = _conv1d_cls()
    count = 0
    moved = set()

    def move_own(m):
        for name, p in list(m.named_parameters(recurse=False)):
            if id(p) in moved:
                continue
            moved.add(id(p))
            dtype = torch.bfloat16 if p.is_floating_point() else p.dtype
            p.data = p.data.to(device=device, dtype=dtype)
        for name, b in list(m.named_buffers(recurse=False)):
            m._buffers[name] = b.to(device)

    def visit(m):  # pre-order: a module's own tensors, then its children in order
        nonlocal count
        move_own(m)
        for name, child in list(m.named_children()):
            new = quantized_copy(child, quant, double_quant, out_emb, conv1d)
            if new is None:
                visit(child)
            else:
                setattr(m, name, new.to(device))  # quantizes on the move
                count += 1

    visit(model)
    return count, quant_storage_bytes(model)


def quant_storage_bytes(model):
    """Bytes of the quantized weights and their QuantState tensors (absmax, nested absmax,
    offset, codes; LLM.int8's SCB), each tensor once."""
    seen = set()
    total = 0

    def add(t):
        nonlocal total
        if torch.is_tensor(t) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    for m in model.modules():
        w = getattr(m, "weight", None)
        qs = getattr(w, "quant_state", None)
        if qs is not None:
            add(w)
            for k in ("absmax", "code", "offset"):
                add(getattr(qs, k, None))
            s2 = getattr(qs, "state2", None)
            if s2 is not None:
                add(s2.absmax)
                add(s2.code)
        elif type(w).__name__ == "Int8Params":
            add(w)
            add(getattr(w, "SCB", None))
    return total


def prepare(model, quant, checkpointing, reentrant=False):
    """peft.prepare_model_for_kbit_training as on a from_pretrained(quantization_config=…)
    model (is_loaded_in_4bit / 8bit set: input require-grads and checkpointing with it)."""
    import peft

    attr = "is_loaded_in_8bit" if quant == "int8" else "is_loaded_in_4bit"
    try:
        setattr(model, attr, True)
    except Exception:  # a read-only property: a subclass that says so (peft reads it to dispatch)
        cls = type(model)
        model.__class__ = type(cls.__name__, (cls,), {attr: True})
    return peft.prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": bool(reentrant)})


def make_optimizer(name, params):
    import bitsandbytes as bnb

    if name == "adam8bit":
        return bnb.optim.Adam8bit(params, lr=1e-4)
    if name == "adamw-8bit":
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    if name == "paged-adamw-8bit":
        return bnb.optim.PagedAdamW8bit(params, lr=1e-4)
    if name == "paged-adamw":
        return bnb.optim.PagedAdamW32bit(params, lr=1e-4)
    raise ValueError(name)


def lora_on_bnb(model):
    """How many peft LoRA layers wrap a bitsandbytes base layer."""
    return sum(1 for m in model.modules() if type(m).__module__.startswith("peft.tuners.lora.bnb"))


def paged_state_bytes(opt):
    """Bytes of optimizer state in unified memory (bnb's get_paged: cudaMallocManaged)."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and getattr(v, "is_paged", False):
                total += v.numel() * v.element_size()
    return total


def sources():
    """The bnb / peft code the planner mirrors, for the log."""
    import inspect

    import bitsandbytes as bnb
    import peft
    from bitsandbytes.autograd import _functions as fn
    from peft.tuners.lora import bnb as lora_bnb

    parts = [f"bitsandbytes {bnb.__version__} peft {peft.__version__}"]
    for obj in (peft.prepare_model_for_kbit_training, lora_bnb.Linear4bit.forward,
                lora_bnb.Linear8bitLt.forward, bnb.nn.Linear4bit.forward, fn.MatMul4Bit,
                bnb.nn.Linear8bitLt.forward, fn.MatMul8bitLt,
                bnb.optim.optimizer.Optimizer2State.init_state,
                bnb.optim.optimizer.Optimizer8bit.get_state_buffer):
        try:
            parts.append(inspect.getsource(obj))
        except Exception as e:  # noqa: BLE001
            parts.append(f"{obj}: {e}")
    return "\n".join(parts)

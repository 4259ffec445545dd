"""CUDA's choices inside two composite ops, on a machine without a GPU (imported by capture.py):
`scaled_dot_product_attention`'s backend and `dropout`'s fused kernel.

On the CPU, `F.scaled_dot_product_attention` picks among the CPU's kernels: the CPU flash
kernel, or the math path (`bmm`, softmax, `bmm`: the whole attention matrix kept for
backward) for every call with a mask that requires grad. On the GPU host the same call runs
a fused CUDA kernel, which keeps only the output and a log-sum-exp (TinyViT, whose learned
attention biases are such a mask, planned 13 % above its GPU-host capture). This module
registers a kernel for `aten::scaled_dot_product_attention` on the `AutogradCPU` key (it
takes precedence over the composite) that does what the CUDA composite does, mirrored from
torch 2.11's `aten/src/ATen/native/transformers/attention.cpp` (`scaled_dot_product_attention`,
`preprocess_mask`, `pad_last_dim`) and `cuda/sdp_utils.cpp` / `sdp_utils_cpp.h` (the backend
checks, in the priority order of an sm90 device with cuDNN 9.15 or newer — the H100 / H200
class: cuDNN, flash, memory-efficient, math; on sm8x flash comes first, which keeps the
same tensors). The fused ops run on fake tensors through their meta kernels; autograd records
their own backward nodes, as on the GPU. Autocast (runners/cuda_autocast.py, CUDA's lists:
`scaled_dot_product_attention` is lower-precision) casts the inputs before this kernel runs,
as CUDA's autocast key does before the composite.

`dropout` (`aten/src/ATen/native/Dropout.cpp`): on CUDA, `is_fused_kernel_acceptable` (a CUDA
input, 0 < p < 1, not empty) sends training dropout to `native_dropout`, which saves a bool
mask for backward; the CPU path (`_dropout_impl`) multiplies by a noise tensor in the
input's dtype and saves that (2-4 times the mask's bytes: a Conformer with dropout captured
on the CPU planned 6 % above its GPU-host capture at batch 64).
"""
import math
import warnings

import torch
import torch.nn.functional as F

# The device the graph is for (the measured host): sm90 with the cuDNN torch 2.11.0+cu130
# ships (9.19, `torch.backends.cudnn.version()` 91900 on the H200).
SM = (9, 0)
CUDNN_D256 = False  # head dim 256 needs cuDNN > 9.22

_HALF = (torch.float16, torch.bfloat16)


def _requires_grad(q, k, v):
    return (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled()


def _dense_common(q, k, v, enable_gqa, same_heads, ignore_singleton):
    """check_tensor_shapes, check_batch_size_and_num_heads_dense, nonzero lengths, last-dim
    stride 1 (sdp_utils_cpp.h)."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa:
        if same_heads and hk != hv:
            return False
        if hq % hk != 0 or (not same_heads and hq % hv != 0):
            return False
    elif not (hq == hk == hv):
        return False
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return False

    def stride_ok(t):
        return t.stride(-1) == 1 or (ignore_singleton and t.shape[-1] == 1)
    return stride_ok(q) and stride_ok(k) and stride_ok(v)


def _mask_shape_ok(mask, q, k):
    """check_attn_mask_shape: no grad; 2-D or 4-D broadcastable to (B, H, L, S)."""
    if mask is None:
        return True
    if mask.requires_grad:
        return False
    if mask.shape[-2] not in (q.shape[2], 1) or mask.shape[-1] not in (k.shape[2], 1):
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and mask.shape[0] in (1, q.shape[0]) and mask.shape[1] in (1, q.shape[1])


def can_use_cudnn(q, k, v, mask, dropout_p, is_causal, enable_gqa):
    if not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _HALF):
        return False
    if not _mask_shape_ok(mask, q, k):
        return False
    # (Newer sdp_utils.cpp also refuse a dropout that is not a multiple of 1/16; torch 2.11
    # does not: its GPU-host capture of the Conformer ran cuDNN at p = 0.1.)
    if not _dense_common(q, k, v, enable_gqa, False, True):
        return False
    b, h, s_q, d_qk = q.shape
    s_k, d_v = k.shape[2], v.shape[3]
    if b > 65535 or h > 65535:
        return False
    sm90 = SM[0] in (9, 10)
    limit = 256 if (sm90 and CUDNN_D256) else (192 if sm90 and d_qk == 192 and d_v == 128 else 128)
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1 or (dropout_p != 0.0 and s_q == 1):
        return False
    if _requires_grad(q, k, v) and sm90 and CUDNN_D256:
        if not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))):
            return False
    return True


def can_use_flash(q, k, v, mask, dropout_p, is_causal, enable_gqa):
    if not (q.dim() == k.dim() == v.dim() == 4) or mask is not None:
        return False
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] <= 256):
        return False
    if is_causal and q.shape[-2] != k.shape[-2]:
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _HALF):
        return False
    return _dense_common(q, k, v, enable_gqa, True, True)


def can_use_efficient(q, k, v, mask, dropout_p, is_causal, enable_gqa):
    if not (q.dim() == k.dim() == v.dim() == 4):
        return False
    half = q.dtype in _HALF
    align = 8 if half else 4  # minimum_gemm_alignment on sm80+ (tensor cores)
    dq, dv = q.shape[-1], v.shape[-1]
    if not (dq == k.shape[-1] and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        return False
    # check_data_ptr_alignment_mem_efficient: storage offsets aligned to align elements
    if any(t.numel() and t.storage_offset() % align for t in (q, k, v)):
        return False
    if not _dense_common(q, k, v, enable_gqa, True, False):
        return False
    return q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.float32, torch.bfloat16)


def _bool_to_additive(mask, dtype):
    """convert_boolean_attn_mask: a bool mask becomes 0 / -inf in the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf"))


def _preprocess_mask(mask, q, k):
    """preprocess_mask: the memory-efficient kernel's bias, padded to a multiple of 8 in its
    last dimension (then sliced back) unless already aligned, expanded to (B, H, L, S)."""
    aligned = all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1)) and mask.stride(-1) == 1
    if not aligned:
        last = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    aten = torch.ops.aten
    args = (query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    lse = _requires_grad(query, key, value)
    if can_use_cudnn(*args):
        mask = _bool_to_additive(attn_mask, query.dtype)
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale)[0]
    if can_use_flash(*args):
        og = query.shape[-1]
        if og % 8:
            pad = (0, 8 - og % 8)
            query, key, value = F.pad(query, pad), F.pad(key, pad), F.pad(value, pad)
        og_scale = scale if scale is not None else 1.0 / math.sqrt(og)
        out = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=og_scale)[0]
        return out[..., :og] if out.shape[-1] != og else out
    if can_use_efficient(*args):
        mask = _bool_to_additive(attn_mask, query.dtype)
        if mask is not None:
            mask = _preprocess_mask(mask, query, key)
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, lse, dropout_p, is_causal, scale=scale)[0]
    mask = _bool_to_additive(attn_mask, query.dtype)
    return aten._scaled_dot_product_attention_math(
        query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


def cuda_dropout(input, p, train):
    """`at::dropout`: the fused kernel where CUDA's `is_fused_kernel_acceptable` holds."""
    if train and 0.0 < p < 1.0 and input.numel() > 0:
        return torch.ops.aten.native_dropout(input, p, train)[0]
    if not train or p == 0.0:
        return input
    return torch.ops.aten.dropout.default.decompose(input, p, train)


_LIB = []


def install():
    """Registers the kernels once per process (capture on a CPU-only machine)."""
    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        lib.impl("scaled_dot_product_attention", cuda_sdpa, "AutogradCPU")
        lib.impl("dropout", cuda_dropout, "AutogradCPU")
    _LIB.append(lib)


def uninstall():
    """Takes the kernels back (an in-process capture, `vramlab.plan_module`): the CPU's own
    SDPA and dropout run again."""
    while _LIB:
        _LIB.pop()._destroy()

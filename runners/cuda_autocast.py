"""CUDA's autocast policy on a machine without a GPU (imported by capture.py).

Where torch sees no GPU, capture's fake device is the CPU, and `torch.autocast("cpu")`
applies the CPU op lists: `layer_norm`, `softmax`, `pow`, the norms and the losses then run
in bf16 where the GPU host runs them in fp32 (a ConvNeXt-V2 step captured on a CPU-only
machine planned 20 % below the same step captured on the H200 host). This module registers
Python kernels for the `AutocastCPU` dispatch key that apply CUDA's policy instead, mirrored
from `aten/src/ATen/autocast_mode.h` / `autocast_mode.cpp` (torch 2.11):

- `lower_precision_fp` ops cast every eligible (floating, not float64) tensor argument to the
  autocast dtype; fp32 leaf tensors that require grad are cast once per autocast region
  (`cached_cast`'s weight cache, cleared when the region exits);
- `fp32` ops cast eligible arguments to float32;
- `fp32_set_opt_dtype` ops get `dtype=float32` when their first argument is eligible and no
  dtype was given;
- `fp32_append_dtype` (`norm`) re-dispatches to the overload with a dtype, float32;
- `promote` ops cast eligible arguments to the widest floating type among them;
- every other op that has a CPU autocast kernel runs unchanged (CUDA does not list it).

Casts are `Tensor.to(dtype)` calls below the autocast key, as in C++: autograd records them
and the capture's dispatch mode sees their allocations.
"""
import warnings

import torch

LOWER = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
]
FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
]
FP32_SET_OPT_DTYPE = [
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname",
    "log_softmax.int", "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum",
    "cumsum.dimname", "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "sum", "sum.dim_IntList", "sum.dim_DimnameList",
]
# overload -> the overload it re-dispatches to with a trailing dtype
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
PROMOTE = ["addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add"]

_KEY = torch._C.DispatchKey.AutocastCPU


def _op(name):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _eligible(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaAutocast:
    """Installs the kernels once; `region()` wraps one autocast region (the weight cache)."""

    def __init__(self, dtype):
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            self._install(dtype)

    def _install(self, dtype):
        self.dtype = dtype
        self.cache = {}
        # C++ clears its weight-cast cache whenever the autocast nesting drops to 0
        # (torch.autocast.__exit__ → torch.clear_autocast_cache), checkpoint's recompute
        # regions included: so does this cache.
        clear = torch.clear_autocast_cache
        self._clear = clear

        def clear_both():
            self.cache.clear()
            clear()

        torch.clear_autocast_cache = clear_both
        self.lib = torch.library.Library("aten", "IMPL")
        listed = set()
        for name in LOWER:
            self._register(name, self._lower)
            listed.add(name)
        for name in FP32:
            self._register(name, self._fp32)
            listed.add(name)
        for name in FP32_SET_OPT_DTYPE:
            self._register(name, self._set_opt_dtype)
            listed.add(name)
        for name, target in FP32_APPEND_DTYPE.items():
            self._register(name, self._append_dtype(target))
            listed.add(name)
        for name in PROMOTE:
            self._register(name, self._promote)
            listed.add(name)
        # Ops CPU autocast lists and CUDA does not: run them as they are.
        for qual in torch._C._dispatch_get_all_op_names():
            if not qual.startswith("aten::"):
                continue
            name = qual[len("aten::"):]
            if name in listed:
                continue
            try:
                has = torch._C._dispatch_has_kernel_for_dispatch_key(qual, "AutocastCPU")
            except RuntimeError:
                has = False
            if has:
                self._register(name, self._passthrough)

    def _register(self, name, policy):
        op = _op(name)
        if op is None:
            return

        composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd")

        def kernel(*args, **kwargs):
            if policy is CudaAutocast._passthrough and composite:
                # CUDA has no kernel for it: the autocast key falls through and the
                # composite's own calls (cross_entropy_loss → log_softmax, nll_loss) meet
                # the policy one by one.
                return op.decompose(*args, **kwargs)
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
                return policy(op, args, kwargs)

        self.lib.impl(name, kernel, "AutocastCPU")

    def _cast(self, t, to, cache):
        if not _eligible(t) or t.dtype == to:
            return t
        if cache and t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
            hit = self.cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            c = t.to(to)
            self.cache[id(t)] = (t, c)
            return c
        return t.to(to)

    def _map(self, args, kwargs, fn):
        """`fn` over every tensor argument, last argument first: the C++ wrapper casts in a
        parameter-pack expansion whose arguments GCC evaluates right to left, so the bias is
        cast before the weight and the weight before the input. The order fixes the casts'
        autograd sequence numbers, hence the order of their backward nodes."""
        def one(a):
            if isinstance(a, torch.Tensor):
                return fn(a)
            if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
                return type(a)(reversed([fn(x) if isinstance(x, torch.Tensor) else x
                                         for x in reversed(a)]))
            return a
        kw = {k: one(kwargs[k]) for k in reversed(list(kwargs))}
        pos = [one(a) for a in reversed(args)][::-1]
        return pos, {k: kw[k] for k in kwargs}

    def _lower(self, op, args, kwargs):
        a, k = self._map(args, kwargs, lambda t: self._cast(t, self.dtype, True))
        return op(*a, **k)

    def _fp32(self, op, args, kwargs):
        a, k = self._map(args, kwargs, lambda t: self._cast(t, torch.float32, False))
        return op(*a, **k)

    def _set_opt_dtype(self, op, args, kwargs):
        if not (args and _eligible(args[0])):
            return op(*args, **kwargs)
        names = [x.name for x in op._schema.arguments]
        if "dtype" in names:
            i = names.index("dtype")
            if i < len(args):
                if args[i] is None:
                    args = list(args)
                    args[i] = torch.float32
            elif kwargs.get("dtype") is None:
                kwargs = dict(kwargs, dtype=torch.float32)
        return op(*args, **kwargs)

    def _append_dtype(self, target):
        with_dtype = _op(target)

        def policy(op, args, kwargs):
            if not (args and _eligible(args[0])):
                return op(*args, **kwargs)
            return with_dtype(*args, dtype=torch.float32, **kwargs)
        return policy

    def _promote(self, op, args, kwargs):
        ts = [t for t in list(args) + list(kwargs.values()) if _eligible(t)]
        widest = None
        for t in ts:
            widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
        if widest is None:
            return op(*args, **kwargs)
        a, k = self._map(args, kwargs, lambda t: self._cast(t, widest, False))
        return op(*a, **k)

    @staticmethod
    def _passthrough(op, args, kwargs):
        return op(*args, **kwargs)

    def close(self):
        """Takes the kernels and the cache hook back (an in-process capture,
        `vramlab.plan_module`): CPU autocast runs on the CPU's own lists again."""
        self.lib._destroy()
        torch.clear_autocast_cache = self._clear
        self.cache.clear()

    def region(self, enabled):
        """torch.autocast("cpu") with CUDA's policy (the kernels above); the weight cache
        dies with the region through torch.clear_autocast_cache."""
        return torch.autocast("cpu", dtype=self.dtype, enabled=enabled)

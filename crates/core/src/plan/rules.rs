//! Per-op rules: output dtype, autocast casts and which tensors autograd saves.
//!
//! These mirror PyTorch 2.x: the autocast op lists (`autocast_mode.cpp`), the
//! `derivatives.yaml` formulas (what each backward needs), and the Python code of
//! the reference models for composite functions.

use super::config::{DType, Precision};
use super::sdpa_math::{MathShape, OpSteps, math_path};
use crate::model::ir::{Elem, Graph, Node, Op, Pointwise};

/// An extra buffer an op allocates (saved for backward unless `transient`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extra {
    /// Elements per sample.
    pub per_sample: u64,
    /// Elements independent of the batch.
    pub fixed: u64,
    pub dtype: DType,
    /// Freed right after the op's forward (workspace, intermediate) instead of saved.
    pub transient: bool,
    /// Saved only for the gradient of the op's parameters (`weight * x` saves `x` only
    /// when the weight requires grad, `derivatives.yaml` `mul`): with every parameter of
    /// the op frozen (LoRA, QLoRA, frozen parts) autograd does not keep it and it dies
    /// after the op like a temporary.
    pub for_params: bool,
}

/// What one op does to memory in forward.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub out_dtype: DType,
    /// The output is written into input 0's storage (in-place op or view).
    pub alias: bool,
    /// Inputs that autocast casts to another dtype first (index, target dtype).
    pub casts: Vec<(usize, DType)>,
    /// Inputs (after their cast) saved for backward.
    pub saves_inputs: Vec<usize>,
    pub saves_output: bool,
    /// Extra buffers: masks, statistics, clones, temporaries.
    pub extras: Vec<Extra>,
    /// Parameters are cast to the compute dtype by autocast (weight cache).
    pub casts_params: bool,
    /// Transient bytes (elements of the output's dtype, per sample) during backward.
    pub bwd_transient: u64,
    /// Transient bytes independent of the batch during backward (a quantized weight
    /// dequantized for the input gradient).
    pub bwd_fixed: u64,
    /// cuDNN workspaces of a convolution's backward (see [`conv_workspace`]).
    pub conv_ws: ConvWorkspace,
    /// The forward in Python's order, when not empty: the extras allocated and released
    /// as listed around the output, where by default the output comes first and the
    /// temporaries die after it (allocator histories of `LlamaRMSNorm`, and of
    /// `NewGELUActivation`'s chain of Python-level ops: [`Act`], [`chain_order`]). At most
    /// [`ORDERED_EXTRAS`] extras.
    pub order: Vec<Act>,
    /// The op's forward and backward as explicit allocation sequences, in place of the
    /// extras and the computed input gradients (SDPA's math path: [`super::sdpa_math`]).
    pub steps: Option<Box<OpSteps>>,
    /// How the output gradient reaches the inputs (set by [`backward_rule`]).
    pub grad: GradFlow,
    /// SDPA on a fused q/k/v input: dq, dk, dv are separate tensors that the split's
    /// backward concatenates into one input gradient.
    pub fused_qkv_grad: bool,
}

/// Most extras a rule in Python's order ([`Rule::order`]) has.
pub const ORDERED_EXTRAS: usize = 8;

/// A chain of `n` Python-level ops ([`Rule::order`]): the extras made in order, each
/// temporary dying once the next exists, and the output last.
pub fn chain_order(n: usize) -> Vec<Act> {
    let mut order = Vec::with_capacity(2 * n + 1);
    for i in 0..n {
        order.push(Act::Alloc(i as u8));
        if i > 0 {
            order.push(Act::Release(i as u8 - 1));
        }
    }
    if n > 0 {
        order.push(Act::Release(n as u8 - 1));
    }
    order.push(Act::Output);
    order
}

/// One action of an op's forward in [`Rule::order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Extra `i` is allocated.
    Alloc(u8),
    /// Extra `i` loses the op's reference: freed now unless autograd keeps it.
    Release(u8),
    /// The output is allocated.
    Output,
}

/// Which gradient a saved input serves (`derivatives.yaml`): autograd saves it only when
/// that gradient is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedFor {
    /// Any gradient of the op: saved when the output requires grad.
    Output,
    /// The parameters' gradients (`addmm`/`convolution` save their input for the weight
    /// gradient only): saved when a parameter of the op trains.
    Params,
    /// The gradient of input `j` (`mm`: `self` is saved for `mat2`'s gradient and the
    /// other way round).
    Input(usize),
}

/// What saved input `i` of `node` is needed for.
pub fn saved_for(node: &Node, i: usize) -> SavedFor {
    match node.op {
        Op::Linear { .. } | Op::Conv2d { .. } | Op::GroupedMm { .. }
            if i == 0 && !node.params.is_empty() =>
        {
            SavedFor::Params
        }
        Op::Matmul { .. } if node.inputs.len() == 2 && i < 2 => SavedFor::Input(1 - i),
        _ => SavedFor::Output,
    }
}

/// How an op's backward turns its output gradient into input gradients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GradFlow {
    /// Kernels compute new input (and weight) gradients.
    #[default]
    Compute,
    /// The output gradient is input 0's gradient as is (views, in-place appends, casts
    /// that were no-ops).
    Alias,
    /// `AddBackward0` on same-shape, same-dtype operands: every operand gets the output
    /// gradient itself, no new tensor.
    PassThrough,
    /// The loss: `nll_loss` backward, then `log_softmax` backward (and a cast back).
    Loss,
    /// An output of `torch.chunk`: its gradient waits for its siblings'; the first chunk
    /// (the last one reached in backward) concatenates them into the input's gradient.
    Chunk,
}

/// Bytes of the workspaces cuDNN takes for one convolution's backward: `per_sample` scales
/// with the batch, `fixed` does not. Allocated after the tensor the kernel writes (the input
/// gradient, the weight gradient) and freed when the kernel returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConvWorkspace {
    pub data: (u64, u64),
    pub filter: (u64, u64),
}

impl Rule {
    fn new(out_dtype: DType) -> Self {
        Rule {
            out_dtype,
            alias: false,
            casts: Vec::new(),
            saves_inputs: Vec::new(),
            saves_output: false,
            extras: Vec::new(),
            casts_params: false,
            bwd_transient: 0,
            bwd_fixed: 0,
            conv_ws: ConvWorkspace::default(),
            order: Vec::new(),
            steps: None,
            grad: GradFlow::Compute,
            fused_qkv_grad: false,
        }
    }
}

/// Completes `r` with its backward behaviour, once the dtypes of the node's inputs and
/// output are known (`dtypes`, by tensor).
pub fn backward_rule(g: &Graph, node: &Node, r: &mut Rule, dtypes: &[DType]) {
    r.fused_qkv_grad = matches!(node.op, Op::Sdpa { .. }) && node.inputs.len() == 1;
    r.grad = if matches!(node.op, Op::CrossEntropy { .. }) {
        GradFlow::Loss
    } else if node.op == Op::Chunk {
        GradFlow::Chunk
    } else if matches!(node.op, Op::View | Op::CacheAppend | Op::SumTopK)
        || (r.alias
            && matches!(
                node.op,
                Op::ToComputeDtype | Op::ToF32 | Op::SdpaOutContiguous | Op::TypeAs
            ))
    {
        GradFlow::Alias
    } else if passes_grad_through(g, node, dtypes) {
        GradFlow::PassThrough
    } else {
        GradFlow::Compute
    };
}

/// Whether `node` hands its output gradient to its inputs unchanged, as `AddBackward0`
/// does for same-shape, same-dtype operands (no new tensor). A parameter operand (a
/// broadcast position embedding) needs its gradient summed over the batch.
fn passes_grad_through(g: &Graph, node: &Node, dtypes: &[DType]) -> bool {
    matches!(
        node.op,
        Op::Pointwise {
            f: Pointwise::Add,
            ..
        }
    ) && node.params.is_empty()
        && node.inputs.iter().all(|&t| {
            let (a, b) = (&g.tensors[t], &g.tensors[node.output]);
            a.per_sample == b.per_sample && a.fixed == b.fixed && dtypes[t] == dtypes[node.output]
        })
}

fn promote(a: DType, b: DType) -> DType {
    if a == DType::F32 || b == DType::F32 {
        DType::F32
    } else if a.is_low() {
        a
    } else {
        b
    }
}

/// A bitsandbytes base layer (`weight` elements, input `x` in `in0`) as bitsandbytes 0.50
/// runs it in training (M = batch × seq > 1536 rows: the dequantize + `F.linear` path):
///
/// - `Linear4bit.forward`: `x.to(bf16)` (a copy when `x` is not bf16), the weight
///   dequantized into a bf16 tensor for `F.linear`, the bf16 result, then `.to(x.dtype)`:
///   the output is in the input's dtype. `MatMul4Bit` saves only the packed weight; its
///   backward dequantizes it again for the input gradient (`grad_output @ W`), in bf16.
/// - `Linear8bitLt` (`MatMul8bitLt`, threshold 6.0): `x.to(fp16)`, its int8 row-wise
///   quantization and the int32 product are temporaries; the input itself is kept for
///   backward (`ctx.tensors`);
///   the backward dequantizes `CB * SCB / 127` in the input's dtype.
fn quant_linear(weight: u64, in0: DType, in_elems: u64, out_elems: u64, int8: bool) -> Rule {
    let mut r = Rule::new(in0);
    if int8 {
        r.extras.push(temp(in_elems, DType::F16));
        r.extras.push(temp(in_elems, DType::U8));
        // int8_scaled_mm's int32 result before its dequantization (4 bytes, as fp32).
        r.extras.push(temp(out_elems, DType::F32));
        r.saves_inputs = vec![0];
        r.bwd_fixed = weight * in0.size();
        return r;
    }
    if in0 != DType::BF16 {
        r.extras.push(temp(in_elems, DType::BF16));
        r.extras.push(temp(out_elems, DType::BF16));
        // Backward: the output gradient cast to bf16 and the bf16 input gradient before
        // its cast back (elements of the output's dtype).
        r.bwd_transient = (out_elems + in_elems) * 2 / in0.size();
    }
    r.extras.push(Extra {
        per_sample: 0,
        fixed: weight,
        dtype: DType::BF16,
        transient: true,
        for_params: false,
    });
    r.bwd_fixed = weight * DType::BF16.size();
    r
}

fn extra(per_sample: u64, dtype: DType) -> Extra {
    Extra {
        per_sample,
        fixed: 0,
        dtype,
        transient: false,
        for_params: false,
    }
}

/// A tensor saved only for the parameters' gradient (see [`Extra::for_params`]).
fn param_saved(per_sample: u64, dtype: DType) -> Extra {
    Extra {
        for_params: true,
        ..extra(per_sample, dtype)
    }
}

fn temp(per_sample: u64, dtype: DType) -> Extra {
    Extra {
        per_sample,
        fixed: 0,
        dtype,
        transient: true,
        for_params: false,
    }
}

/// A convolution as cuDNN sees it (per-sample elements).
struct ConvShape {
    transposed: bool,
    kernel: u64,
    groups: u64,
    out_channels: u64,
    in_elems: u64,
    out_elems: u64,
    weight: u64,
}

/// cuDNN 9 workspaces of one convolution with PyTorch's default NCHW tensors (measured per
/// convolution with `lab/device/conv_workspace.py` on every convolution of the measured CNN and
/// segmentation configs: `tests/data/conv_workspace.jsonl.gz`, H100/H200, cuDNN 9.19).
/// Returns the forward workspace in elements of `dt` (per sample, fixed) and the
/// backward ones in bytes.
///
/// - Depthwise convolutions run PyTorch's own kernels: no workspace.
/// - A 1×1 stride-1 convolution is a GEMM on NCHW data: no forward or input-gradient
///   workspace; the weight gradient is reduced over the batch through fp32 partials
///   (one weight's worth per sample).
/// - Every other dense convolution (3×3, 7×7, strided 1×1, dilated, transposed 2×2) runs
///   an NHWC kernel behind layout transforms: each of the three kernels takes a workspace
///   the size of its input, output and weight together (median ratio 1.00 over 500
///   convolutions), the weight-gradient one a few weights more.
/// - A patchify convolution (kernel = stride ≥ 4, ConvNeXt's stem) takes none in forward.
fn conv_workspace(c: &ConvShape, dt: DType) -> ((u64, u64), ConvWorkspace) {
    let none = ((0, 0), ConvWorkspace::default());
    let k2 = c.kernel.saturating_mul(c.kernel);
    if c.out_channels == 0 || k2 == 0 || c.groups == 0 {
        return none;
    }
    // Weights are (out, in / groups, k, k), transposed (in, out / groups, k, k).
    let in_channels = if c.transposed {
        c.weight / k2.saturating_mul((c.out_channels / c.groups).max(1))
    } else {
        c.weight.saturating_mul(c.groups) / c.out_channels.saturating_mul(k2)
    };
    if in_channels == 0 {
        return none;
    }
    if c.groups > 1 && c.groups == in_channels {
        return none;
    }
    let spatial_in = c.in_elems / in_channels;
    let spatial_out = c.out_elems / c.out_channels;
    let strided = !c.transposed && spatial_out < spatial_in;
    let b = dt.size();
    if c.kernel == 1 && !strided && !c.transposed {
        if spatial_in <= 1 {
            return none;
        }
        // Split over the batch while that stays within ~3× the layout-transform path's
        // input + output; past it cuDNN takes the transform path (measured both ways).
        let split = c.weight.saturating_mul(DType::F32.size());
        let transform = (c.in_elems.saturating_add(c.out_elems)).saturating_mul(b);
        let filter = if split > transform.saturating_mul(3) {
            transform
        } else {
            split
        };
        let ws = ConvWorkspace {
            data: (0, 0),
            filter: (filter, 0),
        };
        return ((0, 0), ws);
    }
    if c.kernel >= 4 && strided && spatial_in == spatial_out * k2 {
        return none;
    }
    if in_channels < 4 && !c.transposed {
        return stem_workspace(c, dt, in_channels, spatial_in);
    }
    // Sizes are bounded by the graph's checked arithmetic; saturate rather than wrap anyway.
    let per_sample = c.in_elems.saturating_add(c.out_elems);
    let bytes = per_sample.saturating_mul(b);
    let weight = c.weight.saturating_mul(b);
    // The weight-gradient kernel reduces over batch × pixels in split-K fp32 partials:
    // 15 weights' worth (27 in 16-bit) for small filters, for large ones about 2.36 M
    // (2.0 M) elements but never less than one weight (fitted on 1 400 measured 3×3
    // weight gradients: the excess over input + output is flat in batch and pixels).
    let (splits, cap) = if b == 4 {
        (15, 2_359_296)
    } else {
        (27, 2_000_000)
    };
    let partials = c.weight.saturating_mul(splits).min(c.weight.max(cap));
    let ws = ConvWorkspace {
        data: (bytes, weight),
        filter: (bytes, partials.saturating_mul(b)),
    };
    ((per_sample, c.weight), ws)
}

/// Workspaces of a convolution on a 1–3 channel image (a network's stem), whose NHWC kernels
/// first pad the channels: to 4 in fp32 and for fp16 7×7 stems, else to 8. Measured (same
/// data as [`conv_workspace`]): 3×3 stems take no forward workspace and, in fp32, none at all;
/// 16-bit 3×3 weight gradients take input + output + the padded input; 7×7 stems take input +
/// output + weight in fp32 forward, + the padded input in 16-bit, and their weight gradient
/// input + output + padded input + about 6 MiB of partials.
fn stem_workspace(
    c: &ConvShape,
    dt: DType,
    in_channels: u64,
    spatial_in: u64,
) -> ((u64, u64), ConvWorkspace) {
    let b = dt.size();
    let large = c.kernel >= 5;
    let pad_to = if dt == DType::F32 || (large && dt == DType::F16) {
        4
    } else {
        8
    };
    let io = c.in_elems.saturating_add(c.out_elems);
    let pad = spatial_in.saturating_mul(pad_to - in_channels);
    if !large {
        if dt == DType::F32 {
            return ((0, 0), ConvWorkspace::default());
        }
        let ws = ConvWorkspace {
            data: (0, 0),
            filter: (io.saturating_add(pad).saturating_mul(b), 0),
        };
        return ((0, 0), ws);
    }
    let fwd = if dt == DType::F32 {
        io
    } else {
        io.saturating_add(pad)
    };
    let partials = if dt == DType::F16 { 0 } else { 6 << 20 };
    let ws = ConvWorkspace {
        data: (0, 0),
        filter: (io.saturating_add(pad).saturating_mul(b), partials),
    };
    ((fwd, c.weight), ws)
}

/// Computes the rule for `node` given its inputs' dtypes.
#[allow(
    clippy::too_many_lines,
    reason = "one arm per op: the table reads best in one place"
)]
pub fn rule(
    g: &Graph,
    node: &Node,
    inputs: &[DType],
    prec: Precision,
    checkpointing: bool,
) -> Rule {
    let pd = prec.param_dtype();
    let lp = prec.compute_dtype();
    let amp = prec.autocast();
    let in0 = inputs.first().copied().unwrap_or(pd);
    let out_elems = g.tensors[node.output].per_sample;
    let in_elems = |i: usize| node.inputs.get(i).map_or(0, |&t| g.tensors[t].per_sample);
    // Casts every floating input that is not already in `to`.
    let cast_all = |r: &mut Rule, to: DType| {
        for (i, &d) in inputs.iter().enumerate() {
            let is_float = g.tensors[node.inputs[i]].elem == Elem::Float;
            if is_float && d != to {
                r.casts.push((i, to));
            }
        }
    };
    let params_promote = |d: DType| {
        if node.params.is_empty() {
            d
        } else {
            promote(d, pd)
        }
    };
    match &node.op {
        Op::Input => {
            let t = &g.tensors[node.output];
            let d = if t.elem == Elem::Int64 {
                DType::I64
            } else {
                pd
            };
            Rule::new(d)
        }
        Op::Constant => Rule::new(match g.tensors[node.output].elem {
            Elem::Int64 => DType::I64,
            Elem::Float => pd,
        }),
        Op::Linear { .. } | Op::Conv2d { .. } | Op::Matmul { .. } => {
            let mut r = Rule::new(if amp { lp } else { in0 });
            if amp {
                cast_all(&mut r, lp);
                r.casts_params = !node.params.is_empty();
            }
            r.saves_inputs = (0..inputs.len()).collect();
            if let Op::Conv2d {
                transposed,
                kernel,
                groups,
                out_channels,
            } = node.op
            {
                let weight = node.params.first().map_or(0, |&p| g.params[p].elems);
                let shape = ConvShape {
                    transposed,
                    kernel,
                    groups,
                    out_channels,
                    in_elems: in_elems(0),
                    out_elems,
                    weight,
                };
                let dt = r.out_dtype;
                let (fwd, ws) = conv_workspace(&shape, dt);
                if fwd.0 > 0 || fwd.1 > 0 {
                    r.extras.push(Extra {
                        per_sample: fwd.0,
                        fixed: fwd.1,
                        dtype: dt,
                        transient: true,
                        for_params: false,
                    });
                }
                r.conv_ws = ws;
            }
            r
        }
        Op::Embedding => {
            let mut r = Rule::new(pd);
            r.saves_inputs = (0..inputs.len()).collect();
            r
        }
        Op::BatchNorm { channels } => {
            let mut r = Rule::new(in0);
            r.saves_inputs = vec![0];
            r.extras.push(Extra {
                per_sample: 0,
                fixed: 2 * channels,
                dtype: DType::F32,
                transient: false,
                for_params: false,
            });
            r
        }
        Op::LayerNorm { rows } => {
            let out = if amp { DType::F32 } else { in0 };
            let mut r = Rule::new(out);
            if amp {
                cast_all(&mut r, DType::F32);
            }
            r.saves_inputs = vec![0];
            r.extras.push(extra(2 * rows, DType::F32));
            r
        }
        Op::RmsNorm { .. } => {
            // `LlamaRMSNorm.forward`: x.to(fp32) → variance = x.pow(2).mean(-1) → x * rsqrt(
            // variance + eps) → weight * x.to(input_dtype). The output comes last and the
            // fp32 product lives until the function returns (allocator history of c26-06,
            // Llama-2-7B bf16: modeling_llama.py lines 64-67).
            use Act::{Alloc, Output, Release};
            if in0 == DType::F32 {
                let mut r = Rule::new(params_promote(DType::F32));
                r.saves_inputs = vec![0];
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
                r.extras.push(param_saved(out_elems, DType::F32)); // x * rsqrt, saved by weight * x
                r.order = vec![Alloc(0), Release(0), Alloc(1), Output, Release(1)];
                r
            } else {
                let mut r = Rule::new(params_promote(in0));
                r.extras.push(extra(out_elems, DType::F32)); // fp32 copy, saved by pow and mul
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
                r.extras.push(temp(out_elems, DType::F32)); // x * rsqrt before the cast
                r.extras.push(param_saved(out_elems, in0)); // normalised, cast back, saved by weight * x
                r.order = vec![
                    Alloc(0),
                    Alloc(1),
                    Release(1),
                    Alloc(2),
                    Release(0),
                    Alloc(3),
                    Output,
                    Release(3),
                    Release(2),
                ];
                r
            }
        }
        Op::T5LayerNorm { .. } => t5_layer_norm(in0, pd, out_elems),
        Op::RmsNormOffset { .. } => {
            // x.float() → pow(2).mean → x * rsqrt(var) → · (1 + w.float()) → .type_as(x)
            let mut r = Rule::new(in0);
            if in0 == DType::F32 {
                r.saves_inputs = vec![0];
                r.extras.push(param_saved(out_elems, DType::F32)); // x * rsqrt, saved by · (1 + w)
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
            } else {
                r.extras.push(extra(out_elems, DType::F32)); // fp32 copy, saved by pow and mul
                r.extras.push(param_saved(out_elems, DType::F32)); // x * rsqrt, saved by · (1 + w)
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
                r.extras.push(temp(out_elems, DType::F32)); // the fp32 product before the cast
            }
            r
        }
        Op::Pointwise { f, inplace } => pointwise(
            *f,
            *inplace,
            inputs,
            in0,
            prec,
            params_promote,
            out_elems,
            in_elems(0),
        ),
        Op::GeluNewPython => {
            // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
            // In Python's order (allocator history of GPT-2 under AMP bf16, H200): 0.5 * x,
            // pow (on autocast's fp32 list: its input is cast and saved), 0.044715 * ·,
            // x + ·, sqrt(2/π) * ·, tanh (saves its output), 1 + ·, then the product.
            let wide = if amp { DType::F32 } else { in0 };
            let mut r = Rule::new(wide);
            r.extras.push(extra(out_elems, in0)); // 0.5 * x
            if amp && in0 != DType::F32 {
                r.extras.push(extra(out_elems, DType::F32));
            } else {
                r.saves_inputs = vec![0];
            }
            for _ in 0..4 {
                r.extras.push(temp(out_elems, wide)); // pow, 0.044715·, x + ·, sqrt(2/π)·
            }
            r.extras.push(extra(out_elems, wide)); // tanh output
            r.extras.push(extra(out_elems, wide)); // 1 + tanh
            r.order = chain_order(r.extras.len());
            r
        }
        Op::Softmax { fp32 } => {
            let out = if amp || *fp32 { DType::F32 } else { in0 };
            let mut r = Rule::new(out);
            if out == DType::F32 && in0 != DType::F32 {
                r.extras.push(temp(in_elems(0), DType::F32));
            }
            r.saves_output = true;
            // CUDA's `softmax_backward_cuda_out` (PyTorch SoftMax.cu) computes
            // `Tensor tmp = grad * output;` before the kernel: one more output-sized tensor
            // beside the gradients (the per-op trace tests/data/t5_sdpa_ops.jsonl shows it as
            // `_softmax_backward_data`'s hidden allocation, one score matrix).
            r.bwd_transient = out_elems;
            r
        }
        Op::QuantLinear {
            in_features,
            out_features,
            int8,
        } => quant_linear(
            *in_features * *out_features,
            in0,
            in_elems(0),
            out_elems,
            *int8,
        ),
        Op::ToComputeDtype => {
            let mut r = Rule::new(lp);
            r.alias = in0 == lp;
            r
        }
        Op::ToF32 => {
            let mut r = Rule::new(DType::F32);
            r.alias = in0 == DType::F32;
            r
        }
        Op::Dropout { inplace, .. } => {
            // `dropout_cuda` (aten/src/ATen/native/cuda/Dropout.cu) makes the bool mask,
            // then the output (allocator history of c26-06: the 180 MiB mask before the
            // 720 MiB result at functional.py's `dropout`).
            let mut r = Rule::new(in0);
            r.alias = *inplace;
            r.extras.push(extra(out_elems, DType::Bool));
            r.order = vec![Act::Alloc(0), Act::Output, Act::Release(0)];
            r
        }
        Op::MaxPool => {
            let mut r = Rule::new(in0);
            r.saves_inputs = vec![0];
            r.extras.push(extra(out_elems, DType::I64));
            r
        }
        Op::AvgPool => {
            let mut r = Rule::new(in0);
            r.saves_inputs = vec![0];
            r
        }
        Op::Upsample => Rule::new(in0),
        Op::Concat => {
            let d = inputs.iter().fold(in0, |a, &b| promote(a, b));
            Rule::new(params_promote(d))
        }
        Op::View | Op::Chunk => {
            let mut r = Rule::new(in0);
            r.alias = true;
            r
        }
        Op::Copy => Rule::new(in0),
        Op::SdpaOutContiguous => {
            let mut r = Rule::new(in0);
            r.alias = in0.is_low();
            r
        }
        Op::CacheAppend => {
            let d = if checkpointing {
                in0
            } else {
                inputs.iter().fold(in0, |a, &b| promote(a, b))
            };
            let mut r = Rule::new(d);
            // Gradient checkpointing turns the cache off: the op is the identity then.
            r.alias = checkpointing;
            r
        }
        Op::Rope => {
            // q * cos + rotate_half(q) * sin; cos/sin are in the hidden-state dtype.
            let out = promote(in0, pd);
            let mut r = Rule::new(out);
            r.extras.push(temp(out_elems, out));
            r.extras.push(temp(out_elems, in0));
            r
        }
        Op::Sdpa {
            heads,
            kv_heads,
            head_dim,
            seq,
            dropout,
        } if heads != kv_heads && !amp && in0 == DType::F32 => {
            // Math fallback (`_scaled_dot_product_attention_math`), step by step in
            // [`super::sdpa_math`]. Grouped kv heads are the decoders', which transformers
            // calls with `is_causal=True` in training (no padding mask): the causal mask is
            // built per call.
            let mut r = Rule::new(DType::F32);
            r.steps = Some(Box::new(math_path(MathShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
                seq: *seq,
                dropout: *dropout,
                causal: true,
            })));
            r
        }
        // The fused kernels; with a float mask that does not train (T5 cross-attention's
        // zeros) the memory-efficient one, which also saves the mask.
        Op::Sdpa {
            heads, seq: q_len, ..
        }
        | Op::SdpaBias {
            heads,
            q_len,
            bias_grad: false,
            ..
        } => {
            let mut r = Rule::new(if amp { lp } else { in0 });
            if amp {
                cast_all(&mut r, lp);
            }
            r.saves_inputs = (0..inputs.len()).collect();
            r.saves_output = true;
            // logsumexp (fp32, rows padded to 32 by the memory-efficient kernel)
            r.extras
                .push(extra(heads * q_len.div_ceil(32) * 32, DType::F32));
            r
        }
        Op::GroupedMm { .. } => {
            // `input.to(weight.dtype)`, then the grouped GEMM in the weight's dtype.
            let mut r = Rule::new(pd);
            if in0 != pd {
                r.casts.push((0, pd));
            }
            r.saves_inputs = vec![0];
            r
        }
        Op::TopK => {
            let mut r = Rule::new(in0);
            r.extras.push(extra(out_elems, DType::I64)); // indices, saved by TopkBackward
            r
        }
        Op::Gather { indices, mask } => {
            let mut r = Rule::new(in0);
            // `torch.gather(x, dim, index)` with the int64 index as input 1 (DeBERTa):
            // its backward saves `self` and the index.
            let gather = node.inputs.len() > 1 && g.tensors[node.inputs[1]].elem == Elem::Int64;
            if gather {
                r.saves_inputs = vec![0, 1];
            }
            r.extras.push(extra(*indices, DType::I64));
            if *mask > 0 {
                r.extras.push(extra(*mask, DType::Bool));
            }
            r
        }
        Op::SumTopK => Rule::new(in0),
        Op::TypeAs => {
            let to = inputs.get(1).copied().unwrap_or(in0);
            let mut r = Rule::new(to);
            r.alias = in0 == to;
            r
        }
        Op::SdpaBias {
            heads,
            head_dim,
            q_len,
            kv_len,
            dropout,
            bias_grad: true,
        } => {
            // The float mask of `create_position_bias_mask` requires grad (T5's learned
            // relative position bias): SDPA runs its math backend
            // (`_scaled_dot_product_attention_math`, decomposed into ATen ops: the per-op
            // trace `tests/data/t5_sdpa_ops.jsonl` shows `bmm`, `add`, `_safe_softmax`,
            // `native_dropout`, `bmm` there and no fused kernel, while the cross-attention
            // beside it runs cuDNN or the memory-efficient kernel). q, k, v
            // are upcast to fp32 when bf16/fp16; q·√s and kᵀ·√s are saved by the first
            // matmul; the scores get the mask added in place; the fp32 softmax is saved,
            // then dropout's mask and output (saved by the second matmul with v); the fp32
            // result is cast back to the input dtype.
            let out_dt = if amp { lp } else { in0 };
            let mut r = Rule::new(out_dt);
            if amp {
                cast_all(&mut r, lp);
            }
            let low = out_dt != DType::F32;
            let q = heads * q_len * head_dim;
            let kv = heads * kv_len * head_dim;
            let scores = heads * q_len * kv_len;
            r.extras.push(extra(q, DType::F32));
            r.extras.push(extra(kv, DType::F32));
            if low {
                r.extras.push(extra(kv, DType::F32));
            } else {
                r.saves_inputs = vec![2];
            }
            r.extras.push(temp(scores, DType::F32));
            r.extras.push(extra(scores, DType::F32));
            if *dropout > 0.0 {
                r.extras.push(extra(scores, DType::Bool));
                r.extras.push(extra(scores, DType::F32));
            }
            if low {
                r.extras.push(temp(q, DType::F32));
            }
            // Backward (the trace): two fp32 score-sized gradients live beside the saved
            // probabilities — the probabilities' and dropout's, then dropout's and the
            // scores' (softmax backward); the scores' gradient is also the mask's, summed
            // over the batch.
            let grads = 2 * scores;
            r.bwd_transient = grads * DType::F32.size() / out_dt.size();
            r
        }
        Op::CrossEntropy {
            rows,
            classes,
            upcast,
        } => {
            let logits = rows * classes;
            let ls_dtype = if amp || *upcast { DType::F32 } else { in0 };
            let mut r = Rule::new(DType::F32);
            if *upcast && in0 != DType::F32 {
                // Hugging Face's `logits.float()`: a copy log_softmax does not keep.
                r.extras.push(temp(logits, DType::F32));
            } else if amp && in0 != DType::F32 {
                // Under autocast log_softmax reads the low-precision logits and writes fp32
                // (`half_to_float`); measured: one more logits-sized low-precision buffer
                // lives until backward (H200, PyTorch 2.11, tests/data traces).
                r.extras.push(extra(logits, in0));
            }
            r.extras.push(extra(logits, ls_dtype)); // log_softmax output
            r.saves_inputs = vec![1]; // targets
            r
        }
    }
}

/// `T5LayerNorm` (transformers 5.17): `variance = x.to(fp32).pow(2).mean(-1)`,
/// `x * rsqrt(variance)` (fp32 by promotion; saves `x`), `.to(weight.dtype)` only when the
/// weight is 16-bit, then `weight * x` (saves the normalised tensor).
fn t5_layer_norm(in0: DType, pd: DType, out_elems: u64) -> Rule {
    let mut r = Rule::new(if pd.is_low() { pd } else { DType::F32 });
    r.saves_inputs = vec![0];
    if in0 != DType::F32 {
        r.extras.push(extra(out_elems, DType::F32)); // x.to(fp32), saved by pow
    }
    r.extras.push(temp(out_elems, DType::F32)); // pow(2)
    if pd.is_low() {
        r.extras.push(param_saved(out_elems, pd)); // normalised, cast to the weight's dtype
        r.extras.push(temp(out_elems, DType::F32)); // x * rsqrt before the cast
    } else {
        r.extras.push(param_saved(out_elems, DType::F32)); // x * rsqrt, saved by weight * x
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn pointwise(
    f: Pointwise,
    inplace: bool,
    inputs: &[DType],
    in0: DType,
    prec: Precision,
    params_promote: impl Fn(DType) -> DType,
    out_elems: u64,
    in0_elems: u64,
) -> Rule {
    let joined = inputs.iter().fold(in0, |a, &b| promote(a, b));
    let mut r = Rule::new(if inplace { in0 } else { params_promote(joined) });
    r.alias = inplace;
    match f {
        Pointwise::Relu | Pointwise::Sigmoid | Pointwise::Tanh => r.saves_output = true,
        Pointwise::Gelu
        | Pointwise::Silu
        | Pointwise::Hardswish
        | Pointwise::Hardsigmoid
        | Pointwise::Clamp => {
            if inplace {
                // In-place ops whose formula needs the original input save a clone of it.
                r.extras.push(extra(in0_elems, in0));
            } else {
                r.saves_inputs = vec![0];
            }
        }
        Pointwise::Add | Pointwise::Scale => {}
        Pointwise::Mul => r.saves_inputs = (0..inputs.len()).collect(),
        Pointwise::MulByConstTensor => r.saves_inputs = vec![1],
        Pointwise::Pow => {
            if prec.autocast() && in0 != DType::F32 {
                r.out_dtype = DType::F32;
                r.casts.push((0, DType::F32));
            }
            r.saves_inputs = vec![0];
        }
    }
    let _ = out_elems;
    r
}

/// [`conv_workspace`] for a convolution given by its shapes (a captured graph's calls:
/// `in_elems`/`out_elems` per sample, `weight` elements, square `kernel`), for
/// [`super::captured`]: the forward workspace in bytes (per sample, fixed) and the backward
/// ones.
#[allow(
    clippy::too_many_arguments,
    reason = "the convolution's shape, field by field"
)]
pub fn conv_workspace_of(
    transposed: bool,
    kernel: u64,
    groups: u64,
    out_channels: u64,
    in_elems: u64,
    out_elems: u64,
    weight: u64,
    dt: DType,
) -> ((u64, u64), ConvWorkspace) {
    let shape = ConvShape {
        transposed,
        kernel,
        groups,
        out_channels,
        in_elems,
        out_elems,
        weight,
    };
    let ((ps, fx), ws) = conv_workspace(&shape, dt);
    (
        (ps.saturating_mul(dt.size()), fx.saturating_mul(dt.size())),
        ws,
    )
}

#[cfg(test)]
mod tests;

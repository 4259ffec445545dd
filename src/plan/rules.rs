//! Per-op rules: output dtype, autocast casts and which tensors autograd saves.
//!
//! These mirror PyTorch 2.x: the autocast op lists (`autocast_mode.cpp`), the
//! `derivatives.yaml` formulas (what each backward needs), and the Python code of
//! the reference models for composite functions.

use super::config::{DType, Precision};
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
        }
    }
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

fn extra(per_sample: u64, dtype: DType) -> Extra {
    Extra {
        per_sample,
        fixed: 0,
        dtype,
        transient: false,
    }
}

fn temp(per_sample: u64, dtype: DType) -> Extra {
    Extra {
        per_sample,
        fixed: 0,
        dtype,
        transient: true,
    }
}

/// Computes the rule for `node` given its inputs' dtypes.
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
        Op::Constant => Rule::new(pd),
        Op::Linear { .. } | Op::Conv2d { .. } | Op::Matmul => {
            let mut r = Rule::new(if amp { lp } else { in0 });
            if amp {
                cast_all(&mut r, lp);
                r.casts_params = !node.params.is_empty();
            }
            r.saves_inputs = (0..inputs.len()).collect();
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
            // to(fp32) → pow(2).mean → x * rsqrt(var) → .to(input_dtype) → weight * x
            if in0 == DType::F32 {
                let mut r = Rule::new(params_promote(DType::F32));
                r.saves_inputs = vec![0];
                r.extras.push(extra(out_elems, DType::F32)); // x * rsqrt, saved by weight * x
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
                r
            } else {
                let mut r = Rule::new(params_promote(in0));
                r.extras.push(extra(out_elems, DType::F32)); // fp32 copy, saved by pow and mul
                r.extras.push(extra(out_elems, in0)); // normalised, cast back, saved by weight * x
                r.extras.push(temp(out_elems, DType::F32)); // pow(2)
                r.extras.push(temp(out_elems, DType::F32)); // x * rsqrt before the cast
                r
            }
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
            let wide = if amp { DType::F32 } else { in0 };
            let mut r = Rule::new(wide);
            if amp && in0 != DType::F32 {
                // pow is on the fp32 list: its input is cast and saved.
                r.extras.push(extra(out_elems, DType::F32));
            } else {
                r.saves_inputs = vec![0];
            }
            r.extras.push(extra(out_elems, wide)); // tanh output
            r.extras.push(extra(out_elems, wide)); // 1 + tanh
            r.extras.push(extra(out_elems, in0)); // 0.5 * x
            r.extras.push(temp(out_elems, wide)); // pow / inner sums
            r.extras.push(temp(out_elems, wide));
            r
        }
        Op::Softmax { fp32 } => {
            let out = if amp || *fp32 { DType::F32 } else { in0 };
            let mut r = Rule::new(out);
            if out == DType::F32 && in0 != DType::F32 {
                r.extras.push(temp(in_elems(0), DType::F32));
            }
            r.saves_output = true;
            r
        }
        Op::ToComputeDtype => {
            let mut r = Rule::new(lp);
            r.alias = in0 == lp;
            r
        }
        Op::Dropout { inplace, .. } => {
            let mut r = Rule::new(in0);
            r.alias = *inplace;
            r.extras.push(extra(out_elems, DType::Bool));
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
        Op::View => {
            let mut r = Rule::new(in0);
            r.alias = true;
            r
        }
        Op::Copy => Rule::new(in0),
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
            ..
        } if heads != kv_heads && !amp && in0 == DType::F32 => {
            // Math fallback (`_scaled_dot_product_attention_math`): q·√scale, k repeated
            // then ·√scale, v repeated, and the softmax probabilities are saved.
            let qkv = heads * seq * head_dim;
            let probs = heads * seq * seq;
            let mut r = Rule::new(DType::F32);
            r.extras.push(extra(qkv, DType::F32));
            r.extras.push(extra(qkv, DType::F32));
            r.extras.push(extra(qkv, DType::F32));
            r.extras.push(extra(probs, DType::F32));
            r.extras.push(temp(qkv, DType::F32));
            r.bwd_transient = 2 * probs;
            r
        }
        Op::Sdpa { heads, seq, .. } => {
            let mut r = Rule::new(if amp { lp } else { in0 });
            if amp {
                cast_all(&mut r, lp);
            }
            r.saves_inputs = (0..inputs.len()).collect();
            r.saves_output = true;
            // logsumexp (fp32, rows padded to 32 by the memory-efficient kernel)
            r.extras
                .push(extra(heads * seq.div_ceil(32) * 32, DType::F32));
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
        Pointwise::Gelu | Pointwise::Silu | Pointwise::Hardswish | Pointwise::Hardsigmoid => {
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

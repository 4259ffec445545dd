//! SDPA's math fallback in training (`_scaled_dot_product_attention_math`, PyTorch 2.11
//! `aten/src/ATen/native/transformers/attention.cpp`), the path fp32 inputs with grouped kv
//! heads take (`enable_gqa=True`: no fused kernel accepts them), as the explicit sequence of
//! allocations and frees it makes: a composite of ATen ops whose temporaries and saved tensors
//! interleave, which a rule's extras cannot order.
//!
//! Forward, in the source's order (the node's inputs q, k, v):
//! `query = q * √s` (a new tensor in q's transposed layout); with `is_causal` the mask
//! `ones(L, S, bool).tril()` converted to a float bias; `repeat_interleave` of k and v
//! (`expand` + a contiguous `clone` each); `k_rep.transpose(-2, -1) * √s`; `matmul` copies
//! the non-contiguous query contiguous for `bmm` (its operands die when `matmul` returns,
//! unless saved); the fp32 scores, the mask added in place; `_safe_softmax`: `softmax` (a
//! new tensor), `eq(-inf)` (a bool of the scores' shape), `all(dim, keepdim)` per row and
//! `where` into the softmax's storage, the raw scores gone when `attn` is rebound;
//! `native_dropout` with `dropout_p > 0` (its bool mask, then its output); `matmul(attn, v_rep)`
//! (the op's output); then the function's locals go.
//!
//! What autograd saves (`tools/autograd/derivatives.yaml`): `bmm` keeps `mat2` for `self`'s
//! gradient and `self` for `mat2`'s (the contiguous query and the scaled keys), `_safe_softmax`
//! its result, `native_dropout` its mask, the second `bmm` the probabilities and `v_rep`; the
//! scalar multiplications, `add_`, `clone` and `expand` keep nothing.
//!
//! Backward (allocator history of Mistral-7B QLoRA fp32, H100, PyTorch 2.11:
//! `tests/data/traces/h100-c26b-04-*`): each `bmm` backward writes `mat2`'s gradient first;
//! a node releases what it saved before the incoming gradient; `_softmax_backward_data`
//! allocates its result, then CUDA's `grad * output` temporary; the repeated k and v gradients
//! are summed back to the kv heads (`ExpandBackward`), the scaled ones multiplied by √s.

use super::config::DType;

/// Which of the op's gradients a step serves, as bits of the input positions q (1), k (2)
/// and v (4): a tensor is saved, or a backward tensor computed, only when one of them is.
pub type Grads = u8;
/// The query's gradient.
pub const GRAD_Q: Grads = 1;
/// The key's gradient.
pub const GRAD_K: Grads = 2;
/// The value's gradient.
pub const GRAD_V: Grads = 4;

/// Bytes of a tensor: `per_sample` × batch + `fixed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub per_sample: u64,
    pub fixed: u64,
}

/// One allocation event of the sequence. Slots name the tensors; a slot is written once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Forward: a temporary.
    Temp { slot: u8, size: Size },
    /// Forward: a tensor autograd keeps for backward when one of `for_grads` is computed
    /// (and the forward saves at all); otherwise a temporary.
    Saved {
        slot: u8,
        size: Size,
        for_grads: Grads,
    },
    /// The slot's tensor is dropped (a saved one stays with autograd).
    Free(u8),
    /// Forward: the op's output.
    Output,
    /// Backward: a new tensor, computed only when one of `when` is.
    Grad { slot: u8, size: Size, when: Grads },
    /// Backward: autograd releases forward slot `0`'s saved tensor.
    ReleaseSaved(u8),
    /// Backward: the incoming gradient of the op's output is released.
    ReleaseGradOut,
    /// Backward: the slot's tensor becomes the gradient of input position `input` (0, 1, 2).
    InputGrad { input: u8, slot: u8 },
}

/// An op's forward and backward as allocation sequences, with the call they are of.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSteps {
    pub shape: MathShape,
    pub forward: Vec<Step>,
    pub backward: Vec<Step>,
}

impl OpSteps {
    /// The forward steps that allocate, in order (`Temp` and `Saved`), with their sizes.
    pub fn forward_sizes(&self) -> impl Iterator<Item = Size> + '_ {
        self.forward.iter().filter_map(|s| match *s {
            Step::Temp { size, .. } | Step::Saved { size, .. } => Some(size),
            _ => None,
        })
    }

    /// The backward steps that allocate, in order (`Grad`), with their sizes.
    pub fn backward_sizes(&self) -> impl Iterator<Item = Size> + '_ {
        self.backward.iter().filter_map(|s| match *s {
            Step::Grad { size, .. } => Some(size),
            _ => None,
        })
    }
}

/// The shape of one math-path attention call: elements per sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MathShape {
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub seq: u64,
    pub dropout: f64,
    /// `is_causal=True` (a decoder without a padding mask): the mask is built per call.
    pub causal: bool,
}

// Slots of the forward.
const QS: u8 = 0;
const ONES: u8 = 1;
const TRIL: u8 = 2;
const MASK: u8 = 3;
const KREP: u8 = 4;
const VREP: u8 = 5;
const KTS: u8 = 6;
const QC: u8 = 7;
const SCORES: u8 = 8;
const PROBS: u8 = 9;
const NEGINF: u8 = 10;
const ROWS: u8 = 11;
const DMASK: u8 = 12;
const DROPPED: u8 = 13;
// Slots of the backward.
const G_VREP: u8 = 20;
const G_ATTN: u8 = 21;
const G_PROBS: u8 = 22;
const G_SCORES: u8 = 23;
const TMP: u8 = 24;
const G_KTS: u8 = 25;
const G_QC: u8 = 26;
const G_KREP: u8 = 27;
const G_V: u8 = 28;
const G_K: u8 = 29;
const G_Q: u8 = 30;

/// The sizes of one call's tensors (bytes).
struct Sizes {
    q: Size,
    kv: Size,
    /// k or v repeated to the query's heads.
    rep: Size,
    scores: Size,
    /// A bool of the scores' shape.
    bools: Size,
    rows: Size,
    mask_bool: Size,
    mask_f32: Size,
}

impl Sizes {
    fn of(s: &MathShape) -> Sizes {
        let per = |per_sample: u64| Size {
            per_sample,
            fixed: 0,
        };
        let f32 = |elems: u64| per(elems.saturating_mul(DType::F32.size()));
        let q = f32(s.heads.saturating_mul(s.seq).saturating_mul(s.head_dim));
        let score_elems = s.heads.saturating_mul(s.seq).saturating_mul(s.seq);
        let square = s.seq.saturating_mul(s.seq);
        Sizes {
            q,
            kv: f32(s.kv_heads.saturating_mul(s.seq).saturating_mul(s.head_dim)),
            rep: q,
            scores: f32(score_elems),
            bools: per(score_elems),
            rows: per(s.heads.saturating_mul(s.seq)),
            mask_bool: Size {
                per_sample: 0,
                fixed: square,
            },
            mask_f32: Size {
                per_sample: 0,
                fixed: square.saturating_mul(DType::F32.size()),
            },
        }
    }
}

fn temp(slot: u8, size: Size) -> Step {
    Step::Temp { slot, size }
}

fn saved(slot: u8, size: Size, for_grads: Grads) -> Step {
    Step::Saved {
        slot,
        size,
        for_grads,
    }
}

fn grad(slot: u8, size: Size, when: Grads) -> Step {
    Step::Grad { slot, size, when }
}

/// The math path's sequence for fp32 inputs (see the module docs).
pub fn math_path(s: MathShape) -> OpSteps {
    let z = Sizes::of(&s);
    let dropout = s.dropout > 0.0;
    OpSteps {
        shape: s,
        forward: forward(&z, s.causal, dropout),
        backward: backward(&z, dropout),
    }
}

/// The forward, in `_scaled_dot_product_attention_math`'s order.
fn forward(z: &Sizes, causal: bool, dropout: bool) -> Vec<Step> {
    let qk = GRAD_Q | GRAD_K;
    let mut f = vec![temp(QS, z.q)];
    if causal {
        f.extend([
            temp(ONES, z.mask_bool),
            temp(TRIL, z.mask_bool),
            Step::Free(ONES),
            temp(MASK, z.mask_f32),
            Step::Free(TRIL),
        ]);
    }
    f.extend([
        temp(KREP, z.rep),
        // Saved by `attn @ v_rep` for the probabilities' gradient.
        saved(VREP, z.rep, qk),
        // `bmm(query, kᵀ·√s)`: each operand saved for the other's gradient; both die with
        // the `matmul` expression unless saved.
        saved(KTS, z.rep, GRAD_Q),
        saved(QC, z.q, GRAD_K),
        temp(SCORES, z.scores),
        Step::Free(QC),
        Step::Free(KTS),
        // `_safe_softmax`'s result, saved by its backward and by `attn @ v_rep` (v's
        // gradient) when there is no dropout.
        saved(PROBS, z.scores, if dropout { qk } else { qk | GRAD_V }),
        temp(NEGINF, z.bools),
        temp(ROWS, z.rows),
        Step::Free(ROWS),
        Step::Free(NEGINF),
        Step::Free(SCORES),
    ]);
    let attn = if dropout {
        f.extend([
            saved(DMASK, z.bools, qk),
            saved(DROPPED, z.scores, GRAD_V),
            Step::Free(DMASK),
            Step::Free(PROBS),
        ]);
        DROPPED
    } else {
        PROBS
    };
    f.extend([
        Step::Output,
        Step::Free(KREP),
        Step::Free(VREP),
        Step::Free(QS),
    ]);
    if causal {
        f.push(Step::Free(MASK));
    }
    f.push(Step::Free(attn));
    f
}

/// The backward: `attn @ v_rep` (v_rep's gradient first), dropout, `_safe_softmax`,
/// `query @ kᵀ·√s`, then the scalings and the sums over the repeated heads.
fn backward(z: &Sizes, dropout: bool) -> Vec<Step> {
    let qk = GRAD_Q | GRAD_K;
    let mut b = vec![
        grad(G_VREP, z.rep, GRAD_V),
        grad(G_ATTN, z.scores, qk),
        Step::ReleaseSaved(VREP),
    ];
    // Without dropout the probabilities stay saved by `_safe_softmax`'s backward.
    if dropout {
        b.push(Step::ReleaseSaved(DROPPED));
    }
    b.push(Step::ReleaseGradOut);
    let g_probs = if dropout {
        b.extend([
            grad(G_PROBS, z.scores, qk),
            Step::ReleaseSaved(DMASK),
            Step::Free(G_ATTN),
        ]);
        G_PROBS
    } else {
        G_ATTN
    };
    b.extend([
        grad(G_SCORES, z.scores, qk),
        // CUDA's `softmax_backward_cuda_out`: `Tensor tmp = grad * output`.
        grad(TMP, z.scores, qk),
        Step::Free(TMP),
        Step::ReleaseSaved(PROBS),
        Step::Free(g_probs),
        grad(G_KTS, z.rep, GRAD_K),
        grad(G_QC, z.q, GRAD_Q),
        Step::ReleaseSaved(QC),
        Step::ReleaseSaved(KTS),
        Step::Free(G_SCORES),
        grad(G_KREP, z.rep, GRAD_K),
        Step::Free(G_KTS),
        grad(G_V, z.kv, GRAD_V),
        Step::Free(G_VREP),
        Step::InputGrad {
            input: 2,
            slot: G_V,
        },
        grad(G_K, z.kv, GRAD_K),
        Step::Free(G_KREP),
        Step::InputGrad {
            input: 1,
            slot: G_K,
        },
        grad(G_Q, z.q, GRAD_Q),
        Step::Free(G_QC),
        Step::InputGrad {
            input: 0,
            slot: G_Q,
        },
    ]);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// c26b-04's attention call (Mistral-7B: 32 heads, 8 kv heads of 128, 512 tokens) at
    /// batch 8, against its allocator history (`tests/data/traces/h100-c26b-04-*`, one layer's
    /// recomputation and backward, events 80465–80717 of the measured step).
    #[test]
    fn the_sequence_is_the_recorded_one_at_c26b_04s_shape() {
        let steps = math_path(MathShape {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            seq: 512,
            dropout: 0.0,
            causal: true,
        });
        let at8 = |s: Size| s.per_sample * 8 + s.fixed;
        let (m, k) = (1u64 << 20, 1u64 << 10);
        let forward: Vec<u64> = steps.forward_sizes().map(at8).collect();
        assert_eq!(
            forward,
            [
                64 * m,  // query · √s
                256 * k, // ones(L, S) bool
                256 * k, // .tril()
                m,       // the float causal bias
                64 * m,  // k repeated
                64 * m,  // v repeated
                64 * m,  // kᵀ · √s
                64 * m,  // the contiguous query of `matmul`
                256 * m, // the fp32 scores
                256 * m, // `_safe_softmax`'s probabilities
                64 * m,  // `isneginf` (`eq(-inf)`), a bool of the scores' shape
                128 * k, // `all(dim, keepdim)` per row
            ]
        );
        let saved: u64 = steps
            .forward
            .iter()
            .filter_map(|s| match *s {
                Step::Saved { size, .. } => Some(at8(size)),
                _ => None,
            })
            .sum();
        assert_eq!(
            saved,
            (3 * 64 + 256) * m,
            "v_rep, kᵀ·√s, the query, the probabilities"
        );
        let output = steps.forward.iter().position(|s| *s == Step::Output);
        let last_new = steps
            .forward
            .iter()
            .rposition(|s| matches!(s, Step::Temp { .. } | Step::Saved { .. }));
        assert!(output > last_new, "the output comes after every temporary");
        let backward: Vec<u64> = steps.backward_sizes().map(at8).collect();
        assert_eq!(
            backward,
            [
                64 * m,  // v_rep's gradient (`bmm`'s mat2 first)
                256 * m, // the probabilities' gradient
                256 * m, // `_softmax_backward_data`'s result
                256 * m, // its `grad * output`
                64 * m,  // (kᵀ·√s)'s gradient
                64 * m,  // the contiguous query's
                64 * m,  // · √s: k_rep's
                16 * m,  // v's, summed over the repeated heads
                16 * m,  // k's
                64 * m,  // q's, · √s
            ]
        );
    }

    /// With dropout, `native_dropout`'s mask and output are saved (the mask for its backward,
    /// the output by `attn @ v_rep`), and its backward adds one score-sized gradient.
    #[test]
    fn dropout_adds_its_mask_its_output_and_one_gradient() {
        let shape = MathShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            seq: 16,
            dropout: 0.1,
            causal: false,
        };
        let with = math_path(shape);
        let without = math_path(MathShape {
            dropout: 0.0,
            ..shape
        });
        let scores = 4 * 16 * 16;
        let added: Vec<u64> = with.forward_sizes().map(|s| s.per_sample).collect();
        let base: Vec<u64> = without.forward_sizes().map(|s| s.per_sample).collect();
        assert_eq!(added.len(), base.len() + 2);
        assert_eq!(added[base.len()..], [scores, scores * 4]);
        assert_eq!(
            with.backward_sizes().count(),
            without.backward_sizes().count() + 1
        );
    }
}

//! gpt-oss's eager attention with learned sinks (transformers 5.17,
//! `models/gpt_oss/modeling_gpt_oss.py`, `eager_attention_forward`). transformers 5.17
//! refuses SDPA (and flash attention without its kernel) for gpt_oss, so this is what a
//! training step runs:
//!
//! `repeat_kv` copies of k and v → `q·kᵀ · scaling` → `+ mask` → `cat([scores, sinks])`
//! (one more column per row, the `sinks` parameter of one logit per head broadcast) →
//! `- max(dim=-1).values` (the max saves its int64 indices) → `softmax` (saves its output,
//! `seq × (seq + 1)` per head) → `[..., :-1]` (a view) → dropout →
//! `.to(value.dtype)` (a copy under autocast, whose scores are fp32 after the fp32 mask) →
//! `· v` → `transpose(1, 2).contiguous()`.

use super::transformer::AttnShape;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, Pointwise, TensorId};

/// The attention core on the projected, rotated `q` and the cached `k`, `v`; returns the
/// `(seq, heads, head_dim)` output.
pub fn attention(
    b: &mut GraphBuilder,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    a: AttnShape,
) -> TensorId {
    let (s, h, d) = (a.seq, a.heads, a.head_dim);
    let full = s * h * d;
    let (k, v) = if a.kv_heads != h {
        let k = b.op(Op::Copy, &[k], full, &[], "self_attn.repeat_k");
        let v = b.op(Op::Copy, &[v], full, &[], "self_attn.repeat_v");
        (k, v)
    } else {
        (k, v)
    };
    let scores = h * s * s;
    let x = b.op(
        Op::Matmul {
            batch: h,
            m: s,
            k: d,
            n: s,
        },
        &[q, k],
        scores,
        &[],
        "self_attn.qk",
    );
    let x = b.pointwise(x, Pointwise::Scale, false, "self_attn.scale");
    let mask = b.constant(s * s, "self_attn.mask");
    let x = b.binary(x, mask, Pointwise::Add, false, "self_attn.add_mask");
    let sinks = b.param(h, None);
    let wide = h * s * (s + 1);
    let x = b.op(Op::Concat, &[x], wide, &[sinks], "self_attn.cat_sinks");
    let max = b.op(Op::TopK, &[x], h * s, &[], "self_attn.max");
    let x = b.binary(x, max, Pointwise::Add, false, "self_attn.sub_max");
    let probs = b.op(
        Op::Softmax { fp32: false },
        &[x],
        wide,
        &[],
        "self_attn.softmax",
    );
    let probs = b.dropout(probs, a.dropout, false, "self_attn.dropout");
    let probs = b.op(Op::ToComputeDtype, &[probs], scores, &[], "self_attn.cast");
    let o = b.op(
        Op::Matmul {
            batch: h,
            m: s,
            k: s,
            n: d,
        },
        &[probs, v],
        full,
        &[],
        "self_attn.av",
    );
    b.copy(o, "self_attn.contiguous")
}

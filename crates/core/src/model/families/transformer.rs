//! Pieces shared by the transformer families (attention, norms, token loss).

use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, Pointwise, TensorId};

/// Attention implementation requested for Hugging Face models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnImpl {
    /// `attn_implementation="eager"`: materialises the s×s scores.
    Eager,
    /// `attn_implementation="sdpa"`: fused kernel, no s×s tensor.
    Sdpa,
}

/// Shapes of one attention call, per sample.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub seq: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub dropout: f64,
    pub causal: bool,
    /// Eager softmax called with `dtype=torch.float32` (Llama) rather than in the input dtype.
    pub softmax_fp32: bool,
    /// Gemma 2's `attn_logit_softcapping`: the scaled scores are soft-capped before the mask
    /// (eager only: transformers 5.17's SDPA path drops the `softcap` keyword).
    pub softcap: bool,
}

/// `x / cap → tanh → · cap` (Gemma 2 soft-capping); tanh saves its output.
pub fn softcap(b: &mut GraphBuilder, x: TensorId, name: &str) -> TensorId {
    let s = b.pointwise(x, Pointwise::Scale, false, &format!("{name}.div"));
    let t = b.pointwise(s, Pointwise::Tanh, false, &format!("{name}.tanh"));
    b.pointwise(t, Pointwise::Scale, false, &format!("{name}.mul"))
}

/// `nn.LayerNorm` over the last dim of `rows` rows, with weight and bias.
pub fn layer_norm(b: &mut GraphBuilder, x: TensorId, rows: u64, dim: u64, name: &str) -> TensorId {
    layer_norm_bias(b, x, rows, dim, true, name)
}

/// `nn.LayerNorm(dim, bias=bias)` (ModernBERT's norms have no bias).
pub fn layer_norm_bias(
    b: &mut GraphBuilder,
    x: TensorId,
    rows: u64,
    dim: u64,
    bias: bool,
    name: &str,
) -> TensorId {
    let w = b.param(dim, None);
    if bias {
        let bias = b.param(dim, None);
        b.op(Op::LayerNorm { rows }, &[x], rows * dim, &[w, bias], name)
    } else {
        b.op(Op::LayerNorm { rows }, &[x], rows * dim, &[w], name)
    }
}

/// Attention core after the projections. `q`, `k`, `v` hold heads×head_dim (q) and
/// kv_heads×head_dim (k, v) elements per row; they may be the same fused tensor (GPT-2's c_attn).
/// Returns the attention output with heads×head_dim elements per row, laid out (seq, heads, dim).
pub fn attention(
    b: &mut GraphBuilder,
    qkv: &[TensorId],
    a: AttnShape,
    imp: AttnImpl,
    name: &str,
) -> TensorId {
    attention_masked(b, qkv, a, imp, None, name)
}

/// [`attention`] with a per-sample additive mask of seq×seq elements broadcast over the
/// heads (ModernBERT's sliding-window layers): eager adds it to the scores; SDPA gets a
/// boolean mask, which PyTorch converts to a float `(b, 1, s, s)` bias per call, runs the
/// memory-efficient kernel with it and saves the bias for backward.
pub fn attention_masked(
    b: &mut GraphBuilder,
    qkv: &[TensorId],
    a: AttnShape,
    imp: AttnImpl,
    mask: Option<TensorId>,
    name: &str,
) -> TensorId {
    let out_elems = a.seq * a.heads * a.head_dim;
    match imp {
        AttnImpl::Sdpa if mask.is_some() => {
            let bias = b.op(
                Op::Constant,
                &[],
                a.seq * a.seq,
                &[],
                &format!("{name}.bool_mask_to_bias"),
            );
            let inputs: Vec<TensorId> = match qkv {
                [q, k, v] => vec![*q, *k, *v, bias],
                _ => vec![qkv[0], qkv[0], qkv[0], bias],
            };
            b.op(
                Op::SdpaBias {
                    heads: a.heads,
                    head_dim: a.head_dim,
                    q_len: a.seq,
                    kv_len: a.seq,
                    dropout: a.dropout,
                    bias_grad: false,
                },
                &inputs,
                out_elems,
                &[],
                name,
            )
        }
        AttnImpl::Sdpa => {
            // Flash / memory-efficient kernels write (b, s, h, d); the following
            // `.transpose(1, 2).contiguous()` is then free.
            b.op(
                Op::Sdpa {
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    head_dim: a.head_dim,
                    seq: a.seq,
                    dropout: a.dropout,
                },
                qkv,
                out_elems,
                &[],
                name,
            )
        }
        AttnImpl::Eager => {
            let (q, k, v) = match qkv {
                [one] => (*one, *one, *one),
                [q, k, v] => (*q, *k, *v),
                _ => (qkv[0], qkv[0], qkv[0]),
            };
            let (k, v) = if a.kv_heads != a.heads {
                // repeat_kv: expand + reshape copies k and v to all heads.
                let n = a.seq * a.heads * a.head_dim;
                let k = b.op(Op::Copy, &[k], n, &[], &format!("{name}.repeat_k"));
                let v = b.op(Op::Copy, &[v], n, &[], &format!("{name}.repeat_v"));
                (k, v)
            } else {
                (k, v)
            };
            let scores = a.heads * a.seq * a.seq;
            let s = b.op(
                Op::Matmul {
                    batch: a.heads,
                    m: a.seq,
                    k: a.head_dim,
                    n: a.seq,
                },
                &[q, k],
                scores,
                &[],
                &format!("{name}.qk"),
            );
            let s = b.pointwise(s, Pointwise::Scale, false, &format!("{name}.scale"));
            let s = if a.softcap {
                softcap(b, s, &format!("{name}.softcap"))
            } else {
                s
            };
            let s = if let Some(mask) = mask {
                b.binary(s, mask, Pointwise::Add, false, &format!("{name}.add_mask"))
            } else if a.causal {
                let mask = b.constant(a.seq * a.seq, &format!("{name}.mask"));
                b.binary(s, mask, Pointwise::Add, false, &format!("{name}.add_mask"))
            } else {
                s
            };
            let p = b.op(
                Op::Softmax {
                    fp32: a.softmax_fp32,
                },
                &[s],
                scores,
                &[],
                &format!("{name}.softmax"),
            );
            let p = b.op(
                Op::ToComputeDtype,
                &[p],
                scores,
                &[],
                &format!("{name}.cast"),
            );
            let p = b.dropout(p, a.dropout, false, &format!("{name}.dropout"));
            let o = b.op(
                Op::Matmul {
                    batch: a.heads,
                    m: a.seq,
                    k: a.seq,
                    n: a.head_dim,
                },
                &[p, v],
                out_elems,
                &[],
                &format!("{name}.av"),
            );
            // (b, h, s, d) → transpose(1, 2) → reshape/contiguous: a copy.
            b.copy(o, &format!("{name}.contiguous"))
        }
    }
}

/// Language-model head + token cross-entropy over `seq` positions.
pub fn token_loss(
    b: &mut GraphBuilder,
    logits: TensorId,
    labels: TensorId,
    seq: u64,
    vocab: u64,
    upcast: bool,
) {
    b.cross_entropy(logits, labels, seq, vocab, upcast);
}

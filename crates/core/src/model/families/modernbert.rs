//! Hugging Face `ModernBertForMaskedLM` (transformers 5.17,
//! `models/modernbert/modeling_modernbert.py`) as an option of the BERT encoder builder.
//!
//! transformers 5.17 has no unpadding path any more: the model runs padded `(b, s, h)`
//! tensors through every layer whatever the attention implementation. With no padding
//! (the planner's batches), the global layers get no mask (`create_bidirectional_mask`
//! skips it: flash SDPA, or eager scores without an add); the sliding-window layers get a
//! boolean `(b, 1, s, s)` window mask from `create_bidirectional_sliding_window_mask` as
//! soon as `seq >= local_attention / 2` (shorter sequences skip it): eager adds its float
//! form, built once per forward, to the scores; SDPA converts it to a float bias per call
//! and takes the memory-efficient kernel, which saves that bias.

use super::bert::{BertParams, Decoder, MlmHead, mlm_head};
pub use super::encoder_options::ModernBertOptions;
use super::transformer::{AttnImpl, AttnShape, attention_masked, layer_norm_bias};
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Graph, Op, Pointwise, TensorId};

/// Builds ModernBERT with its masked-LM head over `seq` tokens (labels on every position).
pub fn build(p: &BertParams, m: &ModernBertOptions, seq: u64, imp: AttnImpl) -> Graph {
    let c = p.hidden_size;
    let i = p.intermediate_size;
    let heads = p.num_attention_heads;
    let mut b = GraphBuilder::new();
    let ids = b.input(seq, Elem::Int64);
    let word = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    b.scope("model.embeddings");
    let e = b.op(Op::Embedding, &[ids], seq * c, &[word], "tok_embeddings");
    let e = layer_norm_bias(&mut b, e, seq, c, m.norm_bias, "norm");
    let mut h = b.dropout(e, m.embedding_dropout, false, "drop");
    // `create_bidirectional_sliding_window_mask` (half window `local_attention // 2`):
    // eager's float mask is `torch.where` over the batch-expanded boolean mask, one
    // per-sample s×s tensor held through the forward.
    let windowed = seq >= m.local_attention / 2 && !m.sliding_layers.is_empty();
    let eager_mask = (windowed && imp == AttnImpl::Eager)
        .then(|| b.op(Op::Constant, &[], seq * seq, &[], "sliding_window_mask"));
    let shape = AttnShape {
        seq,
        heads,
        kv_heads: heads,
        head_dim: c / heads,
        dropout: p.attention_probs_dropout_prob,
        softmax_fp32: true,
        causal: false,
        softcap: false,
    };
    for l in 0..p.num_hidden_layers {
        b.scope(format!("model.layers.{l}"));
        b.begin_block();
        // Layer 0's `attn_norm` is `nn.Identity`.
        let x = if l == 0 {
            h
        } else {
            layer_norm_bias(&mut b, h, seq, c, m.norm_bias, "attn_norm")
        };
        let mask = match imp {
            AttnImpl::Eager if m.sliding(l) => eager_mask,
            AttnImpl::Sdpa if windowed && m.sliding(l) => Some(x),
            _ => None,
        };
        let a = attn(&mut b, x, &shape, m, imp, mask);
        let a = b.dropout(a, p.attention_probs_dropout_prob, false, "attn.out_drop");
        h = b.binary(h, a, Pointwise::Add, false, "residual_attn");
        let x = layer_norm_bias(&mut b, h, seq, c, m.norm_bias, "mlp_norm");
        // `input, gate = Wi(x).chunk(2)`; `Wo(drop(act(input) * gate))`.
        let wi = b.linear(x, seq, c, 2 * i, m.mlp_bias, "mlp.Wi");
        let parts = b.chunks(wi, 2, "mlp.chunk");
        let act = b.pointwise(parts[0], Pointwise::Gelu, false, "mlp.act");
        let g = b.binary(act, parts[1], Pointwise::Mul, false, "mlp.mul");
        let g = b.dropout(g, m.mlp_dropout, false, "mlp.drop");
        let o = b.linear(g, seq, i, c, m.mlp_bias, "mlp.Wo");
        h = b.binary(h, o, Pointwise::Add, false, "residual_mlp");
        b.end_block();
    }
    b.scope("model");
    let h = layer_norm_bias(&mut b, h, seq, c, m.norm_bias, "final_norm");
    b.scope("");
    let head = MlmHead {
        dense_bias: m.classifier_bias,
        norm_bias: m.norm_bias,
        decoder: if m.tie_word_embeddings {
            Decoder::Tied(word)
        } else {
            Decoder::Own
        },
        decoder_bias: m.decoder_bias,
        upcast: true,
    };
    mlm_head(
        &mut b,
        h,
        ids,
        seq,
        c,
        p.vocab_size,
        &head,
        ["head.dense", "head.act", "head.norm", "decoder"],
    );
    b.finish()
}

/// `ModernBertAttention`: fused `Wqkv`, RoPE on q and k in fp32 (`q.float()`, cast back to
/// the input dtype), attention with v a strided view of `Wqkv`'s output (SDPA's saved v
/// holds that whole output), `Wo`. `mask` marks a windowed sliding layer: eager's float
/// mask; for SDPA only its presence counts (the bias is built per call from the boolean
/// mask).
fn attn(
    b: &mut GraphBuilder,
    x: TensorId,
    s: &AttnShape,
    m: &ModernBertOptions,
    imp: AttnImpl,
    mask: Option<TensorId>,
) -> TensorId {
    let c = s.heads * s.head_dim;
    let seq = s.seq;
    let qkv = b.linear(x, seq, c, 3 * c, m.attention_bias, "attn.Wqkv");
    let q = b.op(Op::Rope, &[qkv], seq * c, &[], "attn.rope_q");
    let q = b.op(Op::ToComputeDtype, &[q], seq * c, &[], "attn.rope_q.to");
    let k = b.op(Op::Rope, &[qkv], seq * c, &[], "attn.rope_k");
    let k = b.op(Op::ToComputeDtype, &[k], seq * c, &[], "attn.rope_k.to");
    let v = match imp {
        // SDPA takes the strided view as it is.
        AttnImpl::Sdpa => qkv,
        // Eager's `torch.matmul(probs, v)` flattens (b, h, s, d) to (b·h, s, d): a copy of
        // the strided view from batch 2 on, which the matmul saves instead.
        AttnImpl::Eager => b.op(Op::Copy, &[qkv], seq * c, &[], "attn.value_reshape"),
    };
    let o = attention_masked(b, &[q, k, v], *s, imp, mask, "attn.attention");
    b.linear(o, seq, c, c, m.attention_bias, "attn.Wo")
}

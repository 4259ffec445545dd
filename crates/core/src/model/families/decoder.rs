//! The decoder-only transformer of the Llama lineage, as a configuration: Llama, Mistral,
//! Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (text), Phi-3 and the MoE decoders differ only in the options of
//! [`LlamaParams`] (transformers 5, `models/*/modeling_*.py`, op by op):
//!
//! | option | who | what changes |
//! | --- | --- | --- |
//! | `head_dim` | Qwen3, Gemma, Mistral | q/k/v width `heads × head_dim` ≠ hidden |
//! | `attention_bias` / `qkv_bias` | Llama (opt.), Qwen2 | biases on q,k,v,o / on q,k,v |
//! | `mlp_bias` | Llama (opt.) | biases on gate/up/down |
//! | `qk_norm` | Qwen3, Gemma 3 | RMSNorm over `head_dim` of q and k before RoPE |
//! | `hidden_act` | Gemma (`gelu_pytorch_tanh`) | the MLP activation |
//! | `gemma` | all Gemmas | RMSNorm `(1 + w)` in fp32; embeddings × √hidden |
//! | `sandwich_norm` | Gemma 2/3 | norms after attention and MLP too, and before the MLP |
//! | `attn_logit_softcapping` | Gemma 2 | tanh soft-cap of the scores (eager attention only) |
//! | `final_logit_softcapping` | Gemma 2 | tanh soft-cap of the logits |
//! | `fused_projections` | Phi-3 | one `qkv_proj` and one `gate_up_proj`, sliced as views |
//! | `moe` | Mixtral, Qwen2-MoE, Qwen3-MoE | a sparse MoE block in place of the MLP ([`super::moe`]) |
//!
//! What memory ignores: RoPE scaling and base (cos/sin are batch-independent and tiny), a
//! sliding window (SDPA gets a mask, the kernel's memory is the same; with eager attention
//! the full s×s scores exist either way).

use super::llama::{LlamaParams, head_dim};
use super::transformer::{AttnImpl, AttnShape, attention, softcap, token_loss};
use crate::model::ModelError;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Graph, Op, ParamId, Pointwise, TensorId};

fn norm(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    x: TensorId,
    rows: u64,
    dim: u64,
    name: &str,
) -> TensorId {
    let w: ParamId = b.param(dim, None);
    let n = rows.saturating_mul(dim);
    if p.gemma {
        b.op(Op::RmsNormOffset { rows }, &[x], n, &[w], name)
    } else {
        b.op(Op::RmsNorm { rows }, &[x], n, &[w], name)
    }
}

/// A linear layer reading `x` and writing `out` of `elems` elements (a slice of a fused
/// projection reads the fused tensor).
fn activation(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    x: TensorId,
    elems: u64,
    name: &str,
) -> TensorId {
    let op = match p.hidden_act.as_deref() {
        Some("gelu_new") => Op::GeluNewPython,
        Some("gelu_pytorch_tanh" | "gelu") => Op::Pointwise {
            f: Pointwise::Gelu,
            inplace: false,
        },
        _ => Op::Pointwise {
            f: Pointwise::Silu,
            inplace: false,
        },
    };
    b.op(op, &[x], elems, &[], name)
}

/// Builds the decoder for `seq` tokens. Attention soft-capping forces eager attention, as
/// transformers' SDPA path refuses `softcap`. `moe_imbalance` sizes the routed rows of
/// sparse layers (see [`super::moe`]; 1 = uniform routing).
pub fn build(
    p: &LlamaParams,
    seq: u64,
    imp: AttnImpl,
    moe_imbalance: f64,
) -> Result<Graph, ModelError> {
    crate::model::check_seq_fits(seq, 0, p.max_position_embeddings, "max_position_embeddings")?;
    let imp = if p.attn_logit_softcapping.is_some() {
        AttnImpl::Eager
    } else {
        imp
    };
    let c = p.hidden_size;
    let hd = head_dim(p);
    let qw = p.num_attention_heads * hd;
    let kv = p.num_key_value_heads * hd;
    let inter = p.intermediate_size;
    let attn_bias = p.attention_bias || p.qkv_bias;
    let per_layer = if imp == AttnImpl::Eager { 34 } else { 24 };
    let mut b = GraphBuilder::with_capacity(per_layer * p.num_hidden_layers as usize + 12);
    let ids = b.input(seq, Elem::Int64);
    let embed = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    b.scope("model");
    let mut h = b.op(Op::Embedding, &[ids], seq * c, &[embed], "embed_tokens");
    if p.gemma {
        // `hidden_states * normalizer` (a 0-d tensor without gradient).
        h = b.pointwise(h, Pointwise::Scale, false, "embed_scale");
    }
    let shape = AttnShape {
        seq,
        heads: p.num_attention_heads,
        kv_heads: p.num_key_value_heads,
        head_dim: hd,
        dropout: p.attention_dropout,
        softmax_fp32: true,
        causal: true,
        softcap: p.attn_logit_softcapping.is_some(),
    };
    for l in 0..p.num_hidden_layers {
        b.scope(format!("model.layers.{l}"));
        b.begin_block();
        let x = norm(&mut b, p, h, seq, c, "input_layernorm");
        let (q, k, v) = if p.fused_projections {
            // qkv_proj, then q/k/v are slices of its output (views).
            let qkv = b.linear(x, seq, c, qw + 2 * kv, attn_bias, "self_attn.qkv_proj");
            (qkv, qkv, qkv)
        } else {
            let q = b.linear(x, seq, c, qw, attn_bias, "self_attn.q_proj");
            let k = b.linear(x, seq, c, kv, attn_bias, "self_attn.k_proj");
            let v = b.linear(x, seq, c, kv, attn_bias, "self_attn.v_proj");
            (q, k, v)
        };
        let (q, k) = if p.qk_norm {
            let q = norm(
                &mut b,
                p,
                q,
                seq * p.num_attention_heads,
                hd,
                "self_attn.q_norm",
            );
            let k = norm(
                &mut b,
                p,
                k,
                seq * p.num_key_value_heads,
                hd,
                "self_attn.k_norm",
            );
            (q, k)
        } else {
            (q, k)
        };
        let q = b.op(Op::Rope, &[q], seq * qw, &[], "rope_q");
        let k = b.op(Op::Rope, &[k], seq * kv, &[], "rope_k");
        let kc = b.op(Op::CacheAppend, &[k], seq * kv, &[], "self_attn.cache_k");
        let vc = b.op(Op::CacheAppend, &[v, k], seq * kv, &[], "self_attn.cache_v");
        let a = attention(&mut b, &[q, kc, vc], shape, imp, "self_attn");
        let a = b.linear(a, seq, qw, c, p.attention_bias, "self_attn.o_proj");
        let a = if p.sandwich_norm {
            norm(&mut b, p, a, seq, c, "post_attention_layernorm")
        } else {
            a
        };
        h = b.binary(h, a, Pointwise::Add, false, "residual_1");
        let x = if p.sandwich_norm {
            norm(&mut b, p, h, seq, c, "pre_feedforward_layernorm")
        } else {
            norm(&mut b, p, h, seq, c, "post_attention_layernorm")
        };
        let act =
            |b: &mut GraphBuilder, t: TensorId, n: u64, name: &str| activation(b, p, t, n, name);
        let m = if let Some(moe) = p.moe.as_ref().filter(|m| m.is_sparse(l)) {
            super::moe::block(&mut b, p, moe, x, seq, moe_imbalance, &act)
        } else if p.fused_projections {
            // gate_up_proj → `gate, up = chunk(2, dim=-1)`; `up * act(gate)`.
            let gu = b.linear(x, seq, c, 2 * inter, p.mlp_bias, "mlp.gate_up_proj");
            let parts = b.chunks(gu, 2, "mlp.chunk");
            let g = activation(&mut b, p, parts[0], seq * inter, "mlp.activation_fn");
            let m = b.binary(parts[1], g, Pointwise::Mul, false, "mlp.mul");
            b.linear(m, seq, inter, c, p.mlp_bias, "mlp.down_proj")
        } else {
            let g = b.linear(x, seq, c, inter, p.mlp_bias, "mlp.gate_proj");
            let g = activation(&mut b, p, g, seq * inter, "mlp.act_fn");
            let u = b.linear(x, seq, c, inter, p.mlp_bias, "mlp.up_proj");
            let m = b.binary(g, u, Pointwise::Mul, false, "mlp.mul");
            b.linear(m, seq, inter, c, p.mlp_bias, "mlp.down_proj")
        };
        let m = if p.sandwich_norm {
            norm(&mut b, p, m, seq, c, "post_feedforward_layernorm")
        } else {
            m
        };
        h = b.binary(h, m, Pointwise::Add, false, "residual_2");
        b.end_block();
    }
    b.scope("model");
    let h = norm(&mut b, p, h, seq, c, "norm");
    b.scope("");
    let logits = if p.tie_word_embeddings {
        b.linear_tied(h, seq, embed, c, p.vocab_size, "lm_head")
    } else {
        b.linear(h, seq, c, p.vocab_size, false, "lm_head")
    };
    let logits = if p.final_logit_softcapping.is_some() {
        softcap(&mut b, logits, "final_logit_softcapping")
    } else {
        logits
    };
    token_loss(&mut b, logits, ids, seq, p.vocab_size, true);
    Ok(b.finish())
}

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
//! | `attn_logit_softcapping` | Gemma 2 | tanh soft-cap of the scores (eager attention; SDPA drops it) |
//! | `final_logit_softcapping` | Gemma 2 | tanh soft-cap of the logits |
//! | `fused_projections` | Phi-3 | one `qkv_proj` and one `gate_up_proj`, sliced as views |
//! | `moe` | Mixtral, Qwen2-MoE, Qwen3-MoE | a sparse MoE block in place of the MLP ([`super::moe`]) |
//! | `norm: layer_norm` | StarCoder2 | `nn.LayerNorm` with bias everywhere |
//! | `norm: rms_fp32_product` | OLMo 2 | RMSNorm whose weight product is taken in fp32, then cast |
//! | `post_norm` | OLMo 2 | no pre-norms; norms on the attention and MLP outputs before each residual add |
//! | `qk_norm_full_width` | OLMo 2 | q/k norms over `heads × head_dim` (one weight per projection width) |
//! | `plain_mlp` | StarCoder2 | `c_proj(act(c_fc(x)))`, biases with `mlp_bias` |
//! | `embedding_dropout` / `residual_dropout` | StarCoder2 | dropout after the embeddings, `o_proj` and the MLP |
//! | `nope_layers` | SmolLM3 | those layers skip RoPE (q, k used as projected) |
//! | `sliding_layers` | SmolLM3 | which layers slide (its `layer_types`) |
//! | `multipliers` | Granite | µP: embeddings, both residual branches and the logits scaled (new tensors) |
//! | `mla` | DeepSeek-V3 | multi-head latent attention ([`super::mla`]) in place of q/k/v |
//! | `attention_sinks` | gpt-oss | eager attention with a sink logit per head ([`super::sinks`]) |
//! | `moe.router` / `moe.experts` | DeepSeek-V3, gpt-oss | sigmoid group-limited router, shared experts; top-k-then-softmax router with bias, the experts' loop with biases and clamped SwiGLU ([`super::moe`]) |
//!
//! What memory ignores: RoPE scaling and base (cos/sin are batch-independent and tiny), a
//! sliding window (SDPA gets a mask, the kernel's memory is the same; with eager attention
//! the full s×s scores exist either way).

use super::decoder_norm::norm;
use super::llama::{FalconLayout, LlamaParams, head_dim};
use super::transformer::{AttnImpl, AttnShape, attention, softcap, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::checks::ModelError;
use crate::model::ir::{Elem, Graph, Op, Pointwise, TensorId};

/// A µP multiplier (Granite): `x * m`, a new tensor whatever `m` is.
fn multiply(b: &mut GraphBuilder, p: &LlamaParams, x: TensorId, name: &str) -> TensorId {
    if p.multipliers.is_some() {
        b.pointwise(x, Pointwise::Scale, false, name)
    } else {
        x
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

/// Builds the decoder for `seq` tokens. Attention soft-capping (Gemma 2) is eager attention's
/// only: transformers 5.17's `sdpa_attention_forward` takes the layer's `softcap` keyword in
/// `**kwargs` and drops it, and `get_correct_attn_implementation` gives Gemma 2 SDPA by default,
/// so an SDPA plan runs the uncapped kernel. `moe_imbalance` sizes the routed rows of
/// sparse layers (see [`super::moe`]; 1 = uniform routing).
pub fn build(
    p: &LlamaParams,
    seq: u64,
    imp: AttnImpl,
    moe_imbalance: f64,
) -> Result<Graph, ModelError> {
    crate::model::checks::check_seq_fits(
        seq,
        0,
        p.max_position_embeddings,
        "max_position_embeddings",
    )?;
    // transformers 5.17 refuses SDPA for gpt-oss (attention sinks): eager runs.
    let imp = if p.attention_sinks {
        AttnImpl::Eager
    } else {
        imp
    };
    let c = p.hidden_size;
    let hd = head_dim(p);
    let per_layer = if imp == AttnImpl::Eager { 34 } else { 24 };
    let mut b = GraphBuilder::with_capacity(per_layer * p.num_hidden_layers as usize + 12);
    let ids = b.input(seq, Elem::Int64);
    let embed = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    let (top, embed_name) = if p.falcon.is_some() {
        ("transformer", "word_embeddings")
    } else {
        ("model", "embed_tokens")
    };
    b.scope(top);
    let mut h = b.op(Op::Embedding, &[ids], seq * c, &[embed], embed_name);
    if p.gemma {
        // `hidden_states * normalizer` (a 0-d tensor without gradient).
        h = b.pointwise(h, Pointwise::Scale, false, "embed_scale");
    }
    h = multiply(&mut b, p, h, "embedding_multiplier");
    h = b.dropout(h, p.embedding_dropout, false, "embedding_dropout");
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
        if let Some(f) = &p.falcon {
            b.scope(format!("transformer.h.{l}"));
            b.begin_block();
            h = falcon_layer(&mut b, p, f, h, seq, imp)?;
            b.end_block();
            continue;
        }
        b.scope(format!("model.layers.{l}"));
        b.begin_block();
        h = llama_layer(&mut b, p, &shape, h, seq, imp, moe_imbalance, l);
        b.end_block();
    }
    b.scope(top);
    let final_norm = if p.falcon.is_some() { "ln_f" } else { "norm" };
    let h = norm(&mut b, p, h, seq, c, final_norm);
    b.scope("");
    let logits = if p.tie_word_embeddings {
        b.linear_tied(h, seq, embed, c, p.vocab_size, "lm_head")
    } else {
        b.linear(h, seq, c, p.vocab_size, false, "lm_head")
    };
    // Granite: `logits / logits_scaling`, a second logits-sized tensor.
    let logits = multiply(&mut b, p, logits, "logits_scaling");
    let logits = if p.final_logit_softcapping.is_some() {
        softcap(&mut b, logits, "final_logit_softcapping")
    } else {
        logits
    };
    token_loss(&mut b, logits, ids, seq, p.vocab_size, true);
    Ok(b.finish())
}

/// One `FalconDecoderLayer` (transformers 5.17, `models/falcon/modeling_falcon.py`) with
/// rotary attention (ALiBi is refused at import).
///
/// The fused `query_key_value` is split by `_split_heads`: without the new architecture q,
/// k and v are views (multi-head) or q is a view and k, v are copied out by list indexing
/// (`[..., [-2], :]`, multi-query: one head each); with it q is copied (`flatten` of a
/// slice) and k, v are broadcast to every query head and copied. The model always passes a
/// materialised causal mask (`allow_is_causal_skip=False`), which `scaled_dot_product_attention`
/// turns into a float mask of the query's dtype per call, `(batch, 1, seq, seq)`, kept by the
/// fused kernel for backward. Multi-query attention under SDPA passes 1 key head beside every
/// query head without `enable_gqa`: PyTorch's fused kernels refuse it and its math path runs
/// (planned as T5's math-path attention, with the one key / value head expanded).
fn falcon_layer(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    f: &FalconLayout,
    h: TensorId,
    seq: u64,
    imp: AttnImpl,
) -> Result<TensorId, ModelError> {
    let c = p.hidden_size;
    let heads = p.num_attention_heads;
    let hd = head_dim(p);
    let kv_heads = p.num_key_value_heads;
    let two_norms = f.parallel_attn && f.num_ln_in_parallel_attn == 2;
    let (x, mlp_in) = if two_norms {
        let a = norm(b, p, h, seq, c, "ln_attn");
        let m = norm(b, p, h, seq, c, "ln_mlp");
        (a, Some(m))
    } else {
        (norm(b, p, h, seq, c, "input_layernorm"), None)
    };
    let qkv_out = (heads + 2 * kv_heads) * hd;
    let qkv = b.linear(
        x,
        seq,
        c,
        qkv_out,
        p.attention_bias,
        "self_attention.query_key_value",
    );
    let full = seq * heads * hd;
    let (q, k, v, attn_kv_heads) = if f.new_decoder_architecture {
        let q = b.op(Op::Copy, &[qkv], full, &[], "self_attention.query_flatten");
        let k = b.op(Op::Copy, &[qkv], full, &[], "self_attention.key_broadcast");
        let v = b.op(
            Op::Copy,
            &[qkv],
            full,
            &[],
            "self_attention.value_broadcast",
        );
        (q, k, v, heads)
    } else if kv_heads != heads {
        let n = seq * kv_heads * hd;
        let k = b.op(Op::Copy, &[qkv], n, &[], "self_attention.key_index");
        let v = b.op(Op::Copy, &[qkv], n, &[], "self_attention.value_index");
        (qkv, k, v, kv_heads)
    } else {
        (qkv, qkv, qkv, heads)
    };
    let kv_elems = seq * attn_kv_heads * hd;
    let q = b.op(Op::Rope, &[q], full, &[], "rope_q");
    let k = b.op(Op::Rope, &[k], kv_elems, &[], "rope_k");
    let kc = b.op(
        Op::CacheAppend,
        &[k],
        kv_elems,
        &[],
        "self_attention.cache_k",
    );
    let vc = b.op(
        Op::CacheAppend,
        &[v, k],
        kv_elems,
        &[],
        "self_attention.cache_v",
    );
    let a = match imp {
        AttnImpl::Sdpa if attn_kv_heads != heads => {
            // Multi-query without `enable_gqa`: the fused kernels refuse unequal head counts,
            // PyTorch's math path runs (`_scaled_dot_product_attention_math`: q, k, v upcast
            // to fp32, `matmul` broadcasting the one key / value head to every query head —
            // an expanded copy each, saved —, the float mask added in place, the fp32
            // softmax saved), then `permute(0, 2, 1, 3).reshape` copies the (b, h, s, d)
            // result into (b, s, h·d).
            let raw = b.op(Op::Constant, &[], seq * seq, &[], "self_attention.mask");
            let mask = b.op(
                Op::ToComputeDtype,
                &[raw],
                seq * seq,
                &[],
                "self_attention.float_mask",
            );
            let v = b.op(Op::Copy, &[vc], full, &[], "self_attention.expand_v");
            let o = b.op(
                Op::SdpaBias {
                    heads,
                    head_dim: hd,
                    q_len: seq,
                    kv_len: seq,
                    dropout: 0.0,
                    bias_grad: true,
                },
                &[q, kc, v, mask],
                full,
                &[],
                "self_attention",
            );
            b.copy(o, "self_attention.merge_heads")
        }
        AttnImpl::Sdpa => {
            // The bool causal mask → `where(mask.logical_not(), -inf, 0)` in the query's dtype.
            let raw = b.op(Op::Constant, &[], seq * seq, &[], "self_attention.mask");
            let mask = b.op(
                Op::ToComputeDtype,
                &[raw],
                seq * seq,
                &[],
                "self_attention.float_mask",
            );
            b.op(
                Op::SdpaBias {
                    heads,
                    head_dim: hd,
                    q_len: seq,
                    kv_len: seq,
                    dropout: 0.0,
                    bias_grad: false,
                },
                &[q, kc, vc, mask],
                full,
                &[],
                "self_attention",
            )
        }
        AttnImpl::Eager => {
            // `softmax(scores + mask, dtype=hidden_states.dtype)`, no dropout (rotary).
            let shape = AttnShape {
                seq,
                heads,
                kv_heads: attn_kv_heads,
                head_dim: hd,
                dropout: 0.0,
                softmax_fp32: false,
                causal: true,
                softcap: false,
            };
            attention(b, &[q, kc, vc], shape, AttnImpl::Eager, "self_attention")
        }
    };
    let a = b.linear(
        a,
        seq,
        heads * hd,
        c,
        p.attention_bias,
        "self_attention.dense",
    );
    let (residual, mlp_in) = if f.new_decoder_architecture || f.parallel_attn {
        (h, mlp_in.unwrap_or(x))
    } else {
        // `dropout_add(attention_output, residual, attention_dropout)`, then the second norm.
        let d = b.dropout(a, p.attention_dropout, false, "attention_dropout");
        let r = b.binary(h, d, Pointwise::Add, false, "residual_attn");
        (r, norm(b, p, r, seq, c, "post_attention_layernorm"))
    };
    let inter = p.intermediate_size;
    let m = b.linear(mlp_in, seq, c, inter, p.mlp_bias, "mlp.dense_h_to_4h");
    let m = activation(b, p, m, seq * inter, "mlp.act");
    let m = b.linear(m, seq, inter, c, p.mlp_bias, "mlp.dense_4h_to_h");
    let m = if f.new_decoder_architecture || f.parallel_attn {
        // `mlp_output += attention_output`
        b.binary(m, a, Pointwise::Add, true, "mlp_add_attention")
    } else {
        m
    };
    let m = b.dropout(m, f.hidden_dropout, false, "hidden_dropout");
    Ok(b.binary(residual, m, Pointwise::Add, false, "residual"))
}

/// One decoder layer of the Llama lineage (and OLMo 2, Granite, StarCoder2, SmolLM3, the
/// Qwen/Mixtral MoE layers): norms, attention, MLP or MoE block, the residual adds.
#[allow(clippy::too_many_arguments)]
fn llama_layer(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    shape: &AttnShape,
    mut h: TensorId,
    seq: u64,
    imp: AttnImpl,
    moe_imbalance: f64,
    l: u64,
) -> TensorId {
    let c = p.hidden_size;
    let qw = p.num_attention_heads * head_dim(p);
    let inter = p.intermediate_size;
    let x = if p.post_norm {
        h
    } else {
        norm(b, p, h, seq, c, "input_layernorm")
    };
    let a = match &p.mla {
        Some(m) => super::mla::attention(b, p, m, x, seq, imp),
        None => {
            let a = projected_attention(b, p, shape, x, seq, imp, l);
            b.linear(a, seq, qw, c, p.attention_bias, "self_attn.o_proj")
        }
    };
    if x != h {
        // `hidden_states` (the normed input) until `self.self_attn(...)` returns.
        b.hold(x);
    }
    let a = b.dropout(a, p.residual_dropout, false, "self_attn.residual_dropout");
    let a = if p.sandwich_norm || p.post_norm {
        norm(b, p, a, seq, c, "post_attention_layernorm")
    } else {
        a
    };
    let a = multiply(b, p, a, "residual_multiplier_1");
    h = b.binary(h, a, Pointwise::Add, false, "residual_1");
    let x = if p.post_norm {
        h
    } else if p.sandwich_norm {
        norm(b, p, h, seq, c, "pre_feedforward_layernorm")
    } else {
        norm(b, p, h, seq, c, "post_attention_layernorm")
    };
    let act = |b: &mut GraphBuilder, t: TensorId, n: u64, name: &str| activation(b, p, t, n, name);
    let m = if let Some(moe) = p.moe.as_ref().filter(|m| m.is_sparse(l)) {
        super::moe::block(b, p, moe, x, seq, moe_imbalance, &act)
    } else if p.plain_mlp {
        // StarCoder2: c_proj(act(c_fc(x))), then the residual dropout.
        let m = b.linear(x, seq, c, inter, p.mlp_bias, "mlp.c_fc");
        let m = activation(b, p, m, seq * inter, "mlp.act");
        let m = b.linear(m, seq, inter, c, p.mlp_bias, "mlp.c_proj");
        b.dropout(m, p.residual_dropout, false, "mlp.residual_dropout")
    } else if p.fused_projections {
        // gate_up_proj → `gate, up = chunk(2, dim=-1)`; `up * act(gate)`.
        let gu = b.linear(x, seq, c, 2 * inter, p.mlp_bias, "mlp.gate_up_proj");
        let parts = b.chunks(gu, 2, "mlp.chunk");
        let g = activation(b, p, parts[0], seq * inter, "mlp.activation_fn");
        let m = b.binary(parts[1], g, Pointwise::Mul, false, "mlp.mul");
        b.linear(m, seq, inter, c, p.mlp_bias, "mlp.down_proj")
    } else {
        let g = b.linear(x, seq, c, inter, p.mlp_bias, "mlp.gate_proj");
        let g = activation(b, p, g, seq * inter, "mlp.act_fn");
        let u = b.linear(x, seq, c, inter, p.mlp_bias, "mlp.up_proj");
        let m = b.binary(g, u, Pointwise::Mul, false, "mlp.mul");
        b.linear(m, seq, inter, c, p.mlp_bias, "mlp.down_proj")
    };
    if x != h {
        // The MLP's argument until `self.mlp(hidden_states)` returns.
        b.hold(x);
    }
    let m = if p.sandwich_norm || p.post_norm {
        norm(b, p, m, seq, c, "post_feedforward_layernorm")
    } else {
        m
    };
    let m = multiply(b, p, m, "residual_multiplier_2");
    b.binary(h, m, Pointwise::Add, false, "residual_2")
}

/// q/k/v projections (or Phi-3's fused one), q/k norms, RoPE, the cache appends and the
/// attention core (with gpt-oss's sinks when set); returns the attention output before
/// `o_proj`.
fn projected_attention(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    shape: &AttnShape,
    x: TensorId,
    seq: u64,
    imp: AttnImpl,
    l: u64,
) -> TensorId {
    let c = p.hidden_size;
    let hd = head_dim(p);
    let qw = p.num_attention_heads * hd;
    let kv = p.num_key_value_heads * hd;
    let attn_bias = p.attention_bias || p.qkv_bias;
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
    let (q, k) = if p.qk_norm && p.qk_norm_full_width {
        // OLMo 2: RMSNorm over the whole projection, before the split into heads.
        let q = norm(b, p, q, seq, qw, "self_attn.q_norm");
        let k = norm(b, p, k, seq, kv, "self_attn.k_norm");
        (q, k)
    } else if p.qk_norm {
        let q = norm(b, p, q, seq * p.num_attention_heads, hd, "self_attn.q_norm");
        let k = norm(b, p, k, seq * p.num_key_value_heads, hd, "self_attn.k_norm");
        (q, k)
    } else {
        (q, k)
    };
    let (q, k) = if p.layer_rope(l) {
        let q = b.op(Op::Rope, &[q], seq * qw, &[], "rope_q");
        let k = b.op(Op::Rope, &[k], seq * kv, &[], "rope_k");
        (q, k)
    } else {
        // SmolLM3's layers without RoPE attend with the projections as they are.
        (q, k)
    };
    let kc = b.op(Op::CacheAppend, &[k], seq * kv, &[], "self_attn.cache_k");
    let vc = b.op(Op::CacheAppend, &[v, k], seq * kv, &[], "self_attn.cache_v");
    if p.attention_sinks {
        return super::sinks::attention(b, q, kc, vc, *shape);
    }
    attention(b, &[q, kc, vc], *shape, imp, "self_attn")
}

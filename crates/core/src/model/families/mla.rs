//! DeepSeek-V3's multi-head latent attention (transformers 5.17,
//! `models/deepseek_v3/modeling_deepseek_v3.py`, `DeepseekV3Attention.forward`), op by op:
//!
//! 1. q: `q_b_proj(q_a_layernorm(q_a_proj(x)))` (with `q_lora_rank`) or `q_proj(x)`, viewed
//!    `(b, h, s, qk_nope + qk_rope)` and split into `q_pass` / `q_rot` (views);
//! 2. `kv_a_proj_with_mqa(x)` split into the latent (`kv_lora_rank`, normed by
//!    `kv_a_layernorm`) and one shared rotary key head (`qk_rope_head_dim`);
//! 3. rotary embedding of `q_rot` and `k_rot` (interleaved or not: a new tensor each);
//! 4. `DynamicCache.update(kv_nope, k_rot)` (training keeps `use_cache=True` unless
//!    checkpointing): a copy of the compressed latent and of the rotary key;
//! 5. `query = cat(q_pass, q_rot)`; `expand_kv`: `kv_b_proj(latent)` → `k_nope`, `value`
//!    (views), `key` a new tensor filled with `k_nope` and the broadcast `k_rot`;
//! 6. SDPA (the memory-efficient kernel: q/k heads of `qk_nope + qk_rope`, v heads of
//!    `v_head_dim`; flash needs equal widths) or the eager path (`softmax(dtype=float32)
//!    .to(q.dtype)`), then `o_proj`.

use super::llama::LlamaParams;
pub use super::mla_params::MlaParams;
use super::transformer::AttnImpl;
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Op, Pointwise, TensorId};

/// `DeepseekV3Attention` on `x` (the input norm's output, `seq` rows); returns `o_proj`'s
/// output.
pub fn attention(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    m: &MlaParams,
    x: TensorId,
    seq: u64,
    imp: AttnImpl,
) -> TensorId {
    let c = p.hidden_size;
    let heads = p.num_attention_heads;
    let qk = m.qk_head_dim();
    let bias = p.attention_bias;
    let q = match m.q_lora_rank {
        Some(r) => {
            let qa = b.linear(x, seq, c, r, bias, "self_attn.q_a_proj");
            let qa = super::decoder_norm::norm(b, p, qa, seq, r, "self_attn.q_a_layernorm");
            b.linear(qa, seq, r, heads * qk, false, "self_attn.q_b_proj")
        }
        None => b.linear(x, seq, c, heads * qk, false, "self_attn.q_proj"),
    };
    let kvr = m.kv_lora_rank;
    let rope = m.qk_rope_head_dim;
    let ckv = b.linear(x, seq, c, kvr + rope, bias, "self_attn.kv_a_proj_with_mqa");
    let latent = super::decoder_norm::norm(b, p, ckv, seq, kvr, "self_attn.kv_a_layernorm");
    let q_rot = b.op(Op::Rope, &[q], seq * heads * rope, &[], "rope_q");
    let k_rot = b.op(Op::Rope, &[ckv], seq * rope, &[], "rope_k");
    let latent = b.op(
        Op::CacheAppend,
        &[latent],
        seq * kvr,
        &[],
        "self_attn.cache_latent",
    );
    let k_rot = b.op(
        Op::CacheAppend,
        &[k_rot, latent],
        seq * rope,
        &[],
        "self_attn.cache_k_rot",
    );
    let query = b.op(
        Op::Concat,
        &[q, q_rot],
        seq * heads * qk,
        &[],
        "self_attn.cat_q",
    );
    let kv = b.linear(
        latent,
        seq,
        kvr,
        heads * (m.qk_nope_head_dim + m.v_head_dim),
        false,
        "self_attn.kv_b_proj",
    );
    // `new_empty` + `copy_` of k_nope and the broadcast k_rot: a new key tensor.
    let key = b.op(
        Op::Concat,
        &[kv, k_rot],
        seq * heads * qk,
        &[],
        "self_attn.expand_kv",
    );
    let out = seq * heads * m.v_head_dim;
    let a = match imp {
        AttnImpl::Sdpa => b.op(
            Op::Sdpa {
                heads,
                kv_heads: heads,
                head_dim: qk,
                seq,
                dropout: p.attention_dropout,
            },
            &[query, key, kv],
            out,
            &[],
            "self_attn",
        ),
        AttnImpl::Eager => eager(b, p, m, query, key, kv, seq),
    };
    b.linear(a, seq, heads * m.v_head_dim, c, bias, "self_attn.o_proj")
}

/// DeepSeek's `eager_attention_forward`: `q·kᵀ · scaling + mask`, softmax in fp32 cast to
/// q's dtype, dropout, `· v` (the strided value view copied by matmul's reshape),
/// `transpose(1, 2).contiguous()`.
fn eager(
    b: &mut GraphBuilder,
    p: &LlamaParams,
    m: &MlaParams,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    seq: u64,
) -> TensorId {
    let heads = p.num_attention_heads;
    let scores = heads * seq * seq;
    let s = b.op(
        Op::Matmul {
            batch: heads,
            m: seq,
            k: m.qk_head_dim(),
            n: seq,
        },
        &[q, k],
        scores,
        &[],
        "self_attn.qk",
    );
    let s = b.pointwise(s, Pointwise::Scale, false, "self_attn.scale");
    let mask = b.constant(seq * seq, "self_attn.mask");
    let s = b.binary(s, mask, Pointwise::Add, false, "self_attn.add_mask");
    let pr = b.op(
        Op::Softmax { fp32: true },
        &[s],
        scores,
        &[],
        "self_attn.softmax",
    );
    let pr = b.op(Op::ToComputeDtype, &[pr], scores, &[], "self_attn.cast");
    let pr = b.dropout(pr, p.attention_dropout, false, "self_attn.dropout");
    let out = seq * heads * m.v_head_dim;
    // `value_states` is a strided view of kv_b_proj's output: matmul's reshape copies it.
    let v = b.op(Op::Copy, &[v], out, &[], "self_attn.value_contiguous");
    let o = b.op(
        Op::Matmul {
            batch: heads,
            m: seq,
            k: seq,
            n: m.v_head_dim,
        },
        &[pr, v],
        out,
        &[],
        "self_attn.av",
    );
    b.copy(o, "self_attn.contiguous")
}

//! Hugging Face `LlamaForCausalLM` (transformers 5, `models/llama/modeling_llama.py`).

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Graph, Op, ParamId, Pointwise, TensorId};
use crate::model::{ModelError, check_layers, check_positive, check_prob};

/// `LlamaConfig` fields that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaParams {
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    pub max_position_embeddings: u64,
    pub tie_word_embeddings: bool,
    pub attention_dropout: f64,
}

impl LlamaParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.vocab_size", self.vocab_size)?;
        check_positive("params.hidden_size", self.hidden_size)?;
        check_positive("params.intermediate_size", self.intermediate_size)?;
        check_layers("params.num_hidden_layers", self.num_hidden_layers)?;
        check_positive("params.num_attention_heads", self.num_attention_heads)?;
        check_positive("params.num_key_value_heads", self.num_key_value_heads)?;
        check_positive(
            "params.max_position_embeddings",
            self.max_position_embeddings,
        )?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ModelError::Invalid {
                field: "params.num_attention_heads".into(),
                reason: format!(
                    "hidden_size {} is not divisible by num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            });
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ModelError::Invalid {
                field: "params.num_key_value_heads".into(),
                reason: format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            });
        }
        check_prob("params.attention_dropout", self.attention_dropout)
    }
}

fn rms_norm(b: &mut GraphBuilder, x: TensorId, rows: u64, dim: u64, name: &str) -> TensorId {
    let w: ParamId = b.param(dim, None);
    b.op(Op::RmsNorm { rows }, &[x], rows * dim, &[w], name)
}

/// Builds a Llama-style decoder (GQA, SwiGLU, RMSNorm, RoPE) for `seq` tokens.
pub fn build(p: &LlamaParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    if seq > p.max_position_embeddings {
        return Err(ModelError::Invalid {
            field: "seq_len".into(),
            reason: format!(
                "{seq} exceeds the model's max_position_embeddings {}",
                p.max_position_embeddings
            ),
        });
    }
    let c = p.hidden_size;
    let hd = c / p.num_attention_heads;
    let kv = p.num_key_value_heads * hd;
    let inter = p.intermediate_size;
    // 18 ops per layer with SDPA, at most 28 with eager attention; then input, embedding,
    // final norm, head and loss.
    let per_layer = if imp == AttnImpl::Eager { 28 } else { 18 };
    let mut b = GraphBuilder::with_capacity(per_layer * p.num_hidden_layers as usize + 8);
    let ids = b.input(seq, Elem::Int64);
    let embed = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    b.scope("model");
    let mut h = b.op(Op::Embedding, &[ids], seq * c, &[embed], "embed_tokens");
    let shape = AttnShape {
        seq,
        heads: p.num_attention_heads,
        kv_heads: p.num_key_value_heads,
        head_dim: hd,
        dropout: p.attention_dropout,
        softmax_fp32: true,
        causal: true,
    };
    for l in 0..p.num_hidden_layers {
        b.scope(format!("model.layers.{l}"));
        b.begin_block();
        let x = rms_norm(&mut b, h, seq, c, "input_layernorm");
        let q = b.linear(x, seq, c, c, false, "self_attn.q_proj");
        let k = b.linear(x, seq, c, kv, false, "self_attn.k_proj");
        let v = b.linear(x, seq, c, kv, false, "self_attn.v_proj");
        let q = b.op(Op::Rope, &[q], seq * c, &[], "rope_q");
        let k = b.op(Op::Rope, &[k], seq * kv, &[], "rope_k");
        let kc = b.op(Op::CacheAppend, &[k], seq * kv, &[], "self_attn.cache_k");
        let vc = b.op(Op::CacheAppend, &[v, k], seq * kv, &[], "self_attn.cache_v");
        let a = attention(&mut b, &[q, kc, vc], shape, imp, "self_attn");
        let a = b.linear(a, seq, c, c, false, "self_attn.o_proj");
        h = b.binary(h, a, Pointwise::Add, false, "residual_1");
        let x = rms_norm(&mut b, h, seq, c, "post_attention_layernorm");
        let g = b.linear(x, seq, c, inter, false, "mlp.gate_proj");
        let g = b.pointwise(g, Pointwise::Silu, false, "mlp.act_fn");
        let u = b.linear(x, seq, c, inter, false, "mlp.up_proj");
        let m = b.binary(g, u, Pointwise::Mul, false, "mlp.mul");
        let m = b.linear(m, seq, inter, c, false, "mlp.down_proj");
        h = b.binary(h, m, Pointwise::Add, false, "residual_2");
        b.end_block();
    }
    b.scope("model");
    let h = rms_norm(&mut b, h, seq, c, "norm");
    b.scope("");
    let logits = if p.tie_word_embeddings {
        b.linear_tied(h, seq, embed, c, p.vocab_size, "lm_head")
    } else {
        b.linear(h, seq, c, p.vocab_size, false, "lm_head")
    };
    token_loss(&mut b, logits, ids, seq, p.vocab_size, true);
    Ok(b.finish())
}

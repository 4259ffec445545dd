//! Hugging Face `GPTNeoXForCausalLM` (transformers 5, `models/gpt_neox/modeling_gpt_neox.py`):
//! Pythia, GPT-NeoX-20B. LayerNorm with bias, one fused `query_key_value` projection, partial
//! rotary embedding, the parallel residual `mlp(ln2(x)) + attn(ln1(x)) + x`, an untied
//! `embed_out` head by default.

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, layer_norm, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};
use crate::model::ir::{Elem, Graph, Op, Pointwise};

/// `GPTNeoXConfig` fields that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GptNeoxParams {
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub intermediate_size: u64,
    pub max_position_embeddings: u64,
    /// `x + attn(ln1(x)) + mlp(ln2(x))` rather than two sequential residuals.
    pub use_parallel_residual: bool,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub hidden_dropout: f64,
    pub attention_dropout: f64,
    /// "gelu" (one kernel), "gelu_new" (Python tanh formula) or "relu".
    pub hidden_act: String,
}

impl GptNeoxParams {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_positive("params.vocab_size", self.vocab_size)?;
        check_positive("params.hidden_size", self.hidden_size)?;
        check_layers("params.num_hidden_layers", self.num_hidden_layers)?;
        check_positive("params.num_attention_heads", self.num_attention_heads)?;
        check_positive("params.intermediate_size", self.intermediate_size)?;
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
        if !["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"].contains(&self.hidden_act.as_str()) {
            return Err(ModelError::Invalid {
                field: "params.hidden_act".into(),
                reason: format!(
                    "`{}` is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)",
                    self.hidden_act
                ),
            });
        }
        check_prob("params.hidden_dropout", self.hidden_dropout)?;
        check_prob("params.attention_dropout", self.attention_dropout)
    }
}

/// Builds GPT-NeoX for `seq` tokens. The partial rotary embedding (`rotary_pct`) rotates a
/// slice of q and k and concatenates the rest back: a new q/k-sized tensor each, as with full
/// rotation (its temporaries, a quarter of that for Pythia, are counted at full size).
pub fn build(p: &GptNeoxParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    crate::model::checks::check_seq_fits(
        seq,
        0,
        p.max_position_embeddings,
        "max_position_embeddings",
    )?;
    let c = p.hidden_size;
    let inter = p.intermediate_size;
    let pd = p.hidden_dropout;
    let mut b = GraphBuilder::new();
    let ids = b.input(seq, Elem::Int64);
    let embed = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    b.scope("gpt_neox");
    let h = b.op(Op::Embedding, &[ids], seq * c, &[embed], "embed_in");
    let mut h = b.dropout(h, pd, false, "emb_dropout");
    let shape = AttnShape {
        seq,
        heads: p.num_attention_heads,
        kv_heads: p.num_attention_heads,
        head_dim: c / p.num_attention_heads,
        dropout: p.attention_dropout,
        softmax_fp32: true,
        causal: true,
        softcap: false,
    };
    for l in 0..p.num_hidden_layers {
        b.scope(format!("gpt_neox.layers.{l}"));
        b.begin_block();
        let x = layer_norm(&mut b, h, seq, c, "input_layernorm");
        let qkv = b.linear(
            x,
            seq,
            c,
            3 * c,
            p.attention_bias,
            "attention.query_key_value",
        );
        // q, k, v are chunks (views) of qkv; rotary + cat makes new q and k.
        let q = b.op(Op::Rope, &[qkv], seq * c, &[], "rope_q");
        let k = b.op(Op::Rope, &[qkv], seq * c, &[], "rope_k");
        let kc = b.op(Op::CacheAppend, &[k], seq * c, &[], "attention.cache_k");
        let vc = b.op(
            Op::CacheAppend,
            &[qkv, k],
            seq * c,
            &[],
            "attention.cache_v",
        );
        let a = attention(&mut b, &[q, kc, vc], shape, imp, "attention");
        let a = b.linear(a, seq, c, c, p.attention_bias, "attention.dense");
        let a = b.dropout(a, pd, false, "post_attention_dropout");
        let mlp_in = if p.use_parallel_residual {
            h
        } else {
            b.binary(a, h, Pointwise::Add, false, "residual_attn")
        };
        let x = layer_norm(&mut b, mlp_in, seq, c, "post_attention_layernorm");
        let m = b.linear(x, seq, c, inter, true, "mlp.dense_h_to_4h");
        let m = match p.hidden_act.as_str() {
            "gelu_new" => b.op(Op::GeluNewPython, &[m], seq * inter, &[], "mlp.act"),
            "relu" => b.pointwise(m, Pointwise::Relu, false, "mlp.act"),
            _ => b.pointwise(m, Pointwise::Gelu, false, "mlp.act"),
        };
        let m = b.linear(m, seq, inter, c, true, "mlp.dense_4h_to_h");
        let m = b.dropout(m, pd, false, "post_mlp_dropout");
        h = if p.use_parallel_residual {
            // `mlp_output + attn_output + hidden_states`, left to right.
            let t = b.binary(m, a, Pointwise::Add, false, "residual_mlp_attn");
            b.binary(t, h, Pointwise::Add, false, "residual")
        } else {
            b.binary(m, mlp_in, Pointwise::Add, false, "residual_mlp")
        };
        b.end_block();
    }
    b.scope("gpt_neox");
    let h = layer_norm(&mut b, h, seq, c, "final_layer_norm");
    b.scope("");
    let logits = if p.tie_word_embeddings {
        b.linear_tied(h, seq, embed, c, p.vocab_size, "embed_out")
    } else {
        b.linear(h, seq, c, p.vocab_size, false, "embed_out")
    };
    token_loss(&mut b, logits, ids, seq, p.vocab_size, true);
    Ok(b.finish())
}

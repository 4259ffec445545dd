//! Hugging Face `BertForMaskedLM` (transformers 5, `models/bert/modeling_bert.py`).

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, layer_norm, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::ir::{Elem, Graph, Op, Pointwise};
use crate::model::{ModelError, check_layers, check_positive, check_prob};

/// `BertConfig` fields that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BertParams {
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub intermediate_size: u64,
    pub max_position_embeddings: u64,
    pub type_vocab_size: u64,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    /// The transformers `model_type` this was imported from (`roberta`; a label only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// RoBERTa: positions start at `padding_idx + 1` and are computed per sample from the
    /// input ids, so the position embedding is a per-sample tensor; 0 for BERT (a `(1, s)`
    /// buffer, broadcast).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub position_offset: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl BertParams {
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
        check_positive("params.type_vocab_size", self.type_vocab_size)?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ModelError::Invalid {
                field: "params.num_attention_heads".into(),
                reason: format!(
                    "hidden_size {} is not divisible by num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            });
        }
        check_prob("params.hidden_dropout_prob", self.hidden_dropout_prob)?;
        check_prob(
            "params.attention_probs_dropout_prob",
            self.attention_probs_dropout_prob,
        )
    }
}

/// Builds BERT with the masked-LM head for `seq` tokens (labels on every position).
pub fn build(p: &BertParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    crate::model::check_seq_fits(
        seq,
        p.position_offset,
        p.max_position_embeddings,
        "max_position_embeddings",
    )?;
    let c = p.hidden_size;
    let i = p.intermediate_size;
    let pd = p.hidden_dropout_prob;
    let mut b = GraphBuilder::new();
    let ids = b.input(seq, Elem::Int64);
    let word = b.param(p.vocab_size * c, Some((p.vocab_size, c)));
    let position = b.param(
        p.max_position_embeddings * c,
        Some((p.max_position_embeddings, c)),
    );
    let token_type = b.param(p.type_vocab_size * c, Some((p.type_vocab_size, c)));
    b.scope("bert.embeddings");
    let w = b.op(Op::Embedding, &[ids], seq * c, &[word], "word_embeddings");
    // token_type_ids is an expanded (b, s) buffer: its embedding is per sample.
    let t = b.op(
        Op::Embedding,
        &[],
        seq * c,
        &[token_type],
        "token_type_embeddings",
    );
    let e = b.binary(w, t, Pointwise::Add, false, "add_token_type");
    let pos_elems = if p.position_offset > 0 { seq * c } else { 0 };
    let pe = b.op(
        Op::Embedding,
        &[],
        pos_elems,
        &[position],
        "position_embeddings",
    );
    let e = b.binary(e, pe, Pointwise::Add, false, "add_position");
    let e = layer_norm(&mut b, e, seq, c, "LayerNorm");
    let mut h = b.dropout(e, pd, false, "dropout");
    let shape = AttnShape {
        seq,
        heads: p.num_attention_heads,
        kv_heads: p.num_attention_heads,
        head_dim: c / p.num_attention_heads,
        dropout: p.attention_probs_dropout_prob,
        softmax_fp32: false,
        causal: false,
        softcap: false,
    };
    for l in 0..p.num_hidden_layers {
        b.scope(format!("bert.encoder.layer.{l}"));
        b.begin_block();
        let q = b.linear(h, seq, c, c, true, "attention.self.query");
        let k = b.linear(h, seq, c, c, true, "attention.self.key");
        let v = b.linear(h, seq, c, c, true, "attention.self.value");
        let a = attention(&mut b, &[q, k, v], shape, imp, "attention.self");
        let a = b.linear(a, seq, c, c, true, "attention.output.dense");
        let a = b.dropout(a, pd, false, "attention.output.dropout");
        let a = b.binary(a, h, Pointwise::Add, false, "attention.output.residual");
        let a = layer_norm(&mut b, a, seq, c, "attention.output.LayerNorm");
        let m = b.linear(a, seq, c, i, true, "intermediate.dense");
        let m = b.pointwise(m, Pointwise::Gelu, false, "intermediate.act");
        let m = b.linear(m, seq, i, c, true, "output.dense");
        let m = b.dropout(m, pd, false, "output.dropout");
        let m = b.binary(m, a, Pointwise::Add, false, "output.residual");
        h = layer_norm(&mut b, m, seq, c, "output.LayerNorm");
        b.end_block();
    }
    b.scope("cls.predictions");
    let t = b.linear(h, seq, c, c, true, "transform.dense");
    let t = b.pointwise(t, Pointwise::Gelu, false, "transform.act");
    let t = layer_norm(&mut b, t, seq, c, "transform.LayerNorm");
    let bias = b.param(p.vocab_size, None);
    let logits = b.op(
        Op::Linear {
            in_features: c,
            out_features: p.vocab_size,
        },
        &[t],
        seq * p.vocab_size,
        &[word, bias],
        "decoder",
    );
    token_loss(&mut b, logits, ids, seq, p.vocab_size, false);
    Ok(b.finish())
}

//! Hugging Face masked-LM encoders (transformers 5): `BertForMaskedLM`
//! (`models/bert/modeling_bert.py`, RoBERTa as an option), and as options of the same
//! parameters `ModernBertForMaskedLM` ([`super::modernbert`]) and `DebertaV2ForMaskedLM`
//! ([`super::deberta`]). The three share the word embedding, the encoder loop of
//! checkpointable layers and the masked-LM head (dense → gelu → LayerNorm → decoder tied to
//! the word embedding, with a bias) over every position.

use serde::{Deserialize, Serialize};

use super::transformer::{AttnImpl, AttnShape, attention, layer_norm, layer_norm_bias, token_loss};
use crate::model::builder::GraphBuilder;
use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};
use crate::model::ir::{Elem, Graph, Op, Pointwise};

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
    /// ModernBERT's layer (`model_type` `modernbert`); the BERT fields it has no use for
    /// (`type_vocab_size`, `max_position_embeddings` as a table) are ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modernbert: Option<super::encoder_options::ModernBertOptions>,
    /// DeBERTa-v2/v3's disentangled attention (`model_type` `deberta-v2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deberta: Option<super::encoder_options::DebertaOptions>,
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
        if self.modernbert.is_none() && self.deberta.is_none() {
            check_positive("params.type_vocab_size", self.type_vocab_size)?;
        } else if self.type_vocab_size > 0 {
            // DeBERTa and ModernBERT may have none; any they have is bounded like the rest.
            check_positive("params.type_vocab_size", self.type_vocab_size)?;
        }
        if let Some(d) = &self.deberta {
            d.validate(self.hidden_size, self.max_position_embeddings)?;
        }
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

impl BertParams {
    /// What the plan says about a training step with `attention` beyond the graph: DeBERTa
    /// has no SDPA path, so an SDPA request is planned as the eager code it runs.
    pub fn unmodelled(&self, attention: AttnImpl) -> Vec<String> {
        if self.deberta.is_some() && attention == AttnImpl::Sdpa {
            vec![
                "deberta-v2: transformers 5.17 refuses attn_implementation=\"sdpa\" \
                 (DisentangledSelfAttention has only its own eager code); planned as the \
                 eager attention it runs"
                    .to_string(),
            ]
        } else {
            Vec::new()
        }
    }
}

/// Builds BERT (or RoBERTa) with the masked-LM head for `seq` tokens (labels on every
/// position); [`super::encoder::build`] picks this, ModernBERT's or DeBERTa's builder.
pub fn build(p: &BertParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    crate::model::checks::check_seq_fits(
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
    let head = MlmHead {
        dense_bias: true,
        norm_bias: true,
        decoder: Decoder::Tied(word),
        decoder_bias: true,
        upcast: false,
    };
    mlm_head(
        &mut b,
        h,
        ids,
        seq,
        c,
        p.vocab_size,
        &head,
        [
            "transform.dense",
            "transform.act",
            "transform.LayerNorm",
            "decoder",
        ],
    );
    Ok(b.finish())
}

/// The decoder weight of a masked-LM head.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Decoder {
    /// Tied to the word embedding (this parameter).
    Tied(crate::model::ir::ParamId),
    /// Its own `(vocab, hidden)` weight (`tie_word_embeddings: false`).
    Own,
}

/// The masked-LM head: `dense → gelu → LayerNorm → decoder (+ bias)` and the token loss.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MlmHead {
    pub dense_bias: bool,
    pub norm_bias: bool,
    pub decoder: Decoder,
    pub decoder_bias: bool,
    /// The loss takes `logits.float()` first (transformers' `ForMaskedLMLoss`).
    pub upcast: bool,
}

/// Appends the masked-LM head over `seq` rows of width `c` and the loss against `labels`;
/// `names`: the dense, activation, norm and decoder ops.
#[allow(
    clippy::too_many_arguments,
    reason = "the head's shapes, as the callers name them"
)]
pub(crate) fn mlm_head(
    b: &mut GraphBuilder,
    h: crate::model::ir::TensorId,
    labels: crate::model::ir::TensorId,
    seq: u64,
    c: u64,
    vocab: u64,
    head: &MlmHead,
    names: [&str; 4],
) {
    let t = b.linear(h, seq, c, c, head.dense_bias, names[0]);
    let t = b.pointwise(t, Pointwise::Gelu, false, names[1]);
    let t = layer_norm_bias(b, t, seq, c, head.norm_bias, names[2]);
    let weight = match head.decoder {
        Decoder::Tied(w) => w,
        Decoder::Own => b.param(vocab * c, Some((vocab, c))),
    };
    let mut ps = vec![weight];
    if head.decoder_bias {
        ps.push(b.param(vocab, None));
    }
    let logits = b.op(
        Op::Linear {
            in_features: c,
            out_features: vocab,
        },
        &[t],
        seq * vocab,
        &ps,
        names[3],
    );
    token_loss(b, logits, labels, seq, vocab, head.upcast);
}

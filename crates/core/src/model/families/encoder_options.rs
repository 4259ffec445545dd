//! The options that make the BERT encoder's parameters DeBERTa-v2/v3 ([`super::deberta`])
//! or ModernBERT ([`super::modernbert`]): data and their checks, apart from the graphs.

use serde::{Deserialize, Serialize};

use crate::model::checks::{ModelError, check_positive};

/// `DebertaV2Config` fields beyond BERT's that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DebertaOptions {
    /// `relative_attention`: the disentangled c2p/p2c terms and the relative embeddings.
    pub relative_attention: bool,
    /// Rows of the relative embedding used on each side: `position_buckets` when > 0, else
    /// `max_relative_positions` (or `max_position_embeddings` when that is < 1).
    pub att_span: u64,
    /// `pos_att_type` contains `c2p`.
    pub c2p: bool,
    /// `pos_att_type` contains `p2c`.
    pub p2c: bool,
    /// `share_att_key`: the relative embeddings go through `query_proj` / `key_proj`
    /// instead of their own `pos_query_proj` / `pos_key_proj`.
    pub share_att_key: bool,
    /// `norm_rel_ebd` contains `layer_norm`.
    pub norm_rel_ebd: bool,
    /// `position_biased_input`: an absolute position embedding is added to the words.
    pub position_biased_input: bool,
    /// `attention_head_size` (default `hidden_size / num_attention_heads`).
    pub head_size: u64,
    /// `legacy`: the head's decoder is an `nn.Linear` with the tied weight and bias; else
    /// `matmul(h, word.T) + bias` (a second logits-sized tensor).
    pub legacy: bool,
    /// `conv_kernel_size > 0` (DeBERTa-v2 xlarge/xxlarge): the `ConvLayer` after layer 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv: Option<ConvOptions>,
}

/// `ConvLayer`: `Conv1d(hidden, hidden, kernel, padding=(kernel-1)/2, groups)` over the
/// encoder's input, then `conv_act`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConvOptions {
    pub kernel: u64,
    pub groups: u64,
    /// `conv_act` is `gelu` (else `tanh`, the default).
    pub gelu: bool,
}

impl DebertaOptions {
    /// Checks the options against the encoder's `hidden_size` and
    /// `max_position_embeddings`; errors name the field.
    pub fn validate(
        &self,
        hidden_size: u64,
        max_position_embeddings: u64,
    ) -> Result<(), ModelError> {
        check_positive("params.deberta.head_size", self.head_size)?;
        if let Some(conv) = &self.conv {
            check_positive("params.deberta.conv.kernel", conv.kernel)?;
            check_positive("params.deberta.conv.groups", conv.groups)?;
            if !hidden_size.is_multiple_of(conv.groups) {
                return Err(ModelError::Invalid {
                    field: "params.deberta.conv.groups".into(),
                    reason: format!(
                        "hidden_size {} is not divisible by conv_groups {}",
                        hidden_size, conv.groups
                    ),
                });
            }
        }
        if self.relative_attention {
            check_positive("params.deberta.att_span", self.att_span)?;
        }
        if self.position_biased_input {
            check_positive("params.max_position_embeddings", max_position_embeddings)?;
        }
        Ok(())
    }
}

/// `ModernBertConfig` fields beyond BERT's that shape memory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModernBertOptions {
    /// Layers with sliding-window attention (`layer_types`, or every layer `i` with
    /// `i % global_attn_every_n_layers != 0`).
    pub sliding_layers: Vec<u64>,
    /// `local_attention`: the whole window; the mask exists from `seq >= local_attention / 2`.
    pub local_attention: u64,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub norm_bias: bool,
    pub classifier_bias: bool,
    pub decoder_bias: bool,
    pub tie_word_embeddings: bool,
    pub embedding_dropout: f64,
    pub mlp_dropout: f64,
}

impl ModernBertOptions {
    pub(super) fn sliding(&self, l: u64) -> bool {
        self.sliding_layers.contains(&l)
    }
}

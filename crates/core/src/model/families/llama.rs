//! Hugging Face `LlamaForCausalLM` (transformers 5, `models/llama/modeling_llama.py`).

use serde::{Deserialize, Serialize};

use super::transformer::AttnImpl;
use crate::model::ir::Graph;
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
    // The options below make this the decoder of the whole Llama lineage (Mistral, Qwen2/3,
    // Gemma 1/2/3, Phi-3); see `decoder.rs`. Absent means Llama.
    /// The transformers `model_type` this was imported from (a label only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// Width of one head when it is not hidden_size / num_attention_heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// Biases on q, k, v and o (`attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub attention_bias: bool,
    /// Biases on q, k and v only (Qwen2).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qkv_bias: bool,
    /// Biases on the MLP projections (`mlp_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mlp_bias: bool,
    /// RMSNorm of q and k over head_dim before RoPE (Qwen3, Gemma 3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// MLP activation; absent means `silu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Gemma conventions: RMSNorm with `(1 + weight)` in fp32, embeddings × √hidden_size.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gemma: bool,
    /// Norms after attention and MLP as well as before (Gemma 2/3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub sandwich_norm: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// Fused `qkv_proj` and `gate_up_proj` (Phi-3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub fused_projections: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
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
        super::decoder::validate_options(self)?;
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

/// Builds a Llama-style decoder (GQA, SwiGLU, RMSNorm, RoPE) for `seq` tokens; the options
/// of the other families of the lineage are applied by [`super::decoder::build`].
pub fn build(p: &LlamaParams, seq: u64, imp: AttnImpl) -> Result<Graph, ModelError> {
    super::decoder::build(p, seq, imp)
}

//! Hugging Face `LlamaForCausalLM` (transformers 5, `models/llama/modeling_llama.py`).

use serde::{Deserialize, Serialize};

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
    /// A sparse mixture-of-experts block in place of the MLP (Mixtral, Qwen2/3-MoE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<super::moe_params::MoeParams>,
    /// The attention window of the sliding layers (`sliding_window`: Mistral v0.1, Phi-3,
    /// Gemma 2/3); absent: every layer attends to every position. Training memory ignores it
    /// (see `decoder.rs`); inference keeps a sliding layer's KV cache within it
    /// (`plan::inference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u64>,
    /// With `sliding_window`: layer `i` attends fully when `(i + 1) % N == 0` (Gemma 2: 2,
    /// Gemma 3: `sliding_window_pattern`, 6); absent: every layer slides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_attention_every: Option<u64>,
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
        validate_options(self)?;
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

/// MLP activations the decoder builder knows (`hidden_act` / `hidden_activation`).
pub const ACTIVATIONS: &[&str] = &["silu", "swish", "gelu_pytorch_tanh", "gelu", "gelu_new"];

/// Checks the options beyond the Llama fields; errors name the field.
pub fn validate_options(p: &LlamaParams) -> Result<(), ModelError> {
    if let Some(hd) = p.head_dim {
        check_positive("params.head_dim", hd)?;
    } else if !p.hidden_size.is_multiple_of(p.num_attention_heads) {
        return Err(ModelError::Invalid {
            field: "params.num_attention_heads".into(),
            reason: format!(
                "hidden_size {} is not divisible by num_attention_heads {} (give head_dim)",
                p.hidden_size, p.num_attention_heads
            ),
        });
    }
    if let Some(act) = &p.hidden_act
        && !ACTIVATIONS.contains(&act.as_str())
    {
        return Err(ModelError::Invalid {
            field: "params.hidden_act".into(),
            reason: format!("`{act}` is not supported ({})", ACTIVATIONS.join(", ")),
        });
    }
    if let Some(m) = &p.moe {
        m.validate()?;
    }
    if let Some(w) = p.sliding_window {
        check_positive("params.sliding_window", w)?;
    }
    if let Some(n) = p.full_attention_every {
        check_positive("params.full_attention_every", n)?;
    }
    for (field, v) in [
        ("params.attn_logit_softcapping", p.attn_logit_softcapping),
        ("params.final_logit_softcapping", p.final_logit_softcapping),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            return Err(ModelError::Invalid {
                field: field.into(),
                reason: format!("must be a positive number, got {v}"),
            });
        }
    }
    Ok(())
}

impl LlamaParams {
    /// The sliding window of layer `layer`, or `None` when it attends to every position
    /// (transformers' `layer_types`: `"sliding_attention"` / `"full_attention"`).
    pub fn layer_window(&self, layer: u64) -> Option<u64> {
        let w = self.sliding_window?;
        match self.full_attention_every {
            Some(n) if n > 0 && (layer + 1).is_multiple_of(n) => None,
            _ => Some(w),
        }
    }
}

/// Width of one attention head.
pub fn head_dim(p: &LlamaParams) -> u64 {
    p.head_dim
        .unwrap_or(p.hidden_size / p.num_attention_heads.max(1))
}

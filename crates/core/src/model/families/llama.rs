//! Hugging Face `LlamaForCausalLM` (transformers 5, `models/llama/modeling_llama.py`).

use serde::{Deserialize, Serialize};

use crate::model::checks::{ModelError, check_layers, check_positive, check_prob};

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
    // Options of the decoders added for issue 30 (OLMo 2, Granite, StarCoder2, SmolLM3);
    // absent means Llama's behaviour.
    /// The norm layers when not Llama's RMSNorm: `layer_norm` (`nn.LayerNorm` with bias,
    /// StarCoder2) or `rms_fp32_product` (OLMo 2's `(weight * x_normed).to(input_dtype)`,
    /// the product taken in fp32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<NormKind>,
    /// No norm before attention and MLP; a norm on each sub-layer's output before the
    /// residual add (OLMo 2's `post_attention_layernorm` / `post_feedforward_layernorm`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub post_norm: bool,
    /// With `qk_norm`: one norm over the whole projection (`heads × head_dim`, OLMo 2) rather
    /// than one per head over `head_dim` (Qwen3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm_full_width: bool,
    /// A non-gated MLP `c_proj(act(c_fc(x)))` (StarCoder2) instead of gate/up/down.
    #[serde(default, skip_serializing_if = "is_false")]
    pub plain_mlp: bool,
    /// Dropout after the embeddings (StarCoder2 `embedding_dropout`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub embedding_dropout: f64,
    /// Dropout after `o_proj` and after the MLP (StarCoder2 `residual_dropout`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub residual_dropout: f64,
    /// Layers that apply no rotary embedding (SmolLM3: `no_rope_layers[i] == 0`), by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nope_layers: Vec<u64>,
    /// With `sliding_window`: exactly these layers slide (SmolLM3's `layer_types`), in place
    /// of `full_attention_every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_layers: Option<Vec<u64>>,
    /// Granite's µP multipliers: the embeddings, each residual branch, the logits are scaled
    /// (each a new tensor whatever the value), the attention scores use `attention_multiplier`
    /// as their scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipliers: Option<Multipliers>,
    /// Falcon's layer (`FalconDecoderLayer`): one fused `query_key_value`, parallel
    /// attention, LayerNorms; see [`FalconLayout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub falcon: Option<FalconLayout>,
    /// DeepSeek-V3's multi-head latent attention in place of q/k/v projections
    /// ([`super::mla`]); `head_dim` and `num_key_value_heads` are then unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<super::mla_params::MlaParams>,
    /// gpt-oss's learned attention sinks (one logit per head joined to every row of scores
    /// before the softmax, [`super::sinks`]); forces eager attention.
    #[serde(default, skip_serializing_if = "is_false")]
    pub attention_sinks: bool,
    /// The `quant_method` of the config's `quantization_config` (DeepSeek-V3's `fp8`,
    /// gpt-oss's `mxfp4`), a label only: the plan is of the dequantized model, its weights
    /// in the precision the step trains in (see `unmodelled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
}

/// How a Falcon layer is laid out (`FalconConfig`, transformers 5.17). With
/// `num_key_value_heads` 1 and no `new_decoder_architecture` it is multi-query attention
/// (`multi_query`); `attention_bias` / `mlp_bias` are its `bias`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FalconLayout {
    /// The grouped fused projection (Falcon-40B/180B): q is copied out of it, k and v are
    /// broadcast to every query head and copied (`flatten`).
    pub new_decoder_architecture: bool,
    /// `mlp(ln(x)) + attn(ln(x)) + x` (always, with the new architecture).
    pub parallel_attn: bool,
    /// LayerNorms of a parallel layer: 2 (`ln_attn`, `ln_mlp`) or 1 (shared).
    pub num_ln_in_parallel_attn: u64,
    /// `hidden_dropout` (the layer's last `dropout_add`); `attention_dropout` is the
    /// sequential layer's first one (rotary Falcon applies no dropout inside attention).
    pub hidden_dropout: f64,
}

/// The norm layers of a decoder that does not use Llama's RMSNorm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `nn.LayerNorm` with weight and bias.
    LayerNorm,
    /// RMSNorm whose weight multiplies the fp32 normalised input before the cast back
    /// (`Olmo2RMSNorm`): the same ops as Gemma's norm without the `1 +`.
    RmsFp32Product,
}

/// Granite's µP multipliers (`GraniteConfig`); their values do not change memory, the ops
/// that apply them do.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Multipliers {
    pub embedding_multiplier: f64,
    pub residual_multiplier: f64,
    pub attention_multiplier: f64,
    pub logits_scaling: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
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
    if let Some(m) = &p.mla {
        m.validate()?;
    }
    if let Some(w) = p.sliding_window {
        check_positive("params.sliding_window", w)?;
    }
    if let Some(n) = p.full_attention_every {
        check_positive("params.full_attention_every", n)?;
    }
    check_prob("params.embedding_dropout", p.embedding_dropout)?;
    check_prob("params.residual_dropout", p.residual_dropout)?;
    for (field, layers) in [
        ("params.nope_layers", Some(&p.nope_layers)),
        ("params.sliding_layers", p.sliding_layers.as_ref()),
    ] {
        if let Some(&l) = layers.and_then(|ls| ls.iter().find(|&&l| l >= p.num_hidden_layers)) {
            return Err(ModelError::Invalid {
                field: field.into(),
                reason: format!(
                    "layer {l} is not below num_hidden_layers {}",
                    p.num_hidden_layers
                ),
            });
        }
    }
    if let Some(m) = &p.multipliers {
        for (field, v) in [
            (
                "params.multipliers.embedding_multiplier",
                m.embedding_multiplier,
            ),
            (
                "params.multipliers.residual_multiplier",
                m.residual_multiplier,
            ),
            (
                "params.multipliers.attention_multiplier",
                m.attention_multiplier,
            ),
            ("params.multipliers.logits_scaling", m.logits_scaling),
        ] {
            if !v.is_finite() || (field.ends_with("logits_scaling") && v == 0.0) {
                return Err(ModelError::Invalid {
                    field: field.into(),
                    reason: format!("must be a finite number (logits_scaling non-zero), got {v}"),
                });
            }
        }
    }
    if let Some(f) = &p.falcon {
        check_prob("params.falcon.hidden_dropout", f.hidden_dropout)?;
        if !matches!(f.num_ln_in_parallel_attn, 1 | 2) {
            return Err(ModelError::Invalid {
                field: "params.falcon.num_ln_in_parallel_attn".into(),
                reason: format!("must be 1 or 2, got {}", f.num_ln_in_parallel_attn),
            });
        }
        if f.new_decoder_architecture && !f.parallel_attn && f.num_ln_in_parallel_attn == 1 {
            return Err(ModelError::Invalid {
                field: "params.falcon.parallel_attn".into(),
                reason: "new_decoder_architecture with one LayerNorm needs parallel_attn \
                         (transformers 5.17's FalconDecoderLayer has no MLP input otherwise)"
                    .into(),
            });
        }
        if !f.new_decoder_architecture && f.parallel_attn && f.num_ln_in_parallel_attn == 2 {
            return Err(ModelError::Invalid {
                field: "params.falcon.num_ln_in_parallel_attn".into(),
                reason: "2 LayerNorms need new_decoder_architecture (transformers 5.17's \
                         FalconDecoderLayer would call an input_layernorm it did not create)"
                    .into(),
            });
        }
    }
    if p.qk_norm_full_width && !p.qk_norm {
        return Err(ModelError::Invalid {
            field: "params.qk_norm_full_width".into(),
            reason: "is only meaningful with qk_norm".into(),
        });
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
        if let Some(sliding) = &self.sliding_layers {
            return sliding.contains(&layer).then_some(w);
        }
        match self.full_attention_every {
            Some(n) if n > 0 && (layer + 1).is_multiple_of(n) => None,
            _ => Some(w),
        }
    }

    /// What a training step of `seq` tokens runs that the plan does not model, one
    /// sentence each naming the config key and why (empty when nothing).
    pub fn unmodelled(&self, seq: u64, sdpa: bool) -> Vec<String> {
        let mut notes = Vec::new();
        // Eager attention runs whatever is asked (the decoder builder forces it).
        if self.attention_sinks && sdpa {
            notes.push(
                "attention sinks (gpt_oss): transformers 5.17 refuses SDPA for this model; \
                 planned with the eager attention it runs (s×s scores per head)"
                    .to_string(),
            );
        }
        if let (Some(cap), true) = (self.attn_logit_softcapping, sdpa && !self.attention_sinks) {
            notes.push(format!(
                "attn_logit_softcapping ({cap}) is applied by eager attention only: transformers \
                 5.17's SDPA attention drops the softcap keyword, so this SDPA step runs \
                 uncapped scores (planned as the SDPA kernel it runs; --attention eager plans \
                 the capped scores, with their s×s tensors per head)"
            ));
        }
        let sdpa = sdpa && !self.attention_sinks;
        if let Some(q) = &self.quantization {
            notes.push(format!(
                "quantization_config ({q}) is not modelled: the plan is of the dequantized \
                 model (as from_pretrained loads it with the quantization config's \
                 dequantize=True, the way transformers trains it), its weights in the step's \
                 precision"
            ));
        }
        let narrow = (0..self.num_hidden_layers)
            .filter_map(|l| self.layer_window(l))
            .filter(|&w| w <= seq)
            .min();
        if let (Some(w), true) = (narrow, sdpa) {
            let repeat = if self.num_key_value_heads == self.num_attention_heads {
                ""
            } else {
                " and repeat_kv copies of k and v (enable_gqa is off with a mask)"
            };
            notes.push(format!(
                "sliding_window {w} is not longer than the sequence ({seq}): transformers \
                 5.17 then materialises the sliding-window mask (masking_utils: kv_length >= \
                 local_size), and each sliding layer's SDPA call \
                 gets a float copy of it, kept for backward{repeat}; not modelled (planned as \
                 full causal attention)"
            ));
        }
        notes
    }

    /// Whether layer `layer` applies the rotary embedding (SmolLM3's `no_rope_layers`).
    pub fn layer_rope(&self, layer: u64) -> bool {
        !self.nope_layers.contains(&layer)
    }
}

/// Width of one attention head.
pub fn head_dim(p: &LlamaParams) -> u64 {
    p.head_dim
        .unwrap_or(p.hidden_size / p.num_attention_heads.max(1))
}

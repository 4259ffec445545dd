//! The sizes of a decoder that inference memory depends on, from the Llama-lineage
//! parameters (`model::families::llama`), and the refusals for what is not modelled yet.

use super::moe::MoeShape;
use crate::model::families::llama::{LlamaParams, head_dim};
use crate::model::{ModelSpec, Preset};
use crate::plan::PlanError;

/// A decoder-only model of the Llama lineage as inference sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderShape {
    pub model_type: String,
    pub layers: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub max_positions: u64,
    /// Per layer: its sliding window, `None` for full attention.
    pub windows: Vec<Option<u64>>,
    /// Gemma: RMSNorm `(1 + w)` in fp32, embeddings × √hidden.
    pub gemma: bool,
    /// Qwen3 / Gemma 3: RMSNorm of q and k over head_dim.
    pub qk_norm: bool,
    /// Gemma 2/3: norms after attention and MLP too.
    pub sandwich_norm: bool,
    /// Phi-3: one `qkv_proj` and one `gate_up_proj`.
    pub fused: bool,
    /// Gemma 3: separate rotary embeddings for local and global layers.
    pub two_rotaries: bool,
    pub final_softcap: bool,
    /// Gemma 2: `attn_logit_softcapping`, applied to the scores by eager attention only
    /// (`scores / cap`, `tanh`, `* cap`); transformers 5.17's `sdpa_attention_forward` takes
    /// the layer's `softcap=` keyword and drops it.
    pub attn_softcap: bool,
    /// `tie_word_embeddings`: `lm_head` is created with its own weight, then `post_init`'s
    /// `tie_weights` replaces it with the embedding's (the first one is freed).
    pub tied: bool,
    /// gpt-oss: RMSNorm's weight multiplies the fp32 normalised input before the cast back.
    pub fp32_product_norm: bool,
    /// gpt-oss: `_apply_rotary_emb` on the two halves (`cos`/`sin` of `head_dim / 2`).
    pub chunked_rope: bool,
    /// Phi-3: RoPE joined to the pass-through part by `torch.cat`.
    pub rope_cat: bool,
    /// gpt-oss: learned attention sinks joined to the scores (eager attention only).
    pub sinks: bool,
    /// The sparse mixture-of-experts blocks (Mixtral, Qwen2/3-MoE), `None` for a dense
    /// model.
    pub moe: Option<MoeShape>,
    /// Whether `generate` runs a logits processor over the vocabulary (`min_new_tokens`
    /// masks the EOS token: the config has one).
    pub eos: bool,
}

impl DecoderShape {
    /// The shape of `preset`, or an error naming what is not modelled yet.
    pub fn of(preset: &Preset) -> Result<DecoderShape, PlanError> {
        let ModelSpec::Llama(p) = &preset.spec else {
            return Err(PlanError::Field {
                field: "model",
                reason: format!(
                    "inference (--step prefill|generate) is not modelled yet for the {} family \
                     of {}; it is for the decoders of the Llama lineage (llama, mistral, qwen2, \
                     qwen3, gemma, gemma2, gemma3_text, phi3)",
                    crate::model::hf::family_label(preset),
                    preset.id
                ),
            });
        };
        Self::from_params(p)
    }

    pub fn from_params(p: &LlamaParams) -> Result<DecoderShape, PlanError> {
        let model_type = p.model_type.clone().unwrap_or_else(|| "llama".into());
        // The decoders of issue 30 run other ops than the forward `plan::inference` mirrors.
        let gpt_oss = model_type == "gpt_oss";
        let other = [
            (
                p.norm.is_some() && !gpt_oss,
                "its norm layers (LayerNorm / OLMo 2's RMSNorm)",
            ),
            (p.post_norm, "norms after attention and MLP only (OLMo 2)"),
            (p.plain_mlp, "a non-gated MLP (StarCoder2)"),
            (!p.nope_layers.is_empty(), "layers without RoPE (SmolLM3)"),
            (p.multipliers.is_some(), "µP multipliers (Granite)"),
            (p.falcon.is_some(), "Falcon's fused, parallel layer"),
            (p.mla.is_some(), "multi-head latent attention (DeepSeek-V3)"),
            (p.attention_sinks && !gpt_oss, "attention sinks"),
        ];
        if let Some((_, what)) = other.iter().find(|(on, _)| *on) {
            return Err(PlanError::Field {
                field: "model",
                reason: format!(
                    "inference (--step prefill|generate) of {model_type} is not modelled yet: \
                     its forward has {what}, which the inference planner does not mirror; \
                     training steps (--step train / eval) are"
                ),
            });
        }
        let moe = match &p.moe {
            Some(m) => Some(MoeShape::of(m, p.num_hidden_layers, &model_type)?),
            None => None,
        };
        Ok(DecoderShape {
            moe,
            fp32_product_norm: gpt_oss,
            chunked_rope: gpt_oss,
            sinks: gpt_oss,
            rope_cat: model_type == "phi3",
            layers: p.num_hidden_layers,
            hidden: p.hidden_size,
            intermediate: p.intermediate_size,
            heads: p.num_attention_heads,
            kv_heads: p.num_key_value_heads,
            head_dim: head_dim(p),
            vocab: p.vocab_size,
            max_positions: p.max_position_embeddings,
            windows: (0..p.num_hidden_layers)
                .map(|l| p.layer_window(l))
                .collect(),
            gemma: p.gemma,
            qk_norm: p.qk_norm,
            sandwich_norm: p.sandwich_norm,
            fused: p.fused_projections,
            two_rotaries: model_type == "gemma3_text",
            final_softcap: p.final_logit_softcapping.is_some(),
            attn_softcap: p.attn_logit_softcapping.is_some(),
            tied: p.tie_word_embeddings,
            eos: true,
            model_type,
        })
    }

    /// Query width (`heads × head_dim`).
    pub fn q_width(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key (or value) width (`kv_heads × head_dim`).
    pub fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Whether key/value heads are shared by several query heads (GQA / MQA).
    pub fn grouped(&self) -> bool {
        self.kv_heads != self.heads
    }
}

//! The MoE fields of a decoder's `config.json` (Mixtral, Qwen2-MoE, Qwen3-MoE) and their
//! checks; the block they build is in [`super::moe`].

use serde::{Deserialize, Serialize};

use crate::model::ModelError;

/// The MoE fields of a decoder's config (`LlamaParams::moe`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MoeParams {
    /// Experts per MoE layer (`num_local_experts` / `num_experts`).
    pub num_experts: u64,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub num_experts_per_tok: u64,
    /// Width of one expert (Mixtral: `intermediate_size`; Qwen: `moe_intermediate_size`).
    pub moe_intermediate_size: u64,
    /// The top-k scores are renormalised to sum to 1 (Mixtral always).
    #[serde(default, skip_serializing_if = "is_false")]
    pub norm_topk_prob: bool,
    /// The scores stay fp32 (Mixtral); else they are cast back to the logits' dtype (Qwen).
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp32_scores: bool,
    /// A shared expert of this width gated by a sigmoid (Qwen2-MoE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<u64>,
    /// Every `decoder_sparse_step`-th layer is sparse (`(l + 1) % step == 0`), the others dense.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub decoder_sparse_step: u64,
    /// Layers that keep the dense MLP (`mlp_only_layers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mlp_only_layers: Vec<u64>,
    /// The router logits are returned and the load-balancing loss is added.
    #[serde(default, skip_serializing_if = "is_false")]
    pub output_router_logits: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn invalid(field: &str, reason: String) -> ModelError {
    ModelError::Invalid {
        field: field.into(),
        reason,
    }
}

impl MoeParams {
    /// Checks the counts; errors name the field.
    pub fn validate(&self) -> Result<(), ModelError> {
        crate::model::check_positive("params.moe.num_experts", self.num_experts)?;
        crate::model::check_positive("params.moe.num_experts_per_tok", self.num_experts_per_tok)?;
        crate::model::check_positive(
            "params.moe.moe_intermediate_size",
            self.moe_intermediate_size,
        )?;
        crate::model::check_positive("params.moe.decoder_sparse_step", self.decoder_sparse_step)?;
        if self.num_experts_per_tok > self.num_experts {
            return Err(invalid(
                "params.moe.num_experts_per_tok",
                format!(
                    "{} is more than num_experts {}",
                    self.num_experts_per_tok, self.num_experts
                ),
            ));
        }
        if let Some(s) = self.shared_expert_intermediate_size {
            crate::model::check_positive("params.moe.shared_expert_intermediate_size", s)?;
        }
        Ok(())
    }

    /// Whether layer `l` has the sparse block (transformers' `Qwen2MoeDecoderLayer` test).
    pub fn is_sparse(&self, l: u64) -> bool {
        !self.mlp_only_layers.contains(&l) && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Routed rows per sample: `seq·k`, times the imbalance factor (rounded up), at most
    /// every token on every expert.
    pub fn routed_rows(&self, seq: u64, imbalance: f64) -> u64 {
        let exact = seq.saturating_mul(self.num_experts_per_tok);
        let all = seq.saturating_mul(self.num_experts);
        if imbalance <= 1.0 || !imbalance.is_finite() {
            return exact;
        }
        let scaled = (exact as f64 * imbalance).ceil();
        if scaled >= all as f64 {
            all
        } else {
            scaled as u64
        }
    }
}

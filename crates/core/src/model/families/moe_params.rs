//! The MoE fields of a decoder's `config.json` (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3,
//! gpt-oss) and their checks; the block they build is in [`super::moe`].

use serde::{Deserialize, Serialize};

use crate::model::checks::ModelError;

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
    /// How the router scores the experts; absent: softmax of the logits (Mixtral, Qwen).
    #[serde(default, skip_serializing_if = "RouterKind::is_softmax")]
    pub router: RouterKind,
    /// How the routed experts run; absent: transformers' `grouped_mm` experts.
    #[serde(default, skip_serializing_if = "ExpertsKind::is_grouped_mm")]
    pub experts: ExpertsKind,
    /// The shared expert is added as is, without Qwen2-MoE's sigmoid gate (DeepSeek-V3's
    /// `shared_experts`, `moe_intermediate_size × n_shared_experts` wide).
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_expert_ungated: bool,
}

/// The router of a MoE block (transformers 5.17).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RouterKind {
    /// `gate` linear → softmax (fp32) → top-k (Mixtral, Qwen2/3-MoE).
    #[default]
    Softmax,
    /// `DeepseekV3TopkRouter`: the linear in fp32 (`x.type(float32)`, the weight cast),
    /// sigmoid, a group-limited top-k choice without gradient (`n_group` groups, the best
    /// `topk_group` kept), the chosen scores gathered, renormalised (`norm_topk_prob`) and
    /// scaled by `routed_scaling_factor`.
    SigmoidGrouped { n_group: u64, topk_group: u64 },
    /// `GptOssTopKRouter`: a linear with bias, top-k of the logits, softmax of the k values.
    TopKSoftmax,
}

impl RouterKind {
    fn is_softmax(&self) -> bool {
        *self == RouterKind::Softmax
    }
}

/// How the routed experts of a MoE block run (transformers 5.17).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertsKind {
    /// `@use_experts_implementation`'s default, `grouped_mm` (Mixtral, Qwen, DeepSeek-V3).
    #[default]
    GroupedMm,
    /// `GptOssExperts.forward` (not routed through the experts interface): a Python loop over
    /// the experts hit, each `x[token_idx] @ gate_up_proj[e] + bias`, the clamped SwiGLU
    /// `(up.clamp(±7) + 1) · gate.clamp(max=7) · sigmoid(1.702 · gate)`, `@ down_proj[e] +
    /// bias`, times the routing weight, `index_add_` into the output.
    ClampedSwigluLoop,
}

impl ExpertsKind {
    fn is_grouped_mm(&self) -> bool {
        *self == ExpertsKind::GroupedMm
    }
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
        crate::model::checks::check_positive("params.moe.num_experts", self.num_experts)?;
        crate::model::checks::check_positive(
            "params.moe.num_experts_per_tok",
            self.num_experts_per_tok,
        )?;
        crate::model::checks::check_positive(
            "params.moe.moe_intermediate_size",
            self.moe_intermediate_size,
        )?;
        crate::model::checks::check_positive(
            "params.moe.decoder_sparse_step",
            self.decoder_sparse_step,
        )?;
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
            crate::model::checks::check_positive("params.moe.shared_expert_intermediate_size", s)?;
        }
        if let RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
        } = self.router
        {
            crate::model::checks::check_positive("params.moe.router.n_group", n_group)?;
            crate::model::checks::check_positive("params.moe.router.topk_group", topk_group)?;
            if !self.num_experts.is_multiple_of(n_group) {
                return Err(invalid(
                    "params.moe.router.n_group",
                    format!("{n_group} does not divide num_experts {}", self.num_experts),
                ));
            }
            if topk_group > n_group {
                return Err(invalid(
                    "params.moe.router.topk_group",
                    format!("{topk_group} is more than n_group {n_group}"),
                ));
            }
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

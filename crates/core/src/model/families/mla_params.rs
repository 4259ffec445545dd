//! The keys of multi-head latent attention (DeepSeek-V3), apart from its graph
//! ([`super::mla`]) so that the decoder's parameters can hold them.

use crate::model::checks::ModelError;
use serde::{Deserialize, Serialize};

/// The multi-head latent attention keys of a `deepseek_v3` config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MlaParams {
    /// Rank of the query's low-rank projection; `None`: one full `q_proj`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_lora_rank: Option<u64>,
    /// Rank of the compressed key/value latent.
    pub kv_lora_rank: u64,
    /// Per-head query/key width without rotary embedding.
    pub qk_nope_head_dim: u64,
    /// Per-head query/key width with rotary embedding (one key head shared by all).
    pub qk_rope_head_dim: u64,
    /// Per-head value width.
    pub v_head_dim: u64,
}

impl MlaParams {
    /// Width of one query / key head.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
    }

    /// Checks the ranks and widths; errors name the field.
    pub fn validate(&self) -> Result<(), ModelError> {
        use crate::model::checks::check_positive;
        if let Some(r) = self.q_lora_rank {
            check_positive("params.mla.q_lora_rank", r)?;
        }
        check_positive("params.mla.kv_lora_rank", self.kv_lora_rank)?;
        check_positive("params.mla.qk_nope_head_dim", self.qk_nope_head_dim)?;
        check_positive("params.mla.qk_rope_head_dim", self.qk_rope_head_dim)?;
        check_positive("params.mla.v_head_dim", self.v_head_dim)
    }
}

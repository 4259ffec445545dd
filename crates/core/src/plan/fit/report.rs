//! What the "make it fit" search is asked ([`FitRequest`]) and what it answers
//! ([`FitReport`], one [`FitCandidate`] per configuration that fits).

use serde::Serialize;

use super::cost::{CandidateTime, Speed};
use crate::plan::Gpu;
use crate::plan::config::TrainConfig;
use crate::plan::search::Budget;
use crate::units::Bytes;

/// What to search for.
#[derive(Debug, Clone)]
pub struct FitRequest {
    pub budget: Budget,
    /// Samples per optimizer step to keep (micro-batch × accumulation); `None` = the user's.
    pub effective_batch: Option<u64>,
    /// The card (bf16 support); `None` for a bare budget.
    pub gpu: Option<Gpu>,
    pub speed: Speed,
    /// Candidates to return at most.
    pub top: usize,
    /// Plans (event generation + batch search) to run at most.
    pub max_plans: usize,
    /// Threads the search plans on, its own included ([`crate::par::threads`] by default;
    /// the GUI leaves a core to its frames). The answer is the same for any number.
    pub threads: usize,
}

impl FitRequest {
    /// A request for `gpu` at `margin` with its catalog speed, top 10, 160 plans at most.
    pub fn for_gpu(gpu: &Gpu, margin: f64) -> FitRequest {
        FitRequest {
            budget: Budget {
                capacity: gpu.memory(),
                margin,
            },
            effective_batch: None,
            gpu: Some(gpu.clone()),
            speed: Speed::catalog(gpu),
            top: 10,
            max_plans: 160,
            threads: crate::par::threads(),
        }
    }
}

/// One configuration that fits.
#[derive(Debug, Clone, Serialize)]
pub struct FitCandidate {
    /// The configuration to run (micro-batch and accumulation included).
    pub config: TrainConfig,
    /// What it changes against the user's configuration, in words (empty: the user's own).
    pub changes: Vec<String>,
    /// What the changes cost besides memory.
    pub costs: Vec<String>,
    pub micro_batch: u64,
    pub accum: u64,
    /// The largest micro-batch that fits (up to the effective batch).
    pub max_micro_batch: u64,
    pub peak_allocated: Bytes,
    /// Peak reserved on this GPU (the cache releases segments before an OOM).
    pub peak_reserved: Bytes,
    pub nvidia_smi: Bytes,
    pub trainable_params: u64,
    pub time: CandidateTime,
    /// Whether this is the user's configuration as given.
    pub is_user_config: bool,
}

impl FitCandidate {
    /// "LoRA r8 on attn · bf16 · ckpt" — the settings that tell candidates apart.
    pub fn summary(&self) -> String {
        if self.changes.is_empty() {
            return "as configured".into();
        }
        self.changes.join("; ")
    }
}

/// The answer.
#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub effective_batch: u64,
    /// Ranked: the user's configuration first when it fits, then by time per sample.
    pub candidates: Vec<FitCandidate>,
    /// Why nothing fits (empty list), in words.
    pub reason: Option<String>,
    /// Combinations in the search space.
    pub combinations: usize,
    /// Combinations planned (events + batch search).
    pub planned: usize,
    /// Combinations dropped without planning: dead by monotonicity.
    pub pruned_dead: usize,
    /// Combinations dropped without planning: a subset of their changes fits, no slower.
    pub dominated: usize,
    /// Where the step times come from.
    pub speed_source: String,
}

//! The answers about one inference call (`vramlab plan --step generate|prefill`, `vramlab
//! max-batch --step …` and the GUI's Inference mode): whether the plan fits a GPU, and the
//! largest batch that does. Computed here once; the CLI and the GUI display them.

use crate::plan::PlanError;
use crate::plan::config::MAX_BATCH;
use crate::plan::inference::{InferPlan, InferPlanner, TracePoint};
use crate::plan::search::Budget;
use crate::units::Bytes;

/// Whether `plan` (made by `planner`) runs on `budget`'s GPU: the call replayed through the
/// caching allocator under the GPU's cap, freeing cached blocks and retrying before an OOM
/// as PyTorch does — the rule [`max_batch`] and `max-context` search by, so the verdict at
/// a batch never contradicts the largest batch.
pub fn fits(planner: &InferPlanner, plan: &InferPlan, budget: Budget) -> Result<bool, PlanError> {
    // Within the cap the capped allocator never reaches it: it runs as the plan's uncapped
    // replay did, so the capped replay (a third of what the GUI's frame computes when the
    // batch changes) is not needed.
    if plan.peak_reserved_bytes <= budget.allocator_cap(planner.context) {
        return Ok(true);
    }
    planner.fits(budget, plan.config.batch)
}

/// Whether a call that [`fits`] runs only because PyTorch frees its cached blocks and
/// retries (its unconstrained nvidia-smi bytes are over the usable memory): slower, and
/// `num_alloc_retries` counts it.
pub fn fits_only_by_freeing_cache(plan: &InferPlan, budget: Budget, fits: bool) -> bool {
    fits && plan.nvidia_smi_bytes > budget.usable()
}

/// The largest batch (≤ [`MAX_BATCH`]) whose call runs without a CUDA OOM on `budget`'s GPU;
/// `None` when batch 1 does not.
pub fn max_batch(planner: &InferPlanner, budget: Budget) -> Result<Option<u64>, PlanError> {
    planner.max_batch(budget, MAX_BATCH)
}

/// Everything the GUI's Inference mode shows about one call.
#[derive(Debug, Clone)]
pub struct InferAnswer {
    pub plan: InferPlan,
    pub usable: Bytes,
    /// [`fits`].
    pub fits: bool,
    /// [`max_batch`] for the same call (prompt, new tokens, cache, dtype, attention).
    pub max_batch: Option<u64>,
    /// The measured call's memory over its forwards ([`InferPlanner::trace`]).
    pub trace: Vec<TracePoint>,
}

impl InferAnswer {
    /// The plan at `batch`, its verdict on `budget`, the largest batch and the timeline
    /// (about `trace_points` points).
    pub fn new(
        planner: &InferPlanner,
        batch: u64,
        budget: Budget,
        trace_points: usize,
    ) -> Result<InferAnswer, PlanError> {
        let max = max_batch(planner, budget)?;
        InferAnswer::with_max_batch(planner, batch, budget, max, trace_points)
    }

    /// [`InferAnswer::new`] with the largest batch already searched (it does not depend on
    /// `batch`: the GUI searches it once per planner and budget).
    pub fn with_max_batch(
        planner: &InferPlanner,
        batch: u64,
        budget: Budget,
        max_batch: Option<u64>,
        trace_points: usize,
    ) -> Result<InferAnswer, PlanError> {
        let plan = planner.plan(batch)?;
        Ok(InferAnswer {
            fits: fits(planner, &plan, budget)?,
            usable: budget.usable(),
            max_batch,
            trace: planner.trace(batch, trace_points)?,
            plan,
        })
    }
}

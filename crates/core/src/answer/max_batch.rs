//! The largest micro-batch that fits a GPU (`vramlab max-batch`): the batch, the
//! accumulation that reaches a target effective batch, the plan at that batch and what the
//! cache really reaches on the card; or, when even batch 1 does not fit, what batch 1 needs
//! and the shortfall. Serialises as `max-batch --json`.

use serde::ser::Error as _;
use serde::{Serialize, Serializer};

use super::verdict::PlanBand;
use crate::plan::config::{LoopShape, MAX_BATCH};
use crate::plan::search::{Budget, accumulation_for, max_batch};
use crate::plan::{Gpu, Plan, PlanError, Planner};
use crate::units::Bytes;

/// The largest micro-batch of a configuration on a GPU, or why there is none.
#[derive(Debug, Clone)]
pub struct MaxBatchReport {
    pub model: String,
    pub gpu: Gpu,
    pub budget: Budget,
    pub loop_shape: LoopShape,
    /// The target (decoder) length used, for an encoder-decoder model.
    pub target_seq: Option<u64>,
    /// The measured band the search judged with, in words.
    pub band_note: String,
    pub outcome: Outcome,
}

/// Whether any micro-batch fits.
#[derive(Debug, Clone)]
pub enum Outcome {
    Fits(Box<Largest>),
    /// Even batch 1 does not fit.
    NothingFits(Box<BatchOne>),
}

/// The largest micro-batch that fits, and the step at it.
#[derive(Debug, Clone)]
pub struct Largest {
    pub max_batch: u64,
    /// The effective batch asked for, and the accumulation steps of `max_batch` reaching it.
    pub target: Option<(u64, u64)>,
    /// The plan at `max_batch`.
    pub plan: Plan,
    /// Peak reserved on this GPU: near its limit PyTorch frees cached segments instead of
    /// reserving more, so the uncapped figure can exceed the card (`None`: it runs out).
    pub reserved_on_gpu: Option<Bytes>,
    /// `reserved_on_gpu` plus the CUDA context.
    pub nvidia_smi_on_gpu: Option<Bytes>,
    pub error_band: PlanBand,
}

impl Largest {
    /// The batch runs only because the allocator frees its cache and retries (slower).
    pub fn needs_cache_flush(&self) -> Option<bool> {
        self.nvidia_smi_on_gpu
            .map(|on_gpu| self.plan.nvidia_smi_bytes > on_gpu)
    }
}

/// What batch 1 needs when it does not fit.
#[derive(Debug, Clone)]
pub struct BatchOne {
    pub plan: Plan,
    /// nvidia-smi bytes over the usable memory.
    pub shortfall: Bytes,
    /// The front end's command for the fit search of this configuration.
    pub fit_command: String,
}

impl MaxBatchReport {
    /// Searches `planner`'s configuration on `gpu` within `budget`; `target_batch`: an
    /// effective batch to reach with accumulation (at least 1). `fit_command` is shown when
    /// even batch 1 does not fit.
    pub fn new(
        planner: &Planner,
        gpu: Gpu,
        budget: Budget,
        target_batch: Option<u64>,
        fit_command: String,
    ) -> Result<MaxBatchReport, PlanError> {
        let outcome = match max_batch(planner, budget, MAX_BATCH)? {
            None => {
                let plan = planner.plan(1)?;
                let shortfall = plan.nvidia_smi_bytes.saturating_sub(budget.usable());
                Outcome::NothingFits(Box::new(BatchOne {
                    plan,
                    shortfall,
                    fit_command,
                }))
            }
            Some(m) => {
                let plan = planner.plan(m)?;
                let reserved_on_gpu =
                    planner.reserved_within(m, budget.allocator_cap(planner.context))?;
                Outcome::Fits(Box::new(Largest {
                    max_batch: m,
                    target: target_batch.map(|t| (t, accumulation_for(t, m))),
                    nvidia_smi_on_gpu: reserved_on_gpu.and_then(|r| r.checked_add(planner.context)),
                    reserved_on_gpu,
                    error_band: PlanBand::new(&plan, &planner.band()),
                    plan,
                }))
            }
        };
        Ok(MaxBatchReport {
            model: planner.model.clone(),
            gpu,
            budget,
            loop_shape: planner.config.loop_shape,
            target_seq: planner.target_seq,
            band_note: planner.band().describe(),
            outcome,
        })
    }
}

/// `max-batch --json` when a micro-batch fits.
#[derive(Serialize)]
struct FitsJson<'a> {
    accumulation_steps: Option<u64>,
    error_band: &'a PlanBand,
    gpu: &'a str,
    gpu_memory_bytes: Bytes,
    #[serde(rename = "loop")]
    loop_shape: LoopShape,
    max_batch: u64,
    model: &'a str,
    needs_cache_flush: Option<bool>,
    nvidia_smi_bytes: Bytes,
    nvidia_smi_on_gpu_bytes: Option<Bytes>,
    peak_allocated_bytes: Bytes,
    peak_reserved_bytes: Bytes,
    peak_reserved_on_gpu_bytes: Option<Bytes>,
    target_batch: Option<u64>,
    target_seq: Option<u64>,
    usable_bytes: Bytes,
}

/// `max-batch --json` when even batch 1 does not fit.
#[derive(Serialize)]
struct NothingFitsJson<'a> {
    batch1_nvidia_smi_bytes: Bytes,
    batch1_peak_allocated_bytes: Bytes,
    fit_command: &'a str,
    gpu: &'a str,
    gpu_memory_bytes: Bytes,
    max_batch: Option<u64>,
    model: &'a str,
    shortfall_bytes: Bytes,
    usable_bytes: Bytes,
}

impl Serialize for MaxBatchReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let v = match &self.outcome {
            Outcome::Fits(l) => serde_json::to_value(FitsJson {
                accumulation_steps: l.target.map(|(_, k)| k),
                error_band: &l.error_band,
                gpu: &self.gpu.id,
                gpu_memory_bytes: self.gpu.memory(),
                loop_shape: self.loop_shape,
                max_batch: l.max_batch,
                model: &self.model,
                needs_cache_flush: l.needs_cache_flush(),
                nvidia_smi_bytes: l.plan.nvidia_smi_bytes,
                nvidia_smi_on_gpu_bytes: l.nvidia_smi_on_gpu,
                peak_allocated_bytes: l.plan.peak_allocated_bytes,
                peak_reserved_bytes: l.plan.peak_reserved_bytes,
                peak_reserved_on_gpu_bytes: l.reserved_on_gpu,
                target_batch: l.target.map(|(t, _)| t),
                target_seq: self.target_seq,
                usable_bytes: self.budget.usable(),
            }),
            Outcome::NothingFits(b) => serde_json::to_value(NothingFitsJson {
                batch1_nvidia_smi_bytes: b.plan.nvidia_smi_bytes,
                batch1_peak_allocated_bytes: b.plan.peak_allocated_bytes,
                fit_command: &b.fit_command,
                gpu: &self.gpu.id,
                gpu_memory_bytes: self.gpu.memory(),
                max_batch: None,
                model: &self.model,
                shortfall_bytes: b.shortfall,
                usable_bytes: self.budget.usable(),
            }),
        };
        // Through serde_json's sorted map, as `max-batch --json` has always been written.
        v.map_err(S::Error::custom)?.serialize(serializer)
    }
}

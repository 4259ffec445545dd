//! What the planner says about a model that ran out of memory: the failing batch's
//! prediction, the largest micro-batch that fits, the accumulation that keeps the effective
//! batch, the planned remedies and the evaluation step with and without `no_grad` (`plan`
//! of `doctor --json`; the GUI's Doctor tab shows it for the Planner tab's model).

use serde::Serialize;

use super::report::PlanReport;
use crate::doctor::{self, Diagnosis};
use crate::model::Preset;
use crate::plan::config::MAX_BATCH;
use crate::plan::remedies::{Remedy, remedies};
use crate::plan::search::{Budget, accumulation_for, max_batch, max_batch_capped};
use crate::plan::step_kind::StepKind;
use crate::plan::{Plan, PlanError, Planner, TrainConfig};
use crate::units::Bytes;

/// A planned remedy, as the doctor reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedRemedy {
    pub name: String,
    pub description: String,
    pub nvidia_smi_bytes: Bytes,
    pub saving_bytes: i64,
    pub fits: bool,
}

impl From<&Remedy> for PlannedRemedy {
    fn from(r: &Remedy) -> PlannedRemedy {
        PlannedRemedy {
            name: r.name.to_string(),
            description: r.description.clone(),
            nvidia_smi_bytes: r.nvidia_smi,
            saving_bytes: r.saving,
            fits: r.fits,
        }
    }
}

/// What the planner says about the model that ran out of memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanAdvice {
    pub model: String,
    /// The GPU's memory.
    pub capacity_bytes: Bytes,
    /// The per-process cap the plan is held to (`set_per_process_memory_fraction`, the
    /// message's "… allowed"): PyTorch's allocator may reserve at most this.
    pub allowed_bytes: Option<Bytes>,
    /// The training-loop shape planned (`--loop`).
    pub loop_shape: &'static str,
    pub batch: Option<u64>,
    pub predicted_nvidia_smi_bytes: Option<Bytes>,
    pub predicted_peak_allocated_bytes: Option<Bytes>,
    pub max_batch: Option<u64>,
    /// Accumulation steps that keep the failing batch as the effective batch.
    pub accumulation_for_batch: Option<u64>,
    pub remedies: Vec<PlannedRemedy>,
    /// The evaluation step with and without `torch.no_grad()`.
    pub evaluation: Option<EvalAdvice>,
    /// The planned allocated timeline at the failing batch (event index, bytes).
    #[serde(skip)]
    pub timeline: Vec<(u32, u64)>,
    /// The bytes a plan may use (the budget's usable memory; not in `doctor --json`).
    #[serde(skip)]
    pub usable_bytes: Bytes,
    /// The card's name, when the advice is for a named card (not in `doctor --json`).
    #[serde(skip)]
    pub gpu_name: Option<String>,
}

/// One planned evaluation step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalPlan {
    pub peak_allocated_bytes: Bytes,
    pub nvidia_smi_bytes: Bytes,
    pub fits: bool,
}

/// The evaluation step after training, with and without `torch.no_grad()` (the seed
/// articles' validation OOM), at the configured batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalAdvice {
    pub batch: u64,
    pub no_grad: EvalPlan,
    pub with_grad: EvalPlan,
}

fn timeline_of(plan: Option<&Plan>) -> Vec<(u32, u64)> {
    plan.map(|p| {
        p.timeline
            .iter()
            .map(|t| (t.index, t.allocated.0))
            .collect()
    })
    .unwrap_or_default()
}

/// Accumulation steps of the largest micro-batch that keep the failing batch.
fn accumulation(batch: Option<u64>, max: Option<u64>) -> Option<u64> {
    match (batch, max) {
        (Some(b), Some(m)) if m < b => Some(accumulation_for(b, m)),
        _ => None,
    }
}

/// The planner's answer for `preset` under `cfg` on `capacity` bytes, PyTorch's allocator
/// held to `allowed` bytes when a per-process cap is known (`batch`: the one that failed,
/// if known; `margin`: the fraction kept free, in [0, 1)).
pub fn advise(
    preset: &Preset,
    mut cfg: TrainConfig,
    capacity: Bytes,
    allowed: Option<Bytes>,
    margin: f64,
    batch: Option<u64>,
) -> Result<PlanAdvice, PlanError> {
    if let Some(b) = batch {
        cfg.batch = b;
        cfg.validate()?;
    }
    let planner = Planner::new(preset, &cfg)?;
    // A cap limits what the allocator reserves; the CUDA context lies outside it
    // (`set_per_process_memory_fraction` checks `total_allocated_memory`, the allocator's
    // segments). The remedies and the evaluation step are held to the same bytes.
    let allowed = allowed.filter(|c| *c < capacity);
    let budget = match allowed {
        Some(c) => Budget {
            capacity: Bytes(c.0.saturating_add(planner.context.0)).min(capacity),
            margin,
        },
        None => Budget { capacity, margin },
    };
    let predicted = match batch {
        Some(b) => Some(planner.plan(b)?),
        None => None,
    };
    let max = match allowed {
        Some(c) => max_batch_capped(
            &planner,
            Budget {
                capacity: c,
                margin,
            }
            .usable()
            .min(Budget { capacity, margin }.allocator_cap(planner.context)),
            MAX_BATCH,
        )?,
        None => max_batch(&planner, budget, MAX_BATCH)?,
    };
    let mut fixes: Vec<PlannedRemedy> = remedies(preset, &cfg, budget)?
        .iter()
        .map(PlannedRemedy::from)
        .collect();
    let evaluation = evaluation_advice(preset, &cfg, budget)?;
    if cfg.step != StepKind::Eval
        && evaluation.no_grad.peak_allocated_bytes < evaluation.with_grad.peak_allocated_bytes
    {
        let (with, without) = (
            evaluation.with_grad.peak_allocated_bytes,
            evaluation.no_grad.peak_allocated_bytes,
        );
        fixes.push(PlannedRemedy {
            name: "eval-no-grad".into(),
            description: format!(
                "if it failed in validation: run evaluation under `torch.no_grad()` (or \
                 `torch.inference_mode()`) and accumulate `loss.item()`, not `loss` — at batch {} \
                 an evaluation step after training peaks at {with} allocated with autograd on, \
                 {without} without",
                evaluation.batch,
            ),
            nvidia_smi_bytes: evaluation.no_grad.nvidia_smi_bytes,
            saving_bytes: with.0 as i64 - without.0 as i64,
            fits: evaluation.no_grad.fits,
        });
    }
    Ok(PlanAdvice {
        model: preset.id.clone(),
        capacity_bytes: capacity,
        allowed_bytes: allowed,
        loop_shape: cfg.loop_shape.as_str(),
        batch,
        predicted_nvidia_smi_bytes: predicted.as_ref().map(|p| p.nvidia_smi_bytes),
        predicted_peak_allocated_bytes: predicted.as_ref().map(|p| p.peak_allocated_bytes),
        max_batch: max,
        accumulation_for_batch: accumulation(batch, max),
        remedies: fixes,
        evaluation: Some(evaluation),
        timeline: timeline_of(predicted.as_ref()),
        usable_bytes: budget.usable(),
        gpu_name: None,
    })
}

fn evaluation_advice(
    preset: &Preset,
    cfg: &TrainConfig,
    budget: Budget,
) -> Result<EvalAdvice, PlanError> {
    let plan_of = |step: StepKind| -> Result<EvalPlan, PlanError> {
        let c = TrainConfig { step, ..*cfg };
        let p = Planner::new(preset, &c)?.plan(cfg.batch)?;
        Ok(EvalPlan {
            peak_allocated_bytes: p.peak_allocated_bytes,
            nvidia_smi_bytes: p.nvidia_smi_bytes,
            fits: p.nvidia_smi_bytes <= budget.usable(),
        })
    };
    Ok(EvalAdvice {
        batch: cfg.batch,
        no_grad: plan_of(StepKind::Eval)?,
        with_grad: plan_of(StepKind::EvalGrad)?,
    })
}

impl PlanAdvice {
    /// The advice for a plan the front end already has (the GUI's Planner tab): its batch
    /// as the one that failed, on the whole card; no evaluation step.
    pub fn from_report(r: &PlanReport) -> PlanAdvice {
        let p = &r.plan;
        let batch = Some(p.config.batch);
        let max = r.max_batch.as_ref().ok().copied().flatten();
        PlanAdvice {
            model: p.model.clone(),
            capacity_bytes: r.budget.capacity,
            allowed_bytes: None,
            loop_shape: p.config.loop_shape.as_str(),
            batch,
            predicted_nvidia_smi_bytes: Some(p.nvidia_smi_bytes),
            predicted_peak_allocated_bytes: Some(p.peak_allocated_bytes),
            max_batch: max,
            accumulation_for_batch: accumulation(batch, max),
            remedies: r
                .remedies
                .as_ref()
                .map(|l| l.iter().map(PlannedRemedy::from).collect())
                .unwrap_or_default(),
            evaluation: None,
            timeline: timeline_of(Some(p)),
            usable_bytes: r.budget.usable(),
            gpu_name: Some(r.gpu.name.clone()),
        }
    }

    /// The planned remedies that fit.
    pub fn fitting_remedies(&self) -> impl Iterator<Item = &PlannedRemedy> {
        self.remedies.iter().filter(|r| r.fits)
    }

    /// Adds the planner's verdict to a diagnosis: when the failing batch does not fit this
    /// GPU at all, fixing the allocator alone cannot help — say so, and put the batch that
    /// fits first.
    pub fn add_verdict_to(&self, d: &mut Diagnosis) {
        let (Some(batch), Some(need)) = (self.batch, self.predicted_nvidia_smi_bytes) else {
            return;
        };
        let too_big = self.max_batch.is_none_or(|m| m < batch);
        let under = match self.allowed_bytes {
            Some(c) => format!("the {c} cap of a {} GPU", self.capacity_bytes),
            None => format!("a {} GPU", self.capacity_bytes),
        };
        if !too_big {
            d.evidence.push(format!(
                "The planner predicts {need} for batch {batch} of {} ({} loop): it fits {under} \
                 with the margin, so the failure is not the model's size.",
                self.model, self.loop_shape
            ));
            return;
        }
        d.evidence.push(format!(
            "The planner predicts {need} for batch {batch} of {} ({} loop) under {under}: this \
             batch does not fit even without fragmentation or other holders.",
            self.model, self.loop_shape
        ));
        let detail = match (self.max_batch, self.accumulation_for_batch) {
            (Some(m), Some(k)) => format!(
                "The largest micro-batch that fits is {m}; {k} gradient-accumulation steps of {} \
                 keep the effective batch of {batch}.",
                batch.div_ceil(k)
            ),
            (Some(m), None) => format!("The largest micro-batch that fits is {m}."),
            _ => "Even batch 1 does not fit: see the planned remedies.".to_string(),
        };
        d.remedies.insert(
            0,
            doctor::Remedy {
                title: "Use a batch that fits (planner)".to_string(),
                detail,
                setting: self.max_batch.map(|m| format!("batch_size={m}")),
            },
        );
    }
}

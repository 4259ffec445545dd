//! [`Verdict`]: whether a plan fits a GPU, judged at the upper edge of the measured error
//! band of its mode ([`crate::plan::band`]), with that band in bytes ([`PlanBand`]).

use serde::Serialize;

use crate::plan::band::{ErrorBand, ErrorStats};
use crate::plan::search::{Budget, fits_with_reserved};
use crate::plan::{Plan, PlanError, Planner};
use crate::units::Bytes;

/// One peak of a plan with its measured band: the measured peak of this mode has been
/// within `lower ..= upper` for every measured row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BandEdges {
    pub planned_bytes: Bytes,
    pub lower_bytes: Bytes,
    pub upper_bytes: Bytes,
    /// Signed relative errors, percent, (planned − measured) / measured, of the rows behind
    /// the band (widened when the mode has no measured row).
    pub min_error_pct: f64,
    pub median_error_pct: f64,
    pub max_error_pct: f64,
}

impl BandEdges {
    fn new(planned: Bytes, s: ErrorStats) -> BandEdges {
        BandEdges {
            planned_bytes: planned,
            lower_bytes: s.lower(planned),
            upper_bytes: s.upper(planned),
            min_error_pct: s.min,
            median_error_pct: s.median,
            max_error_pct: s.max,
        }
    }
}

/// A plan's measured error band (`error_band` in `plan --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanBand {
    /// The plan's mode, `family/finetune/strategy`.
    pub mode: String,
    /// Whether any measured row has this exact mode.
    pub measured: bool,
    /// Measured rows of this exact mode.
    pub mode_rows: u32,
    /// The level whose rows give the band: the mode itself, `text:*/finetune/strategy` (or
    /// `image:`), `*/finetune/strategy` or `*/*/*`.
    pub source: String,
    /// Rows behind the band.
    pub rows: u32,
    /// Widened because no measured row has this mode.
    pub widened: bool,
    /// The level whose bounds at the band's risk (1 in [`crate::plan::band::RISK`]) widen the band of a mode
    /// with fewer than `RISK − 1` rows.
    pub pooled_with: Option<String>,
    pub allocated: BandEdges,
    pub reserved: BandEdges,
    /// One line for people: the basis and the errors.
    pub note: String,
    /// What the band rests on ([`ErrorBand::basis`]), for the band line.
    #[serde(skip)]
    pub basis: String,
}

impl PlanBand {
    /// `band` applied to `plan`'s peaks.
    pub fn new(plan: &Plan, band: &ErrorBand) -> PlanBand {
        PlanBand {
            mode: band.mode.clone(),
            measured: band.measured,
            mode_rows: band.mode_rows,
            source: band.source.clone(),
            rows: band.rows,
            widened: band.widened,
            pooled_with: band.pooled_with.clone(),
            allocated: BandEdges::new(plan.peak_allocated_bytes, band.allocated),
            reserved: BandEdges::new(plan.peak_reserved_bytes, band.reserved),
            note: band.describe(),
            basis: band.basis(),
        }
    }
}

/// Whether a plan fits a GPU, and on what evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The step runs within the usable memory with its reserved bytes at the upper edge of
    /// the band (the caching allocator simulated under that cap, freeing cached blocks
    /// before an OOM as PyTorch does).
    pub fits: bool,
    pub usable_bytes: Bytes,
    /// Planned nvidia-smi bytes (reserved + CUDA context).
    pub nvidia_smi_bytes: Bytes,
    /// nvidia-smi bytes at the upper edge of the reserved band.
    pub nvidia_smi_upper_bytes: Bytes,
    pub error_band: PlanBand,
}

impl Verdict {
    /// The verdict on `plan` (made by `planner`) for `budget`.
    pub fn new(planner: &Planner, plan: &Plan, budget: Budget) -> Result<Verdict, PlanError> {
        let band = planner.band();
        let error_band = PlanBand::new(plan, &band);
        let fits =
            fits_with_reserved(planner, budget, plan.config.batch, plan.peak_reserved_bytes)?;
        let nvidia_smi_upper_bytes = error_band
            .reserved
            .upper_bytes
            .checked_add(plan.cuda_context_bytes)
            .ok_or(PlanError::Overflow(
                "nvidia-smi bytes at the band's upper edge",
            ))?;
        Ok(Verdict {
            fits,
            usable_bytes: budget.usable(),
            nvidia_smi_bytes: plan.nvidia_smi_bytes,
            nvidia_smi_upper_bytes,
            error_band,
        })
    }

    /// The band line shown under a plan, e.g. "measured error (gpt2/full/none, 31 rows):
    /// reserved 10.2–10.9 GiB (planned 10.5 GiB, −3.1 … +4.0 %) …".
    pub fn band_line(&self) -> String {
        let b = &self.error_band;
        let r = &b.reserved;
        let a = &b.allocated;
        let basis = &b.basis;
        format!(
            "measured error band ({basis}): reserved {} – {} ({:+.1} … {:+.1} %), allocated {} – {} ({:+.1} … {:+.1} %)",
            r.lower_bytes,
            r.upper_bytes,
            r.min_error_pct,
            r.max_error_pct,
            a.lower_bytes,
            a.upper_bytes,
            a.min_error_pct,
            a.max_error_pct
        )
    }
}

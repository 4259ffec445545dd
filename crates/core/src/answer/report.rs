//! The plan report: everything `vramlab plan` and the GUI's planner show about one
//! configuration on one GPU — the plan, the verdict with its measured band, the largest
//! micro-batch, the remedies (costs flagged), the next step when nothing fits, what was
//! assumed, the warnings and the multi-GPU figures. It serialises as `plan --json`
//! ([`super::report_json`]).

use super::next_step::{FitSuggestion, NextStep};
use super::per_rank::PerRank;
use super::verdict::Verdict;
use super::warnings;
use crate::model::Preset;
use crate::plan::config::MAX_BATCH;
use crate::plan::remedies::{self, Remedy};
use crate::plan::search::{Budget, max_batch};
use crate::plan::{Gpu, Plan, PlanError, Planner, TrainConfig};

/// A default the plan used because the user did not choose (`assumed` of `plan --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assumed {
    /// The front end's name for the setting (the CLI's flag, `--gpu`).
    pub setting: &'static str,
    pub value: &'static str,
}

/// A remedy that makes the plan fit, and at which micro-batch.
#[derive(Debug, Clone, Copy)]
pub struct FittingRemedy<'a> {
    pub remedy: &'a Remedy,
    /// The micro-batch it fits at: the configured one, or the largest it allows.
    pub micro_batch: u64,
    /// It fits at the configured micro-batch (else only up to `micro_batch`).
    pub as_configured: bool,
}

/// What a front end asks for: the configuration and what only it knows (its spelling of
/// the fit search, what the user left to defaults).
#[derive(Debug, Clone)]
pub struct PlanRequest<'a> {
    pub preset: &'a Preset,
    pub config: TrainConfig,
    pub gpu: Gpu,
    pub budget: Budget,
    /// The settings left to their defaults.
    pub assumed: Vec<Assumed>,
    /// The command that runs the fit search for this configuration (shown when nothing fits).
    pub fit_command: String,
    /// Run the fit search for its best combination when nothing fits (the text shows it).
    pub search_next_step: bool,
    /// Keep the allocated timeline in `plan --json`.
    pub timeline_in_json: bool,
}

/// Everything a front end shows about one plan, computed once.
#[derive(Debug, Clone)]
pub struct PlanReport {
    pub plan: Plan,
    pub gpu: Gpu,
    pub budget: Budget,
    /// Fits or not, at the upper edge of the measured band, with that band.
    pub verdict: Verdict,
    /// The largest micro-batch that fits (`Ok(None)`: not even batch 1), or why the search
    /// failed (the GUI still shows the plan then; the CLI fails).
    pub max_batch: Result<Option<u64>, PlanError>,
    /// Every applicable remedy, planned: remedies that save memory first, changes that add
    /// memory after ([`Remedy::adds_memory`]), or why they could not be planned.
    pub remedies: Result<Vec<Remedy>, PlanError>,
    /// When neither the plan nor any single remedy fits (and the front end gave a fit
    /// command).
    pub next_step: Option<NextStep>,
    pub assumed: Vec<Assumed>,
    /// Settings the card runs badly or not at all ([`warnings::for_config`]).
    pub warnings: Vec<String>,
    /// The figures of a multi-GPU plan (`None` on one GPU).
    pub per_rank: Option<PerRank>,
    /// Keep the allocated timeline in `plan --json`.
    pub timeline_in_json: bool,
}

/// The first part of a plan report: the plan and its verdict (the peaks, the band, fits
/// or not) before the largest micro-batch and the remedies, which plan the configuration
/// many times more. [`PlanStart::finish`] completes it into the report [`PlanReport::new`]
/// gives; the Python bindings answer the peaks from here and finish on first use.
#[derive(Debug, Clone)]
pub struct PlanStart {
    pub preset: Preset,
    /// The configuration as requested (the remedies and the fit search start from it).
    pub config: TrainConfig,
    pub planner: Planner,
    pub plan: Plan,
    pub verdict: Verdict,
    pub gpu: Gpu,
    pub budget: Budget,
    pub assumed: Vec<Assumed>,
    pub fit_command: String,
    pub search_next_step: bool,
    pub timeline_in_json: bool,
    /// The graph and its annotations the plan was made from, which most remedies keep.
    graphs: std::sync::Arc<crate::plan::GraphCache>,
}

impl PlanStart {
    /// Plans `req` at its batch and judges it.
    pub fn new(req: PlanRequest<'_>) -> Result<PlanStart, PlanError> {
        let graphs = std::sync::Arc::new(crate::plan::GraphCache::default());
        let planner = Planner::new_cached(req.preset, &req.config, &graphs)?;
        let plan = planner.plan(req.config.batch)?;
        let verdict = Verdict::new(&planner, &plan, req.budget)?;
        Ok(PlanStart {
            preset: req.preset.clone(),
            config: req.config,
            planner,
            plan,
            verdict,
            gpu: req.gpu,
            budget: req.budget,
            assumed: req.assumed,
            fit_command: req.fit_command,
            search_next_step: req.search_next_step,
            timeline_in_json: req.timeline_in_json,
            graphs,
        })
    }

    /// The warnings of the configuration on the GPU (as the report has them).
    pub fn warnings(&self) -> Vec<String> {
        warnings::for_planner(&self.planner, &self.gpu)
    }

    /// The whole report: the largest micro-batch, the remedies, and the next step when
    /// nothing fits.
    pub fn finish(&self) -> Result<PlanReport, PlanError> {
        let cfg = self.config;
        let max = max_batch(&self.planner, self.budget, MAX_BATCH)?;
        // Each remedy built and evaluated by the same thread: a thread's memory is reused
        // between the two (a thread that only evaluates what another built starts cold).
        let remedies = remedies::remedies_against(
            &self.preset,
            &cfg,
            &self.planner,
            self.plan.peak_allocated_bytes,
            self.plan.nvidia_smi_bytes,
            self.budget,
            &self.graphs,
        )?;
        let mut report = PlanReport::with_verdict(
            ReportParts {
                planner: &self.planner,
                plan: self.plan.clone(),
                gpu: self.gpu.clone(),
                budget: self.budget,
                max_batch: Ok(max),
                remedies: Ok(remedies),
            },
            self.verdict.clone(),
        );
        report.assumed = self.assumed.clone();
        report.timeline_in_json = self.timeline_in_json;
        if report.nothing_fits() {
            report.next_step = Some(NextStep {
                fit_command: self.fit_command.clone(),
                search: self
                    .search_next_step
                    .then(|| FitSuggestion::search(&self.preset, &cfg, &report.gpu, report.budget)),
            });
        }
        Ok(report)
    }
}

/// The parts a front end that caches them already has: the planner, its plan at the
/// current batch, the max-batch search and the remedies.
#[derive(Debug)]
pub struct ReportParts<'a> {
    pub planner: &'a Planner,
    pub plan: Plan,
    pub gpu: Gpu,
    pub budget: Budget,
    pub max_batch: Result<Option<u64>, PlanError>,
    pub remedies: Result<Vec<Remedy>, PlanError>,
}

impl PlanReport {
    /// Plans `req` and everything that follows from it (the CLI's `plan`; every error
    /// fails the report).
    pub fn new(req: PlanRequest<'_>) -> Result<PlanReport, PlanError> {
        PlanStart::new(req)?.finish()
    }

    /// The report from parts a front end already has (the GUI's caches): no next step, no
    /// assumed settings.
    pub fn from_parts(parts: ReportParts<'_>) -> Result<PlanReport, PlanError> {
        let verdict = Verdict::new(parts.planner, &parts.plan, parts.budget)?;
        Ok(PlanReport::with_verdict(parts, verdict))
    }

    fn with_verdict(parts: ReportParts<'_>, verdict: Verdict) -> PlanReport {
        PlanReport {
            warnings: warnings::for_planner(parts.planner, &parts.gpu),
            per_rank: PerRank::of(parts.planner),
            plan: parts.plan,
            gpu: parts.gpu,
            budget: parts.budget,
            verdict,
            max_batch: parts.max_batch,
            remedies: parts.remedies,
            next_step: None,
            assumed: Vec::new(),
            timeline_in_json: false,
        }
    }

    /// Whether the plan fits (the verdict's).
    pub fn fits(&self) -> bool {
        self.verdict.fits
    }

    /// The configuration planned.
    pub fn config(&self) -> &TrainConfig {
        &self.plan.config
    }

    /// The remedies that make the plan fit, each with its micro-batch (in the remedies'
    /// order; none when they could not be planned).
    pub fn fitting_remedies(&self) -> Vec<FittingRemedy<'_>> {
        let Ok(list) = &self.remedies else {
            return Vec::new();
        };
        list.iter()
            .filter_map(|r| match (r.fits, r.fits_up_to) {
                (true, _) => Some(FittingRemedy {
                    remedy: r,
                    micro_batch: r.config.batch,
                    as_configured: true,
                }),
                (false, Some(b)) => Some(FittingRemedy {
                    remedy: r,
                    micro_batch: b,
                    as_configured: false,
                }),
                (false, None) => None,
            })
            .collect()
    }

    /// Neither the plan nor any single remedy fits: the fit search is the next step.
    pub fn nothing_fits(&self) -> bool {
        !self.fits()
            && !self
                .remedies
                .as_ref()
                .is_ok_and(|l| l.iter().any(|r| r.fits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;
    use crate::plan::gpus::card as find;
    use crate::plan::{Optimizer, Precision};

    /// GPT-2 Large in fp32 at micro-batch 64 on a 12 GiB card: nothing fits as configured;
    /// the remedies that fit do so only at a smaller micro-batch, and the next step points
    /// at the fit search.
    #[test]
    fn remedies_that_fit_only_at_a_smaller_batch_and_the_next_step() {
        let preset = find_builtin("gpt2-large").expect("preset");
        let gpu = find("rtx-3060").expect("gpu");
        let budget = Budget {
            capacity: gpu.memory(),
            margin: 0.05,
        };
        let r = PlanReport::new(PlanRequest {
            preset: &preset,
            config: TrainConfig {
                batch: 64,
                size: Some(1024),
                precision: Precision::Fp32,
                optimizer: Optimizer::Sgd,
                ..TrainConfig::default()
            },
            gpu,
            budget,
            assumed: Vec::new(),
            fit_command: "vramlab fit …".into(),
            search_next_step: false,
            timeline_in_json: false,
        })
        .expect("report");
        assert!(!r.fits());
        let fitting = r.fitting_remedies();
        assert!(!fitting.is_empty());
        for f in &fitting {
            assert!(!f.as_configured, "{}", f.remedy.name);
            assert!(f.micro_batch < 64 && f.micro_batch >= 1);
            assert_eq!(f.remedy.fits_up_to, Some(f.micro_batch));
        }
        assert!(r.nothing_fits());
        let next = r.next_step.as_ref().expect("a next step");
        assert_eq!(next.fit_command, "vramlab fit …");
        assert!(next.search.is_none(), "not searched unless asked");
    }
}

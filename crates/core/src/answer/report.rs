//! The plan report: everything `vramlab plan` and the GUI's planner show about one
//! configuration on one GPU — the plan, the verdict with its measured band, the largest
//! micro-batch, the remedies (costs flagged), the next step when nothing fits, what was
//! assumed, the warnings and the multi-GPU figures. It serialises as `plan --json`
//! ([`super::report_json`]).

use super::next_step::{FitSuggestion, NextStep};
use super::per_rank::PerRank;
use super::remedy_planners::RemedyPlanners;
use super::verdict::Verdict;
use super::warnings;
use crate::model::Preset;
use crate::plan::config::MAX_BATCH;
use crate::plan::remedies::Remedy;
use crate::plan::search::{Budget, max_batch};
use crate::plan::{Gpu, Plan, PlanError, Planner, TrainConfig};

/// A default the plan used because the user did not choose (`assumed` of `plan --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assumed {
    /// The front end's name for the setting (the CLI's flag, `--gpu`).
    pub setting: &'static str,
    pub value: &'static str,
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
        let cfg = req.config;
        let planner = Planner::new(req.preset, &cfg)?;
        let plan = planner.plan(cfg.batch)?;
        let verdict = Verdict::new(&planner, &plan, req.budget)?;
        let max = max_batch(&planner, req.budget, MAX_BATCH)?;
        let remedies = RemedyPlanners::new(req.preset, &cfg).evaluate(&cfg, &plan, req.budget)?;
        let mut report = PlanReport::with_verdict(
            ReportParts {
                planner: &planner,
                plan,
                gpu: req.gpu,
                budget: req.budget,
                max_batch: Ok(max),
                remedies: Ok(remedies),
            },
            verdict,
        );
        report.assumed = req.assumed;
        report.timeline_in_json = req.timeline_in_json;
        if report.nothing_fits() {
            report.next_step = Some(NextStep {
                fit_command: req.fit_command,
                search: req
                    .search_next_step
                    .then(|| FitSuggestion::search(req.preset, &cfg, &report.gpu, report.budget)),
            });
        }
        Ok(report)
    }

    /// The report from parts a front end already has (the GUI's caches): no next step, no
    /// assumed settings.
    pub fn from_parts(parts: ReportParts<'_>) -> Result<PlanReport, PlanError> {
        let verdict = Verdict::new(parts.planner, &parts.plan, parts.budget)?;
        Ok(PlanReport::with_verdict(parts, verdict))
    }

    fn with_verdict(parts: ReportParts<'_>, verdict: Verdict) -> PlanReport {
        PlanReport {
            warnings: warnings::for_config(&parts.planner.config, &parts.gpu),
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

    /// Neither the plan nor any single remedy fits: the fit search is the next step.
    pub fn nothing_fits(&self) -> bool {
        !self.fits()
            && !self
                .remedies
                .as_ref()
                .is_ok_and(|l| l.iter().any(|r| r.fits))
    }
}

//! The next step when neither the plan nor any single remedy fits: the fit search's best
//! combination, the command that lists the rest, and LoRA / QLoRA where they apply.

use crate::model::Preset;
use crate::plan::fit::{FitCandidate, FitRequest, fit};
use crate::plan::search::Budget;
use crate::plan::{Gpu, PlanError, TrainConfig};

/// Where to go from a plan that does not fit, with no single remedy that does.
#[derive(Debug, Clone)]
pub struct NextStep {
    /// The front end's command for the ranked list of combinations (`fit_command` of
    /// `plan --json`).
    pub fit_command: String,
    /// The fit search's answer, when it was run (the text shows it; `plan --json` does not
    /// run it).
    pub search: Option<Result<FitSuggestion, PlanError>>,
}

/// The fit search's best combination, or why there is none.
#[derive(Debug, Clone)]
pub struct FitSuggestion {
    /// The fastest combination that fits.
    pub best: Option<FitCandidate>,
    /// Why no combination fits (when `best` is `None`).
    pub reason: String,
    /// Adapters (LoRA / QLoRA) would change the picture and the best combination has none:
    /// a token model fully fine-tuned.
    pub adapters_apply: bool,
}

impl FitSuggestion {
    /// Runs the fit search for `cfg` on `gpu` within `budget`, keeping its best answer.
    pub fn search(
        preset: &Preset,
        cfg: &TrainConfig,
        gpu: &Gpu,
        budget: Budget,
    ) -> Result<FitSuggestion, PlanError> {
        let mut req = FitRequest::for_gpu(gpu, budget.margin);
        req.budget = budget;
        req.top = 1;
        let report = fit(preset, cfg, &req)?;
        let best = report.candidates.into_iter().next();
        let adapters_apply = preset.input.is_tokens()
            && cfg.finetune.is_full()
            && !best
                .as_ref()
                .is_some_and(|c| c.config.finetune.mode.has_adapters());
        Ok(FitSuggestion {
            best,
            reason: report
                .reason
                .unwrap_or_else(|| "even the smallest settings exceed the GPU".to_string()),
            adapters_apply,
        })
    }
}

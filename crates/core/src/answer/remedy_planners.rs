//! The remedies' planners for one configuration, built once and evaluated at any
//! micro-batch: a batch change re-evaluates them without rebuilding (the GUI keeps one per
//! planner; the CLI builds one for its plan).

use crate::model::{ModelSpec, Preset};
use crate::plan::remedies::{self, Remedy};
use crate::plan::search::Budget;
use crate::plan::{Plan, PlanError, Planner, TrainConfig};

/// A planner per applicable remedy (by name), or why it could not be built.
#[derive(Debug, Clone)]
pub struct RemedyPlanners {
    list: Vec<(&'static str, Result<Planner, PlanError>)>,
    is_tokens: bool,
}

impl RemedyPlanners {
    /// Planners for the remedies of `cfg` at any batch. A captured graph plans only what it
    /// recorded: a remedy that needs a re-capture is left out.
    pub fn new(preset: &Preset, cfg: &TrainConfig) -> RemedyPlanners {
        let is_tokens = preset.input.is_tokens();
        // Batch ≥ 2 so that the batch-dependent remedy (half micro-batch) is included.
        let mut c = *cfg;
        c.batch = c.batch.max(2);
        let captured = matches!(preset.spec, ModelSpec::Captured(_));
        let list = remedies::candidates(&c, is_tokens)
            .into_iter()
            .filter_map(|(name, _, rc)| match Planner::new(preset, &rc) {
                Err(_) if captured => None,
                p => Some((name, p)),
            })
            .collect();
        RemedyPlanners { list, is_tokens }
    }

    /// Every remedy of `cfg` (the configuration these planners were built for, at any
    /// batch) against `plan`, its plan, on `budget`: remedies that save memory first,
    /// changes that add memory after ([`remedies::order`]).
    pub fn evaluate(
        &self,
        cfg: &TrainConfig,
        plan: &Plan,
        budget: Budget,
    ) -> Result<Vec<Remedy>, PlanError> {
        let mut list = Vec::new();
        for (name, description, rc) in remedies::candidates(cfg, self.is_tokens) {
            let Some((_, planner)) = self.list.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            list.push(remedies::evaluate(
                name,
                description,
                rc,
                planner.as_ref().map_err(Clone::clone)?,
                plan.peak_allocated_bytes,
                plan.nvidia_smi_bytes,
                budget,
            )?);
        }
        remedies::order(&mut list);
        Ok(list)
    }
}

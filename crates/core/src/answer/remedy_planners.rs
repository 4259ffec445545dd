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
        // Each remedy's events are generated on its own core ([`crate::par`]).
        let built = crate::par::map(remedies::candidates(&c, is_tokens), |(name, _, rc)| {
            (name, Planner::new(preset, &rc))
        });
        let list = built
            .into_iter()
            .filter_map(|(name, p)| match p {
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
        self.evaluate_on(crate::par::threads(), cfg, plan, budget)
    }

    /// [`Self::evaluate`] on at most `threads` threads (the GUI plans them on one worker,
    /// leaving the other cores to its frames and its search).
    pub fn evaluate_on(
        &self,
        threads: usize,
        cfg: &TrainConfig,
        plan: &Plan,
        budget: Budget,
    ) -> Result<Vec<Remedy>, PlanError> {
        let found: Vec<_> = remedies::candidates(cfg, self.is_tokens)
            .into_iter()
            .filter_map(|(name, description, rc)| {
                let (_, planner) = self.list.iter().find(|(n, _)| *n == name)?;
                Some((name, description, rc, planner))
            })
            .collect();
        // Each remedy is evaluated on its own core ([`crate::par`]), in the candidates' order.
        let mut list = crate::par::map_on(threads, found, |(name, description, rc, planner)| {
            remedies::evaluate(
                name,
                description,
                rc,
                planner.as_ref().map_err(Clone::clone)?,
                plan.peak_allocated_bytes,
                plan.nvidia_smi_bytes,
                budget,
            )
        })
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        remedies::order(&mut list);
        Ok(list)
    }
}

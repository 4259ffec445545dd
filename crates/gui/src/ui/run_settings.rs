//! The Run form's settings, persisted with the planner state: the engine, the interpreter,
//! the batches (a list, or a sweep until OOM) and the steps per trial; the batches proposed
//! from the plan's max batch.

use serde::{Deserialize, Serialize};

use vramlab_device::bench::{BatchPlan, EngineKind};

/// Steps per trial the form allows.
pub const MAX_STEPS: u32 = 1000;

/// How the batches of a run are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum BatchMode {
    /// The batches typed in the list field.
    #[default]
    List,
    /// From the predicted max batch up or down to the exact OOM boundary.
    Sweep,
}

/// The Run form; persisted with the planner state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSettings {
    pub engine: EngineKind,
    /// Interpreter for the PyTorch engine.
    pub python: String,
    pub mode: BatchMode,
    /// The batch list the user typed ("4,8,16"); used only when `batches_typed`.
    pub batches: String,
    /// The user typed the list; otherwise the list follows the plan's max batch
    /// ([`proposed_batches`]).
    pub batches_typed: bool,
    /// Timed steps per trial (after a warm-up step).
    pub steps: u32,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            engine: EngineKind::Native,
            python: "python3".into(),
            mode: BatchMode::List,
            batches: String::new(),
            batches_typed: false,
            steps: 3,
        }
    }
}

impl RunSettings {
    /// The batch list shown and run: what the user typed, else the plan's proposal.
    pub fn batch_list(&self, predicted_max: Option<u64>) -> String {
        if self.batches_typed {
            return self.batches.clone();
        }
        let list: Vec<String> = proposed_batches(predicted_max)
            .iter()
            .map(u64::to_string)
            .collect();
        list.join(",")
    }

    /// The batches to run: the list ([`Self::batch_list`]), or a sweep seeded by
    /// `predicted_max`.
    pub fn batch_plan(&self, predicted_max: Option<u64>, limit: u64) -> Result<BatchPlan, String> {
        match self.mode {
            BatchMode::List => {
                let list = self.batch_list(predicted_max);
                if list.trim().is_empty() && !self.batches_typed {
                    return Err(NOTHING_FITS.into());
                }
                vramlab_words::batches::batch_list(&list)
            }
            BatchMode::Sweep => Ok(BatchPlan::UntilOom {
                seed: predicted_max.unwrap_or(1).max(1),
                limit,
            }),
        }
    }
}

/// Why no batch list is proposed.
pub const NOTHING_FITS: &str =
    "The plan says not even batch 1 fits: type the batches to measure anyway, or sweep until OOM.";

/// The batches a run proposes for the plan's max batch `m`: m/4, m/2 and m (those ≥ 1),
/// so the boundary itself is measured and no batch the plan says cannot fit is proposed;
/// none when not even batch 1 fits.
pub fn proposed_batches(predicted_max: Option<u64>) -> Vec<u64> {
    let Some(m) = predicted_max.filter(|&m| m >= 1) else {
        return Vec::new();
    };
    let mut v: Vec<u64> = [m / 4, m / 2, m].into_iter().filter(|&b| b >= 1).collect();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proposal_follows_the_max_batch_and_never_exceeds_it() {
        assert_eq!(proposed_batches(Some(1)), vec![1]);
        assert_eq!(proposed_batches(Some(2)), vec![1, 2]);
        assert_eq!(proposed_batches(Some(3)), vec![1, 3]);
        assert_eq!(proposed_batches(Some(16)), vec![4, 8, 16]);
        assert_eq!(proposed_batches(Some(91)), vec![22, 45, 91]);
        assert!(proposed_batches(None).is_empty());
        assert!(proposed_batches(Some(0)).is_empty());
    }

    #[test]
    fn the_list_is_the_proposal_until_the_user_types_one() {
        let mut s = RunSettings::default();
        assert_eq!(s.batch_list(Some(1)), "1");
        assert_eq!(s.batch_plan(Some(1), 64), Ok(BatchPlan::List(vec![1])));
        assert_eq!(s.batch_plan(None, 64), Err(NOTHING_FITS.to_string()));
        s.batches = "4,8,16".into();
        s.batches_typed = true;
        assert_eq!(s.batch_list(Some(1)), "4,8,16");
        assert_eq!(s.batch_plan(None, 64), Ok(BatchPlan::List(vec![4, 8, 16])));
        // Old persisted settings (no `batches_typed`) follow the plan.
        let old: RunSettings = serde_json::from_str(r#"{"batches": "4,8,16"}"#).expect("old");
        assert_eq!(old.batch_list(Some(2)), "1,2");
    }
}

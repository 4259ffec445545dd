//! The Run tab: run the planner's model and training configuration on the GPU (native
//! or PyTorch engine, a batch list or a sweep until OOM), watch it progress, and compare
//! what was measured with what was predicted. Panels draw [`RunSettings`] (persisted)
//! and the [`RunSession`] (runtime) and return [`RunCommand`]s for `app.rs`.

pub mod controls;
pub mod plots;
pub mod ranks;
pub mod results;
pub mod session;
pub mod table;

use serde::{Deserialize, Serialize};

use crate::ui::png::PlotId;
use vramlab_device::bench::{BatchPlan, EngineKind};

pub use session::{KeptRun, RunSession};

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
    /// "4,8,16".
    pub batches: String,
    /// Timed steps per trial (after a warm-up step).
    pub steps: u32,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            engine: EngineKind::Native,
            python: "python3".into(),
            mode: BatchMode::List,
            batches: "4,8,16".into(),
            steps: 3,
        }
    }
}

impl RunSettings {
    /// The batches to run: the parsed list, or a sweep seeded by `predicted_max`.
    pub fn batch_plan(&self, predicted_max: Option<u64>, limit: u64) -> Result<BatchPlan, String> {
        match self.mode {
            BatchMode::List => BatchPlan::parse_list(&self.batches),
            BatchMode::Sweep => Ok(BatchPlan::UntilOom {
                seed: predicted_max.unwrap_or(1).max(1),
                limit,
            }),
        }
    }
}

/// What the Run panel asks the app to do.
#[derive(Debug, Clone, PartialEq)]
pub enum RunCommand {
    SetSettings(RunSettings),
    Start,
    Cancel,
    /// Show this run (by id).
    Select(u64),
    /// Draw this run's measured points in the batch plot too.
    SetOverlay(u64, bool),
    /// Show this trial's timeline (index into the shown run's trials).
    SelectTrial(usize),
    SaveJson,
    SaveCsv,
    OpenRun,
    SavePlot(PlotId),
    DismissError,
}

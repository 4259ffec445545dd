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

use crate::ui::png::PlotId;

pub use crate::ui::run_settings::{
    BatchMode, MAX_STEPS, NOTHING_FITS, RunSettings, proposed_batches,
};
pub use session::{KeptRun, RunSession};

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

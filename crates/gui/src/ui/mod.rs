//! The planner GUI's panels. Each panel draws state and derived results and returns an
//! optional [`Command`]; `app.rs` applies commands once per frame. Panels never block
//! and never plan: planning happens in [`derived::Derived::refresh`].

pub mod answer;
pub mod background_job;
pub mod breakdown;
pub mod custom;
pub mod custom_doc;
pub mod derived;
pub mod distributed_panel;
pub mod doctor;
pub mod export_panel;
pub mod fit;
pub mod fit_search;
pub mod gpu_target;
pub mod hover;
pub mod inference;
pub mod inference_panel;
pub mod inputs;
pub mod message;
pub mod model_picker;
pub mod monitor;
pub mod plots;
pub mod png;
pub mod remedies;
pub mod run;
pub mod run_settings;
pub mod state;
pub mod style;
pub mod sweep_job;
pub mod tips;

use vramlab_core::export::Format;
use vramlab_core::plan::TrainConfig;

pub use derived::Derived;
pub use state::{GpuChoice, PlannerState};

/// A change requested by a panel.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Select a built-in preset by id (drops any custom model).
    SelectPreset(String),
    /// Replace the custom model by this preset document (`id` = "custom").
    SetCustom(serde_json::Value),
    /// Go back from the custom model to the preset it was made from.
    ResetCustom,
    SetSearch(String),
    SetFamilyFilter(Option<String>),
    /// New training configuration (batch, precision, …).
    SetConfig(TrainConfig),
    /// A remedy's configuration (same effect as `SetConfig`, kept apart for clarity).
    ApplyRemedy(TrainConfig),
    SetGpu(GpuChoice),
    /// Safety margin in percent of the GPU's capacity.
    SetMarginPct(f64),
    SetUseFreeMemory(bool),
    /// Re-query NVML.
    RefreshGpu,
    SavePreset,
    OpenPreset,
    /// Choose the export format shown in the Export section.
    SetExportFormat(Format),
    /// Save the Export section's preview to a file (save dialog).
    SaveExport,
    /// Save the current plan as a `.vramlab.json` (Ctrl+S).
    SavePlan,
    /// Open a `.vramlab.json` and apply it (Ctrl+O).
    OpenPlan,
    /// Open a file of the Recent menu.
    OpenRecent(String),
    /// Save a plot as PNG (screenshot of the next frame, cropped to the plot).
    SavePlot(png::PlotId),
    DismissMessage,
    /// A "make it fit" candidate's configuration (micro-batch and accumulation included).
    ApplyFit(TrainConfig),
    /// Run the "make it fit" search although the plan fits.
    SearchFit,
    /// Import a Hugging Face `config.json` (open dialog) as the custom model.
    OpenHfConfig,
    /// Read a Hub id (`ORG/NAME[@REVISION]`) or a model folder as the custom model, as
    /// `--model` does.
    LoadModelSource(String),
    /// Plan training steps or inference calls.
    SetMode(inference::PlannerMode),
    /// New inference settings (step, batch, prompt, new tokens, precision, …).
    SetInfer(inference::InferSettings),
}

/// Sets `slot` to `cmd` (the last change of a frame wins; users change one widget at a time).
pub(crate) fn emit(slot: &mut Option<Command>, cmd: Command) {
    *slot = Some(cmd);
}

//! The persisted planner state: what the user chose. Everything derived from it lives
//! in [`super::Derived`], which is never persisted.

use serde::{Deserialize, Serialize};

use vramlab_core::plan::TrainConfig;

use super::inference::{InferSettings, PlannerMode};
use super::run_settings::RunSettings;

/// Bumped when the meaning of a persisted field changes; older state is discarded.
pub const STATE_VERSION: u32 = 1;

/// Preset shown on first start.
pub const DEFAULT_PRESET: &str = "gpt2";
/// Catalog card planned against when no GPU is detected.
pub const DEFAULT_GPU: &str = "rtx-4090";

/// Most files in the Recent menu.
pub const RECENT_FILES: usize = 8;

/// Which GPU the plan is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum GpuChoice {
    /// The GPU NVML reports (falls back to [`DEFAULT_GPU`] when there is none).
    #[default]
    Detected,
    /// A catalog card by id (`presets/gpus.json`).
    Catalog(String),
}

/// Everything the user set in the planner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlannerState {
    pub version: u32,
    /// The built-in preset selected (for a custom model: the one it was made from).
    pub preset_id: String,
    /// The custom model's preset document (`id` = "custom"), when the user edited parameters,
    /// imported a `config.json` or opened a captured graph.
    pub custom: Option<super::custom_doc::CustomDoc>,
    /// Preset list filter.
    pub search: String,
    pub family_filter: Option<String>,
    pub config: TrainConfig,
    pub gpu: GpuChoice,
    /// Safety margin in percent of capacity.
    pub margin_pct: f64,
    /// Plan against the detected GPU's free memory instead of its total.
    pub use_free_memory: bool,
    /// The Run tab's form.
    pub run: RunSettings,
    /// `.vramlab.json` files opened or saved, newest first (at most [`RECENT_FILES`]).
    pub recent: Vec<String>,
    /// Training steps or inference calls.
    pub mode: PlannerMode,
    /// The Inference mode's call.
    pub infer: InferSettings,
}

impl Default for PlannerState {
    fn default() -> Self {
        PlannerState {
            version: STATE_VERSION,
            preset_id: DEFAULT_PRESET.to_string(),
            custom: None,
            search: String::new(),
            family_filter: None,
            config: TrainConfig::default(),
            gpu: GpuChoice::default(),
            margin_pct: 5.0,
            use_free_memory: false,
            run: RunSettings::default(),
            recent: Vec::new(),
            mode: PlannerMode::default(),
            infer: InferSettings::default(),
        }
    }
}

impl PlannerState {
    /// Restores persisted state, discarding it when it is from another version.
    pub fn from_persisted(loaded: Option<PlannerState>) -> PlannerState {
        loaded
            .filter(|s| s.version == STATE_VERSION)
            .unwrap_or_default()
    }

    /// Puts `path` first in the recent files (once), keeping at most [`RECENT_FILES`].
    pub fn remember_file(&mut self, path: &str) {
        self.recent.retain(|p| p != path);
        self.recent.insert(0, path.to_string());
        self.recent.truncate(RECENT_FILES);
    }

    /// The safety margin as a fraction for [`vramlab_core::plan::search::Budget`].
    pub fn margin(&self) -> f64 {
        (self.margin_pct / 100.0).clamp(0.0, 0.95)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_files_are_unique_newest_first_and_bounded() {
        let mut s = PlannerState::default();
        for i in 0..12 {
            s.remember_file(&format!("/tmp/{i}.vramlab.json"));
        }
        s.remember_file("/tmp/5.vramlab.json");
        assert_eq!(s.recent.len(), RECENT_FILES);
        assert_eq!(s.recent[0], "/tmp/5.vramlab.json");
        assert_eq!(s.recent[1], "/tmp/11.vramlab.json");
        assert_eq!(s.recent.iter().filter(|p| p.contains("/5.")).count(), 1);
    }
}

//! The planner application's state (`VramApp`): the persisted planner state and, beside it,
//! the runtime caches, the dialogs, the background work and the message lines; what applies
//! commands to it is `app.rs` and the files beside this one.

use super::dialogs::{OpenDialog, PathPrompt, SaveDialog};
use super::tab::Tab;
use super::workers::{Detector, Loading, MonitorOpener, PendingShot, Spawner};
use crate::ui::message::Message;
use crate::ui::run::RunSession;
use crate::ui::{Derived, GpuChoice, PlannerState};
use vramlab_core::export::Format;
use vramlab_device::gpu;

/// The planner application.
pub struct VramApp {
    /// What the user chose; persisted.
    pub state: PlannerState,
    pub(super) derived: Derived,
    pub(super) message: Option<Message>,
    pub(super) save_dialog: SaveDialog,
    pub(super) open_dialog: OpenDialog,
    /// The open dialog of "Open config.json…" (`None`: the open dialog).
    pub(super) open_config_dialog: Option<OpenDialog>,
    pub(super) detector: Detector,
    pub(super) style_applied: bool,
    /// The format the Export section shows (not persisted).
    pub(super) export_format: Format,
    pub(super) tab: Tab,
    pub(super) runs: RunSession,
    pub(super) spawner: Spawner,
    pub(super) monitor: Option<gpu::monitor::Monitor>,
    pub(super) monitor_opener: MonitorOpener,
    pub(super) pending_shot: Option<PendingShot>,
    /// The Doctor tab (OOM messages and memory snapshots).
    pub doctor: crate::ui::doctor::DoctorPanel,
    /// "Open … by path", when the file dialog gave nothing.
    pub(super) path_prompt: Option<PathPrompt>,
    /// The message, when it is about one plan (the batch a model switch chose).
    pub(super) plan_notice: Option<PlanNotice>,
    /// Where Hub ids resolve (the huggingface_hub variables at start-up).
    pub(super) hub_env: vramlab_hub::HubEnv,
    /// A Hub id or model folder being read.
    pub(super) model_loading: Option<Loading>,
    /// Wait for that read in the frame that asked for it (tests).
    pub(super) hub_blocking: bool,
}

/// A status line about one plan ("Batch 16 to 1: … does not fit …"): it holds while that
/// plan is the current one and goes when the plan changes (Apply, another batch or GPU).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlanNotice {
    pub(super) text: String,
    pub(super) plan: PlanKey,
}

/// What a plan depends on: the model, its training configuration and the target.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PlanKey {
    pub(super) preset_id: String,
    pub(super) custom: Option<crate::ui::custom_doc::CustomDoc>,
    pub(super) config: vramlab_core::plan::TrainConfig,
    pub(super) gpu: GpuChoice,
    pub(super) margin_pct: f64,
    pub(super) use_free_memory: bool,
}

impl PlanKey {
    pub(super) fn of(s: &PlannerState) -> PlanKey {
        PlanKey {
            preset_id: s.preset_id.clone(),
            custom: s.custom.clone(),
            config: s.config,
            gpu: s.gpu.clone(),
            margin_pct: s.margin_pct,
            use_free_memory: s.use_free_memory,
        }
    }
}

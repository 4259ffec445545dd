//! The eframe application: the planner GUI.
//!
//! [`VramApp`] holds the persisted [`PlannerState`] and, beside it, the runtime caches
//! ([`Derived`]), the GPU detected at start-up and the file dialogs. Each frame the
//! panels draw and return [`Command`]s; the app applies them and replans in the same
//! frame (the left panel's change is applied before the answer is drawn). The Run and
//! Monitor tabs, plot PNGs and recent files are in [`run_tab`]; the app's state is
//! [`vram_app`]'s, its dialogs [`dialogs`]' and its background work [`workers`]'.

pub mod captured_file;
mod dialogs;
pub mod model_source;
mod run_tab;
mod tab;
mod vram_app;
mod workers;

pub use dialogs::{OpenDialog, SaveDialog};
pub use tab::Tab;
pub use vram_app::VramApp;
pub use workers::{Detector, MonitorOpener, Spawner};

use std::path::{Path, PathBuf};

use egui::{Key, KeyboardShortcut, Modifiers, RichText, Ui};

use self::dialogs::{
    NO_DIALOG, OpenKind, PathPrompt, read_limited, rfd_open, rfd_open_config, rfd_save,
};
use self::vram_app::{PlanKey, PlanNotice};
use crate::ui::derived::TargetKind;
use crate::ui::inputs::inputs_ui;
use crate::ui::message::Message;
use crate::ui::png::{self, PlotId};
use crate::ui::run::RunSession;
use crate::ui::{
    Command, Derived, GpuChoice, PlannerState, answer, breakdown, export_panel, plots, remedies,
    style, tips,
};
use vramlab_core::export::vramlab_file::ModelRef;
use vramlab_core::export::{Format, VramlabConfig};
use vramlab_core::fsutil::write_atomic;
use vramlab_core::model::Preset;
use vramlab_device::gpu::{self, DetectedGpu};

/// Central-panel width from which the breakdown and the batch plot sit side by side.
const WIDE_CENTRAL: f32 = 900.0;

/// Ctrl+S (⌘S on macOS): save the current plan as a `.vramlab.json`.
pub const SAVE_PLAN_SHORTCUT: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::S);
/// Ctrl+Q (⌘Q on macOS): close the window (state is saved as on any close).
pub const QUIT_SHORTCUT: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::Q);
/// Ctrl+O (⌘O on macOS): open a `.vramlab.json`.
pub const OPEN_PLAN_SHORTCUT: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::O);

impl VramApp {
    /// The real app: restores persisted state and asks NVML for a GPU (once).
    pub fn new(cc: &eframe::CreationContext<'_>) -> VramApp {
        let loaded = cc
            .storage
            .and_then(|s| eframe::get_value::<PlannerState>(s, eframe::APP_KEY));
        let mut app = VramApp::with_state(PlannerState::from_persisted(loaded), gpu::detect());
        style::apply(&cc.egui_ctx);
        app.style_applied = true;
        app
    }

    /// An app without eframe, storage, NVML or dialogs (dialogs return `None`, as rfd
    /// does with no portal or zenity). For tests and screenshots.
    pub fn new_for_test(detected: Option<DetectedGpu>) -> VramApp {
        let mut app = VramApp::with_state(PlannerState::default(), detected.clone());
        app.save_dialog = Box::new(|_| None);
        app.open_dialog = Box::new(|| None);
        app.open_config_dialog = None;
        app.detector = Box::new(move || detected.clone());
        // What tests draw must not depend on a worker thread's timing.
        app.derived.fit.blocking = true;
        app.derived.sweep.blocking = true;
        app.derived.remedies.blocking = true;
        app.derived.infer.context.blocking = true;
        app.hub_blocking = true;
        app
    }

    /// Runs the "make it fit" searches, the remedies and the memory-versus-batch curve on
    /// worker threads, as the app does (a test app runs them on the calling thread): for
    /// timing frames.
    pub fn search_in_background(&mut self) {
        self.derived.fit.blocking = false;
        self.derived.sweep.blocking = false;
        self.derived.remedies.blocking = false;
        self.derived.infer.context.blocking = false;
    }

    /// Whether a "make it fit" search is running on its worker thread.
    pub fn search_running(&self) -> bool {
        self.derived.fit.running()
    }

    fn with_state(mut state: PlannerState, detected: Option<DetectedGpu>) -> VramApp {
        let derived = Derived::new(detected);
        if !derived.presets.iter().any(|p| p.id == state.preset_id)
            && let Some(first) = derived.presets.first()
        {
            state.preset_id = first.id.clone();
            state.custom = None;
        }
        VramApp {
            state,
            derived,
            message: None,
            save_dialog: Box::new(rfd_save),
            open_dialog: Box::new(rfd_open),
            open_config_dialog: Some(Box::new(rfd_open_config)),
            detector: Box::new(gpu::detect),
            style_applied: false,
            export_format: Format::Vramlab,
            tab: Tab::default(),
            runs: RunSession::default(),
            spawner: workers::default_spawner(),
            monitor: None,
            monitor_opener: workers::default_monitor(),
            pending_shot: None,
            doctor: crate::ui::doctor::DoctorPanel::default(),
            path_prompt: None,
            plan_notice: None,
            hub_env: vramlab_hub::HubEnv::from_env(),
            model_loading: None,
            hub_blocking: false,
        }
    }

    /// Where Hub ids typed in the model picker resolve (tests point it at a cache).
    pub fn set_hub_env(&mut self, env: vramlab_hub::HubEnv) {
        self.hub_env = env;
    }

    /// Replaces the file dialogs (tests).
    pub fn set_dialogs(&mut self, save: SaveDialog, open: OpenDialog) {
        self.save_dialog = save;
        self.open_dialog = open;
        self.open_config_dialog = None;
    }

    /// The derived results as last computed (tests compare them with the core).
    pub fn derived(&self) -> &Derived {
        &self.derived
    }

    /// The derived results, to refresh them without a frame (tests of the exports).
    pub fn derived_mut(&mut self) -> &mut Derived {
        &mut self.derived
    }

    /// The status message under the preset buttons, if any.
    pub fn message(&self) -> Option<&Message> {
        self.message.as_ref()
    }

    /// The format the Export section shows.
    pub fn export_format(&self) -> Format {
        self.export_format
    }

    /// Applies one command to the state. Planning happens in the next `refresh`.
    pub fn apply(&mut self, cmd: Command, ctx: &egui::Context) {
        let s = &mut self.state;
        match cmd {
            Command::SelectPreset(id) => {
                let changed = s.preset_id != id || s.custom.is_some();
                s.preset_id = id;
                s.custom = None;
                s.config.size = None;
                // (the training batch follows the model in Training mode only: in Inference
                // mode its notice would be about a step not shown)
                if changed && s.mode == crate::ui::inference::PlannerMode::Training {
                    self.fit_batch_to_model();
                }
            }
            Command::SetCustom(doc) => s.custom = Some(doc.into()),
            Command::ResetCustom => s.custom = None,
            Command::SetSearch(t) => s.search = t,
            Command::SetFamilyFilter(f) => s.family_filter = f,
            Command::SetConfig(c) | Command::ApplyRemedy(c) | Command::ApplyFit(c) => s.config = c,
            Command::SearchFit => self.derived.fit_wanted = true,
            Command::SetGpu(g) => s.gpu = g,
            Command::SetMarginPct(m) => s.margin_pct = m.clamp(0.0, 50.0),
            Command::SetUseFreeMemory(b) => s.use_free_memory = b,
            Command::RefreshGpu => {
                self.derived.detected = (self.detector)();
                if self.derived.detected.is_none() && s.gpu == GpuChoice::Detected {
                    self.message = Some(Message {
                        text: "No NVIDIA GPU detected (NVML unavailable).".into(),
                        is_error: false,
                    });
                }
            }
            Command::SavePreset => self.save_preset(ctx),
            Command::OpenPreset => self.open_preset(),
            Command::OpenHfConfig => self.open_hf_config(),
            Command::LoadModelSource(name) => self.load_model_source(&name),
            Command::DismissMessage => self.message = None,
            Command::SetExportFormat(f) => self.export_format = f,
            Command::SaveExport => self.save_export(ctx),
            Command::SavePlan => self.save_plan(ctx),
            Command::OpenPlan => self.open_plan(),
            Command::OpenRecent(path) => self.open_recent(&path),
            Command::SavePlot(id) => self.save_plot(id, ctx),
            Command::SetMode(m) => s.mode = m,
            Command::SetInfer(i) => s.infer = i,
        }
        self.follow_plan();
    }

    /// Drops a notice about a plan that is no longer the current one (after Apply made
    /// it fit, say), so the Planner and Run tabs never show a stale "does not fit".
    fn follow_plan(&mut self) {
        let Some(n) = &self.plan_notice else {
            return;
        };
        if self.message.as_ref().is_none_or(|m| m.text != n.text) {
            // Another message replaced it.
            self.plan_notice = None;
        } else if n.plan != PlanKey::of(&self.state) {
            self.message = None;
            self.plan_notice = None;
        }
    }

    /// After a model switch: keeps the batch when it fits the new model, else takes the
    /// largest that fits (batch 1 when none does), and says which and why.
    fn fit_batch_to_model(&mut self) {
        self.derived.refresh(&self.state);
        let batch = self.state.config.batch;
        let Ok(preset) = self.derived.preset() else {
            return;
        };
        let model = preset.display_name.clone();
        let gpu = self.derived.target().gpu.name.clone();
        let text = match self.derived.max_batch() {
            Some(Ok(Some(m))) if *m < batch => {
                self.state.config.batch = *m;
                format!(
                    "Batch {batch} to {m}: {batch} does not fit {model} on {gpu}; {m} is the largest that does."
                )
            }
            Some(Ok(Some(m))) => {
                format!("Batch {batch} kept: it fits {model} on {gpu} (up to {m}).")
            }
            Some(Ok(None)) => {
                self.state.config.batch = 1;
                format!(
                    "Batch {batch} to 1: {model} does not fit on {gpu} even at batch 1; see the remedies."
                )
            }
            _ => return,
        };
        self.plan_notice = Some(PlanNotice {
            text: text.clone(),
            plan: PlanKey::of(&self.state),
        });
        self.message = Some(Message {
            text,
            is_error: false,
        });
        self.derived.refresh(&self.state);
    }

    fn error(&mut self, text: String) {
        self.message = Some(Message {
            text,
            is_error: true,
        });
    }

    /// Writes `text` where the save dialog says (suggesting `name`); without a file,
    /// copies it to the clipboard. Returns the path written.
    fn save_text(
        &mut self,
        ctx: &egui::Context,
        name: &str,
        text: String,
        what: &str,
    ) -> Option<PathBuf> {
        let mut written = None;
        self.message = Some(match (self.save_dialog)(name) {
            Some(path) => match write_atomic(&path, text.as_bytes()) {
                Ok(()) => {
                    let m = Message {
                        text: format!("Saved {}", path.display()),
                        is_error: false,
                    };
                    written = Some(path);
                    m
                }
                Err(e) => Message {
                    text: format!("Could not write {}: {e}", path.display()),
                    is_error: true,
                },
            },
            None => {
                ctx.copy_text(text);
                Message {
                    text: format!("{NO_DIALOG} The {what} was copied to the clipboard instead."),
                    is_error: false,
                }
            }
        });
        written
    }

    /// Ctrl+S: the current plan as a `.vramlab.json`. Saved plans hold training steps (as
    /// `plan --config` reads them): in Inference mode it says so instead of saving the
    /// training plan behind the inference panel.
    fn save_plan(&mut self, ctx: &egui::Context) {
        if self.state.mode == crate::ui::inference::PlannerMode::Inference {
            self.error(
                "Cannot save: saved plans hold training steps; an inference call is not \
                 saved yet (switch to Training step to save the training plan)"
                    .to_string(),
            );
            return;
        }
        let plan = self.derived.answer().map(|a| &a.report.plan);
        let doc = export_panel::vramlab_config(&self.state, &self.derived, plan);
        let (Some(doc), Ok(preset)) = (doc, self.derived.preset()) else {
            let e = self.derived.error().unwrap_or("no model").to_string();
            self.error(format!("Cannot save: the model is invalid ({e})"));
            return;
        };
        let name = export_panel::suggested_file_name(Format::Vramlab, &preset.id);
        if let Some(path) = self.save_text(ctx, &name, doc.to_json(), "plan (.vramlab.json)") {
            self.state.remember_file(&path.display().to_string());
        }
    }

    /// The Export section's Save…: the previewed text.
    fn save_export(&mut self, ctx: &egui::Context) {
        let format = self.export_format;
        let text = self.derived.answer().and_then(|a| {
            export_panel::export_text(&self.state, &self.derived, &a.report.plan, format)
        });
        let (Some(text), Ok(preset)) = (text, self.derived.preset()) else {
            let e = self.derived.error().unwrap_or("no plan").to_string();
            self.error(format!("Nothing to export: {e}"));
            return;
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                self.error(format!("Nothing to export: {e:#}"));
                return;
            }
        };
        let name = export_panel::suggested_file_name(format, &preset.id);
        let what = format!("{} export", export_panel::format_label(format));
        self.save_text(ctx, &name, text, &what);
    }

    /// Ctrl+O: a `.vramlab.json` chosen in the open dialog.
    fn open_plan(&mut self) {
        let Some(path) = (self.open_dialog)() else {
            self.message = Some(Message {
                text: format!(
                    "{NO_DIALOG} Type its path instead; `vramlab plan --config FILE` reads .vramlab.json files too."
                ),
                is_error: false,
            });
            self.path_prompt = Some(PathPrompt::new(OpenKind::Plan));
            return;
        };
        self.open_plan_at(&path);
    }

    fn open_plan_at(&mut self, path: &Path) {
        let source = path.display().to_string();
        match read_limited(path) {
            Ok(bytes) => {
                if self.load_plan(&source, &bytes) {
                    self.state.remember_file(&source);
                }
            }
            Err(e) => self.error(format!("Could not open {source}: {e}")),
        }
    }

    /// Applies a `.vramlab.json` document (from `source`); on any error the state is
    /// untouched and the error is shown. True when it was applied.
    pub fn load_plan(&mut self, source: &str, bytes: &[u8]) -> bool {
        match self.state_from_plan(bytes) {
            Ok(state) => {
                self.state = state;
                self.message = Some(Message {
                    text: format!("Opened {source}"),
                    is_error: false,
                });
                true
            }
            Err(e) => {
                self.error(format!("Could not open {source}: {e}"));
                false
            }
        }
    }

    /// The state a `.vramlab.json` document describes (model, training, GPU, margin);
    /// everything else (search, filters, free-memory switch) is kept.
    fn state_from_plan(&self, bytes: &[u8]) -> Result<PlannerState, String> {
        let cfg = VramlabConfig::from_bytes(bytes).map_err(|e| e.to_string())?;
        let mut s = self.state.clone();
        match &cfg.model {
            ModelRef::Preset(id) => {
                if !self.derived.presets.iter().any(|p| &p.id == id) {
                    return Err(format!("model: unknown preset `{id}`"));
                }
                s.preset_id = id.clone();
                s.custom = None;
            }
            ModelRef::Custom(_) => {
                let preset = cfg.preset().map_err(|e| e.to_string())?;
                let doc = serde_json::to_value(&preset).map_err(|e| format!("model: {e}"))?;
                s.custom = Some(doc.into());
            }
        }
        s.config = cfg.training;
        s.gpu = match cfg.gpu.as_str() {
            // Saved against the detected card: this machine's GPU when it is that card,
            // else the catalog card the file names (as `vramlab plan --config` does).
            _ if cfg.gpu_detected.as_ref().is_some_and(|c| {
                self.derived
                    .detected
                    .as_ref()
                    .is_some_and(|d| d.name == c.name)
            }) =>
            {
                GpuChoice::Detected
            }
            "detected" => GpuChoice::Detected,
            id if self.derived.catalog.iter().any(|g| g.id == id) => {
                GpuChoice::Catalog(id.to_string())
            }
            other => return Err(format!("gpu: unknown GPU `{other}` (not in the catalog)")),
        };
        s.margin_pct = (cfg.margin * 100.0).clamp(0.0, 50.0);
        Ok(s)
    }

    /// Ctrl+S / Ctrl+O and files dropped on the window.
    fn handle_input(&mut self, ctx: &egui::Context) {
        let (save, open, quit) = ctx.input_mut(|i| {
            (
                i.consume_shortcut(&SAVE_PLAN_SHORTCUT),
                i.consume_shortcut(&OPEN_PLAN_SHORTCUT),
                i.consume_shortcut(&QUIT_SHORTCUT),
            )
        });
        if quit {
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
        if save {
            self.apply(Command::SavePlan, ctx);
        }
        if open {
            self.apply(Command::OpenPlan, ctx);
        }
        // The Doctor tab takes its own drops and pastes (messages, snapshots).
        let dropped = (self.tab != Tab::Doctor)
            .then(|| ctx.input(|i| i.raw.dropped_files.first().cloned()))
            .flatten();
        let pasted = (self.tab != Tab::Doctor).then(|| {
            ctx.input(|i| {
                i.events.iter().find_map(|e| match e {
                    egui::Event::Paste(t) => Some(t.clone()),
                    _ => None,
                })
            })
        });
        // Pasted text that is a Hugging Face config.json imports that model.
        let pasted = pasted
            .flatten()
            .is_some_and(|t| self.import_hf_config("pasted config.json", "pasted", &t));
        let dropped_dir = dropped
            .as_ref()
            .filter(|f| f.path().is_dir())
            .map(|f| f.path().display().to_string());
        let dropped = dropped.filter(|_| dropped_dir.is_none());
        if let Some(dir) = &dropped_dir {
            // A model folder: its config.json and safetensors headers.
            self.load_model_source(dir);
        }
        if let Some(file) = &dropped {
            let source = file.path().display().to_string();
            let name = vramlab_core::model::hf::name_for_path(file.path());
            // Bounded: eframe's `DroppedFile::bytes` reads the whole file.
            match vramlab_core::fsutil::read_bounded(
                file.path(),
                vramlab_core::fsutil::FileKind::Model,
            ) {
                Ok(bytes) => {
                    let text = std::str::from_utf8(&bytes).unwrap_or_default();
                    if crate::app::captured_file::is_graph(text) {
                        self.message = Some(crate::app::captured_file::open(
                            &mut self.state.custom,
                            &source,
                            text,
                        ));
                    } else if self.import_hf_config(&source, &name, text) {
                        // a config.json: imported (or its error shown)
                    } else if self.load_plan(&source, &bytes) {
                        self.state.remember_file(&source);
                    }
                }
                Err(e) => self.error(format!("Could not open {source}: {e}")),
            }
        }
        let loaded = self.poll_model_source(Some(ctx));
        if save || open || pasted || loaded || dropped.is_some() || dropped_dir.is_some() {
            self.derived.refresh(&self.state);
            ctx.request_repaint();
        }
    }

    /// Imports `text` as the custom model when it is a Hugging Face `config.json`; false
    /// when it is not one (then nothing changes). An invalid config shows its error.
    pub fn import_hf_config(&mut self, source: &str, name: &str, text: &str) -> bool {
        let Some(imported) = vramlab_core::model::hf::from_text_if_hf(text, name) else {
            return false;
        };
        match imported.and_then(|p| {
            serde_json::to_value(&p)
                .map_err(|e| vramlab_core::model::ModelError::Malformed(e.to_string()))
        }) {
            Ok(doc) => {
                self.state.custom = Some(doc.into());
                self.message = Some(Message {
                    text: format!("Imported {source}"),
                    is_error: false,
                });
            }
            Err(e) => self.error(format!("Could not import {source}: {e:#}")),
        }
        true
    }

    fn save_preset(&mut self, ctx: &egui::Context) {
        let preset = match self.derived.preset() {
            Ok(p) => p.clone(),
            Err(e) => {
                self.message = Some(Message {
                    text: format!("Cannot save: the model is invalid ({e})"),
                    is_error: true,
                });
                return;
            }
        };
        let json = preset.to_json();
        self.save_text(ctx, &format!("{}.json", preset.id), json, "preset JSON");
    }

    fn open_preset(&mut self) {
        let Some(path) = (self.open_dialog)() else {
            self.message = Some(Message {
                text: format!(
                    "{NO_DIALOG} Type its path instead; `vramlab plan --model FILE` reads preset files too."
                ),
                is_error: false,
            });
            self.path_prompt = Some(PathPrompt::new(OpenKind::Preset));
            return;
        };
        self.open_preset_at(&path);
    }

    /// "Open config.json…": a Hugging Face `config.json` (a preset file works too).
    fn open_hf_config(&mut self) {
        let chosen = match &mut self.open_config_dialog {
            Some(dialog) => dialog(),
            None => (self.open_dialog)(),
        };
        let Some(path) = chosen else {
            self.message = Some(Message {
                text: format!(
                    "{NO_DIALOG} Type its path instead; `vramlab plan --model path/to/config.json` reads it too."
                ),
                is_error: false,
            });
            self.path_prompt = Some(PathPrompt::new(OpenKind::HfConfig));
            return;
        };
        self.open_preset_at(&path);
    }

    fn open_preset_at(&mut self, path: &Path) {
        if path.is_dir() {
            // A model folder, read as `--model DIR` reads it.
            self.load_model_source(&path.display().to_string());
            return;
        }
        let text =
            vramlab_core::fsutil::read_bounded_string(path, vramlab_core::fsutil::FileKind::Model);
        if let Ok(text) = &text
            && crate::app::captured_file::is_graph(text)
        {
            let source = path.display().to_string();
            self.message = Some(crate::app::captured_file::open(
                &mut self.state.custom,
                &source,
                text,
            ));
            return;
        }
        let name = vramlab_core::model::hf::name_for_path(path);
        let loaded = text
            .map_err(|e| e.to_string())
            .and_then(
                |t| match vramlab_core::model::hf::from_text_if_hf(&t, &name) {
                    // A Hugging Face config.json becomes the custom model too.
                    Some(imported) => imported.map_err(|e| format!("{e:#}")),
                    None => Preset::from_json(&t).map_err(|e| format!("{e:#}")),
                },
            )
            .and_then(|p| serde_json::to_value(&p).map_err(|e| e.to_string()));
        self.message = Some(match loaded {
            Ok(doc) => {
                self.state.custom = Some(doc.into());
                Message {
                    text: format!("Opened {}", path.display()),
                    is_error: false,
                }
            }
            Err(e) => Message {
                text: format!("Could not open {}: {e}", path.display()),
                is_error: true,
            },
        });
    }

    /// The "open by path" window shown when no file dialog is available.
    fn path_prompt_ui(&mut self, ctx: &egui::Context) {
        let Some(prompt) = &mut self.path_prompt else {
            return;
        };
        let mut open = None;
        let mut close = false;
        egui::Window::new(format!("Open {} by path", prompt.kind.what()))
            .collapsible(false)
            .resizable(false)
            .anchor(egui::Align2::CENTER_CENTER, egui::vec2(0.0, 0.0))
            .show(ctx, |ui| {
                ui.label("No file dialog here (it needs xdg-desktop-portal or zenity): type the file's path.");
                let l = ui.label("Path");
                let edit = ui
                    .add(
                        egui::TextEdit::singleline(&mut prompt.text)
                            .desired_width(420.0)
                            .hint_text("/path/to/file.json"),
                    )
                    .labelled_by(l.id);
                let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(Key::Enter));
                ui.horizontal(|ui| {
                    if (ui.button("Open").clicked() || enter) && !prompt.text.trim().is_empty() {
                        open = Some((prompt.kind, PathBuf::from(prompt.text.trim())));
                    }
                    if ui.button("Cancel").clicked() {
                        close = true;
                    }
                });
            });
        if let Some((kind, path)) = open {
            self.path_prompt = None;
            match kind {
                OpenKind::Plan => self.open_plan_at(&path),
                OpenKind::Preset | OpenKind::HfConfig => self.open_preset_at(&path),
                OpenKind::Run => self.open_run_at(&path),
            }
            self.derived.refresh(&self.state);
        } else if close {
            self.path_prompt = None;
        }
    }

    /// Draws one frame (what `eframe::App::ui` calls; tests call it directly).
    pub fn ui(&mut self, ui: &mut Ui) {
        if !self.style_applied {
            style::apply(ui.ctx());
            self.style_applied = true;
            ui.ctx().request_repaint();
        }
        let ctx = ui.ctx().clone();
        self.derived.refresh(&self.state);
        self.handle_input(&ctx);
        self.follow_plan();
        self.poll_background(&ctx);

        let top = egui::Panel::top("top_bar")
            .show(ui, |ui| self.top_bar_ui(ui))
            .inner;
        if let Some(cmd) = top {
            self.apply(cmd, &ctx);
            self.derived.refresh(&self.state);
            ctx.request_repaint();
        }
        match self.tab {
            Tab::Planner => self.planner_tab_ui(ui, &ctx),
            Tab::Run => self.run_tab_ui(ui),
            Tab::Monitor => self.monitor_tab_ui(ui),
            Tab::Doctor => {
                let hint = crate::ui::doctor::planner_advice(&self.derived);
                self.doctor.show(ui, hint.as_ref());
            }
        }
        self.path_prompt_ui(&ctx);
    }

    fn planner_tab_ui(&mut self, ui: &mut Ui, ctx: &egui::Context) {
        if self.derived.fit.on_done.is_none() {
            let c = ctx.clone();
            self.derived.fit.on_done = Some(std::sync::Arc::new(move || c.request_repaint()));
        }
        if self.derived.sweep.on_done.is_none() {
            let c = ctx.clone();
            self.derived.sweep.on_done = Some(std::sync::Arc::new(move || c.request_repaint()));
        }
        if self.derived.infer.context.on_done.is_none() {
            let c = ctx.clone();
            self.derived.infer.context.on_done =
                Some(std::sync::Arc::new(move || c.request_repaint()));
        }
        if self.derived.remedies.on_done.is_none() {
            let c = ctx.clone();
            self.derived.remedies.on_done = Some(std::sync::Arc::new(move || c.request_repaint()));
        }
        let inference = self.state.mode == crate::ui::inference::PlannerMode::Inference;
        if !inference {
            self.derived.refresh_fit(&self.state);
        }
        let left = egui::Panel::left("inputs")
            .resizable(true)
            .default_size(350.0)
            .min_size(300.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("inputs_scroll")
                    .show(ui, |ui| {
                        if inference {
                            crate::ui::inference_panel::infer_inputs_ui(
                                &self.state,
                                &self.derived,
                                self.message.as_ref(),
                                ui,
                            )
                        } else {
                            inputs_ui(&self.state, &self.derived, self.message.as_ref(), ui)
                        }
                    })
                    .inner
            })
            .inner;
        if let Some(cmd) = left {
            self.apply(cmd, ctx);
            self.derived.refresh(&self.state);
            // The top bar was drawn before the change.
            ctx.request_repaint();
        }

        if inference {
            egui::CentralPanel::default().show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("infer_scroll")
                    .show(ui, |ui| {
                        crate::ui::inference_panel::infer_results_ui(&self.state, &self.derived, ui)
                    })
            });
            return;
        }
        let central = egui::CentralPanel::default()
            .show(ui, |ui| self.central_ui(ui))
            .inner;
        if let Some(cmd) = central {
            self.apply(cmd, ctx);
            self.derived.refresh(&self.state);
            ctx.request_repaint();
        }
    }

    /// Title, tabs, the Recent menu and the GPU line.
    fn top_bar_ui(&mut self, ui: &mut Ui) -> Option<Command> {
        let mut cmd = None;
        ui.horizontal(|ui| {
            ui.label(RichText::new("vramlab").size(20.0).strong());
            ui.add_space(8.0);
            for tab in Tab::ALL {
                ui.selectable_value(&mut self.tab, tab, RichText::new(tab.label()).size(16.0));
            }
            ui.add_space(4.0);
            ui.menu_button("Recent", |ui| {
                if self.state.recent.is_empty() {
                    ui.label("No recent .vramlab.json files (Ctrl+S / Ctrl+O add them).");
                }
                for path in &self.state.recent {
                    if ui.button(path).clicked() {
                        cmd = Some(Command::OpenRecent(path.clone()));
                        self.tab = Tab::Planner;
                    }
                }
            })
            .response
            .on_hover_text("Recently opened or saved .vramlab.json plans");
            ui.add_space(8.0);
            if self.tab == Tab::Planner {
                crate::ui::inference_panel::mode_switch(&self.state, ui, &mut cmd);
                ui.add_space(8.0);
            }
            // The tagline only where it leaves room for the GPU line (no overlap at 1280 px).
            if self.tab == Tab::Planner && ui.available_width() > 1100.0 {
                ui.label(match self.state.mode {
                    crate::ui::inference::PlannerMode::Training => {
                        "Will this training step fit on the GPU, and with which batch size?"
                    }
                    crate::ui::inference::PlannerMode::Inference => {
                        "Will this inference call fit on the GPU, and with how many sequences?"
                    }
                });
            }
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                let t = self.derived.target();
                let text = match (t.kind, &self.derived.detected) {
                    (TargetKind::Detected, Some(g)) => {
                        format!("GPU: {} · {} free of {}", g.name, g.free, g.total)
                    }
                    (_, Some(g)) => format!("planning for {} · detected {}", t.gpu.name, g.name),
                    (_, None) => {
                        format!("No NVIDIA GPU detected — planning against {}", t.gpu.name)
                    }
                };
                ui.add(egui::Label::new(text).truncate());
            });
        });
        cmd
    }

    fn central_ui(&self, ui: &mut Ui) -> Option<Command> {
        let mut cmd = None;
        egui::ScrollArea::vertical()
            .id_salt("central_scroll")
            .show(ui, |ui| {
                if let Some(c) = answer::answer_ui(&self.state, &self.derived, ui) {
                    cmd = Some(c);
                }
                let Some(a) = self.derived.answer() else {
                    return;
                };
                ui.add_space(4.0);
                let wide = ui.available_width() >= WIDE_CENTRAL;
                let plot_h = ((ui.available_height() - 110.0) / 2.0).clamp(200.0, 420.0);
                let breakdown = |l: &mut Ui| {
                    section(l, "Where the memory goes at the peak", tips::NVIDIA_SMI);
                    breakdown::breakdown_bar_ui(&a.report.plan, self.derived.target(), l, 96.0);
                    breakdown::breakdown_table_ui(&a.report.plan, l);
                };
                let batch_plot = |r: &mut Ui, cmd: &mut Option<Command>| {
                    if section_with_png(
                        r,
                        "Memory vs micro-batch size",
                        "Predicted peaks for every batch size; the verdict uses the nvidia-smi curve.",
                    ) {
                        *cmd = Some(Command::SavePlot(PlotId::PlannerBatch));
                    }
                    let max = self
                        .derived
                        .max_batch()
                        .and_then(|m| m.as_ref().ok().copied().flatten());
                    let rect = plots::batch_plot_ui(
                        self.derived.sweep(),
                        self.derived.target(),
                        max,
                        self.state.config.batch,
                        a.report.plan.nvidia_smi_bytes,
                        r,
                        plot_h,
                    );
                    png::remember_rect(r.ctx(), PlotId::PlannerBatch, rect);
                };
                // Wide: breakdown beside the batch plot; narrow: one column. Everything
                // else spans the width, so no table runs under a plot; the remedies come
                // before the timeline (advice first).
                if wide {
                    ui.columns(2, |cols| {
                        let (left, right) = cols.split_at_mut(1);
                        breakdown(&mut left[0]);
                        batch_plot(&mut right[0], &mut cmd);
                    });
                } else {
                    breakdown(ui);
                    ui.add_space(6.0);
                    batch_plot(ui, &mut cmd);
                }
                ui.add_space(6.0);
                section(
                    ui,
                    "What if… (remedies, each planned)",
                    "Each row re-plans the current configuration with one change; Apply makes it the configuration.",
                );
                egui::ScrollArea::horizontal()
                    .id_salt("remedies_scroll")
                    .show(ui, |ui| {
                        if let Some(c) =
                            remedies::remedies_ui(
                                &a.report.remedies,
                                a.remedies_of,
                                a.report.plan.peak_allocated_bytes,
                                ui,
                            )
                        {
                            cmd = Some(c);
                        }
                    });
                ui.add_space(6.0);
                if let Some(c) = fit_section(&self.derived, a.report.fits(), ui) {
                    cmd = Some(c);
                }
                ui.add_space(6.0);
                if section_with_png(
                    ui,
                    "One training step: allocated bytes over time",
                    "Every allocation and free of one steady-state step (all micro-batches when accumulating), coloured by phase.",
                ) {
                    cmd = Some(Command::SavePlot(PlotId::PlannerTimeline));
                }
                let rect = plots::timeline_plot_ui(a, ui, plot_h);
                png::remember_rect(ui.ctx(), PlotId::PlannerTimeline, rect);
                ui.add_space(6.0);
                let export = egui::CollapsingHeader::new(RichText::new("Export").heading())
                    .id_salt("export_section")
                    .default_open(false)
                    .show(ui, |ui| {
                        export_panel::export_ui(
                            &self.state,
                            &self.derived,
                            &a.report.plan,
                            self.export_format,
                            ui,
                        )
                    });
                if let Some(Some(c)) = export.body_returned {
                    cmd = Some(c);
                }
            });
        cmd
    }
}

/// "Make it fit": a section when the plan does not fit, a collapsed header otherwise.
fn fit_section(d: &Derived, fits: bool, ui: &mut Ui) -> Option<Command> {
    const TIP: &str = "Combinations of remedies (precision, checkpointing, micro-batch with \
                       accumulation keeping the effective batch, optimizer, LoRA, loop shape, \
                       expandable segments) that fit, ranked by predicted time per sample.";
    if !fits {
        section(ui, "Make it fit", TIP);
        return crate::ui::fit::fit_ui(&d.fit, d.fit_wanted, fits, ui);
    }
    egui::CollapsingHeader::new(RichText::new("Make it fit").heading())
        .id_salt("fit_section")
        .default_open(false)
        .show(ui, |ui| {
            crate::ui::fit::fit_ui(&d.fit, d.fit_wanted, fits, ui)
        })
        .body_returned
        .flatten()
}

fn section(ui: &mut Ui, title: &str, tip: &str) {
    ui.label(RichText::new(title).heading()).on_hover_text(tip);
}

/// A section heading with a "Save PNG…" button; true when the button was clicked.
fn section_with_png(ui: &mut Ui, title: &str, tip: &str) -> bool {
    ui.horizontal(|ui| {
        section(ui, title, tip);
        png::save_button(ui)
    })
    .inner
}

impl eframe::App for VramApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        VramApp::ui(self, ui);
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, eframe::APP_KEY, &self.state);
    }
}

/// Opens the GUI window (1400×900, at least 1000×650; theme follows the system).
/// The window and taskbar icon (`assets/icon.png`, compiled in).
pub const ICON_PNG: &[u8] = include_bytes!("../../../assets/icon.png");

/// The icon as eframe wants it (an empty icon, the platform default, if it cannot decode).
pub fn app_icon() -> egui::IconData {
    eframe::icon_data::from_png_bytes(ICON_PNG).unwrap_or_default()
}

pub fn run_gui() -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("vramlab — GPU memory planner")
            .with_inner_size([1400.0, 900.0])
            .with_min_inner_size([1000.0, 650.0])
            .with_app_id("vramlab")
            .with_icon(app_icon()),
        ..Default::default()
    };
    eframe::run_native(
        "vramlab",
        options,
        Box::new(|cc| Ok(Box::new(VramApp::new(cc)))),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "could not open the window: {e} (no display? every feature is also a subcommand: vramlab --help)"
        )
    })
}

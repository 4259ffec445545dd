//! The app's Run and Monitor tabs, plot PNGs and recent files: the commands of those
//! panels applied to [`VramApp`], and the background work they own (the bench handle,
//! the monitor sampler, a pending screenshot), polled once per frame.

use std::path::Path;

use egui::Ui;

use super::dialogs::{NO_DIALOG, OpenKind, PathPrompt, read_limited};
use super::tab::Tab;
use super::vram_app::VramApp;
use super::workers::{MonitorOpener, PendingShot, Spawner};
use crate::ui::derived::BATCH_LIMIT;
use crate::ui::inference::PlannerMode;
use crate::ui::message::Message;
use crate::ui::png::{self, PlotId};
use crate::ui::run::RunCommand;
use crate::ui::run::controls::{RunContext, controls_ui};
use crate::ui::run::results::results_ui;
use crate::ui::run::session::{KeptRun, RunSource, skeleton};
use crate::ui::run_settings::RunSettings;
use vramlab_core::export::results::{run_from_json, run_to_csv, run_to_json, suggested_run_name};
use vramlab_core::fsutil::write_atomic;
use vramlab_core::record::InferRun;
use vramlab_device::bench::{BatchPlan, BenchRequest, EngineKind, InferBench};

fn repaint(ctx: &egui::Context) -> Box<dyn Fn() + Send> {
    let ctx = ctx.clone();
    Box::new(move || ctx.request_repaint())
}

impl VramApp {
    /// Replaces how runs start (tests: a replay of recorded events).
    pub fn set_spawner(&mut self, spawner: Spawner) {
        self.spawner = spawner;
    }

    /// Replaces the monitor's source (tests: a fake or failing device).
    pub fn set_monitor(&mut self, opener: MonitorOpener) {
        self.monitor_opener = opener;
        self.monitor = None;
    }

    /// The runs of this session.
    pub fn runs(&self) -> &crate::ui::run::RunSession {
        &self.runs
    }

    pub fn tab(&self) -> Tab {
        self.tab
    }

    pub fn set_tab(&mut self, tab: Tab) {
        self.tab = tab;
    }

    /// Adds a run as if it had been opened from `source` (screenshots, tests).
    pub fn show_run(&mut self, run: vramlab_device::bench::Run, source: &str) {
        self.runs.add(KeptRun::new(
            0,
            run,
            RunSource::File(source.to_string()),
            None,
        ));
    }

    /// Events of the live run, monitor samples, a screenshot that arrived.
    pub(super) fn poll_background(&mut self, ctx: &egui::Context) {
        if self.runs.poll() {
            ctx.request_repaint();
        }
        if self.runs.is_running() {
            // Worker events call request_repaint; this also animates the progress bar.
            ctx.request_repaint_after(std::time::Duration::from_millis(100));
        }
        if let Some(m) = &mut self.monitor {
            m.poll();
        }
        let got = self
            .pending_shot
            .as_ref()
            .and_then(|p| p.rx.try_recv().ok());
        if let (Some(image), Some(p)) = (got, self.pending_shot.take()) {
            match png::crop_to_png(&image, p.rect, p.pixels_per_point) {
                Ok(bytes) => self.save_bytes(p.id.file_name(), &bytes),
                Err(e) => self.error(format!("Could not save the plot: {e:#}")),
            }
        }
    }

    /// Asks for a screenshot of the next frame; [`Self::poll_background`] crops it.
    pub(super) fn save_plot(&mut self, id: PlotId, ctx: &egui::Context) {
        let Some(rect) = png::plot_rect(ctx, id) else {
            self.error("The plot is not on screen: nothing to save.".into());
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let c = ctx.clone();
        ctx.request_screenshot(move |image| {
            let _ = tx.send(image);
            c.request_repaint();
        });
        self.pending_shot = Some(PendingShot {
            id,
            rect,
            pixels_per_point: ctx.pixels_per_point(),
            rx,
        });
    }

    /// Writes `bytes` where the save dialog says (no clipboard fallback: binary data).
    fn save_bytes(&mut self, name: &str, bytes: &[u8]) {
        self.message = Some(match (self.save_dialog)(name) {
            Some(path) => match write_atomic(&path, bytes) {
                Ok(()) => Message {
                    text: format!("Saved {}", path.display()),
                    is_error: false,
                },
                Err(e) => Message {
                    text: format!("Could not write {}: {e}", path.display()),
                    is_error: true,
                },
            },
            None => Message {
                text: NO_DIALOG.to_string(),
                is_error: false,
            },
        });
    }

    /// Opens a file of the Recent menu; a file that is gone leaves the list.
    pub(super) fn open_recent(&mut self, path: &str) {
        let p = Path::new(path);
        if !p.exists() {
            self.state.recent.retain(|r| r != path);
            self.error(format!(
                "{path} no longer exists; it was removed from the Recent list."
            ));
            return;
        }
        match read_limited(p) {
            Ok(bytes) => {
                if self.load_plan(path, &bytes) {
                    self.state.remember_file(path);
                }
            }
            Err(e) => self.error(format!("Could not open {path}: {e}")),
        }
    }

    /// The Run tab: the form on the left, the shown run in the middle.
    pub(super) fn run_tab_ui(&mut self, ui: &mut Ui) {
        let ctx = ui.ctx().clone();
        let what = self.run_what();
        let predicted_max = self.predicted_max();
        let gpu_name = self.derived.target().gpu.name.clone();
        let cx = RunContext {
            what,
            predicted_max,
            gpu_name: &gpu_name,
            message: self.message.as_ref(),
            world: self.run_world(),
            inference: self.inference_mode(),
        };
        let left = egui::Panel::left("run_controls")
            .resizable(true)
            .default_size(300.0)
            .min_size(260.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("run_controls_scroll")
                    .show(ui, |ui| controls_ui(&self.state.run, &self.runs, &cx, ui))
                    .inner
            })
            .inner;
        let central = egui::CentralPanel::default()
            .show(ui, |ui| {
                egui::ScrollArea::vertical()
                    .id_salt("run_results_scroll")
                    .show(ui, |ui| results_ui(&self.runs, ui))
                    .inner
            })
            .inner;
        for cmd in [left, central].into_iter().flatten() {
            self.apply_run(cmd, &ctx);
            ctx.request_repaint();
        }
    }

    /// The Monitor tab; the sampler starts the first time it is shown.
    pub(super) fn monitor_tab_ui(&mut self, ui: &mut Ui) {
        let ctx = ui.ctx().clone();
        if self.monitor.is_none() {
            self.monitor = Some((self.monitor_opener)(repaint(&ctx)));
        }
        let save = egui::CentralPanel::default()
            .show(ui, |ui| {
                self.monitor
                    .as_ref()
                    .and_then(|m| crate::ui::monitor::monitor_ui(&m.model, ui))
            })
            .inner;
        if let Some(id) = save {
            self.save_plot(id, &ctx);
        }
    }

    /// Whether the planner is in Inference mode: the Run tab then benches the inference
    /// call (`infer_runner.py`, PyTorch engine).
    fn inference_mode(&self) -> bool {
        self.state.mode == PlannerMode::Inference
    }

    /// "GPT-2 (124M) · AMP BF16 · AdamW · seq 1024" (in Inference mode "TinyLlama 1.1B ·
    /// generate · prompt 512 + 128 new · bf16 · …"), or why the model cannot run.
    fn run_what(&self) -> Result<String, String> {
        let preset = self.derived.preset().map_err(str::to_string)?;
        if self.inference_mode() {
            let infer = &self.derived.infer;
            let planner = infer.planner().ok_or_else(|| {
                infer
                    .result()
                    .err()
                    .unwrap_or("the inference call is not planned")
                    .to_string()
            })?;
            return Ok(format!(
                "{} · {}",
                preset.display_name,
                InferRun::of(planner).describe()
            ));
        }
        if let Some(e) = self.derived.error() {
            return Err(e.to_string());
        }
        let c = &self.state.config;
        let size = self.derived.planner().map_or(0, |p| p.size);
        let size = if preset.input.is_tokens() {
            format!("seq {size}")
        } else {
            format!("{size} px")
        };
        let mut parts = vec![
            preset.display_name.clone(),
            c.precision.label().to_string(),
            c.optimizer.label().to_string(),
            size,
        ];
        if c.checkpointing {
            parts.push("checkpointing".into());
        }
        if c.accum > 1 {
            parts.push(format!("accumulation {}", c.accum));
        }
        Ok(parts.join(" · "))
    }

    /// "world 4 · fsdp2" for a multi-GPU plan (inference runs on one GPU).
    fn run_world(&self) -> Option<String> {
        let d = &self.state.config.distributed;
        (d.active() && !self.inference_mode())
            .then(|| format!("world {} · {}", d.world(), d.strategy.as_str()))
    }

    fn predicted_max(&self) -> Option<u64> {
        if self.inference_mode() {
            return self.derived.infer.max_batch();
        }
        self.derived
            .max_batch()
            .and_then(|m| m.as_ref().ok().copied().flatten())
    }

    /// The batches the Run tab's settings ask for (the predicted max batch fills a sweep's
    /// default); `None` with the reason shown when the settings are invalid.
    fn batches(&mut self, settings: &RunSettings) -> Option<BatchPlan> {
        match settings.batch_plan(self.predicted_max(), BATCH_LIMIT) {
            Ok(b) => Some(b),
            Err(e) => {
                self.runs.error = Some(e);
                None
            }
        }
    }

    fn apply_run(&mut self, cmd: RunCommand, ctx: &egui::Context) {
        match cmd {
            RunCommand::SetSettings(s) => self.state.run = s,
            RunCommand::Start => self.start_run(ctx),
            RunCommand::Cancel => self.runs.cancel(),
            RunCommand::Select(id) => self.runs.selected = Some(id),
            RunCommand::SetOverlay(id, on) => {
                if let Some(r) = self.runs.run_mut(id) {
                    r.overlay = on;
                }
            }
            RunCommand::SelectTrial(i) => {
                if let Some(r) = self.runs.shown_mut() {
                    r.selected_trial = Some(i);
                }
            }
            RunCommand::SaveJson => self.save_run(ctx, "json"),
            RunCommand::SaveCsv => self.save_run(ctx, "csv"),
            RunCommand::OpenRun => self.open_run(),
            RunCommand::SavePlot(id) => self.save_plot(id, ctx),
            RunCommand::DismissError => self.runs.error = None,
        }
    }

    fn start_run(&mut self, ctx: &egui::Context) {
        if self.runs.is_running() {
            return;
        }
        if self.inference_mode() {
            return self.start_infer_run(ctx);
        }
        let preset = match self.derived.preset() {
            Ok(p) => p.clone(),
            Err(e) => {
                self.runs.error = Some(format!("Cannot run: the model is invalid ({e})"));
                return;
            }
        };
        let Some(planner) = self.derived.planner().cloned() else {
            let e = self.derived.error().unwrap_or("no planner");
            self.runs.error = Some(format!("Cannot run: {e}"));
            return;
        };
        let settings = self.state.run.clone();
        let predicted_max = self.predicted_max();
        let Some(batches) = self.batches(&settings) else {
            return;
        };
        let python = settings.python.trim();
        // A multi-GPU plan runs its world with the PyTorch engine (the native engine
        // runs one GPU).
        let engine = if self.state.config.distributed.active() {
            EngineKind::Torch
        } else {
            settings.engine
        };
        let req = BenchRequest {
            preset: preset.clone(),
            config: self.state.config,
            engine,
            batches,
            steps: settings.steps.max(1),
            python: (engine == EngineKind::Torch && !python.is_empty()).then(|| python.into()),
            device_index: 0,
            predicted_max_batch: predicted_max,
            runner_env: Vec::new(),
            inference: None,
        };
        let skel = skeleton(
            engine,
            &preset.id,
            self.state.config,
            planner.size,
            predicted_max,
        );
        let handle = (self.spawner)(req, repaint(ctx));
        self.runs.start(handle, skel, Some(planner));
    }

    /// Benches the Inference mode's call: the PyTorch engine (`infer_runner.py`, a fresh
    /// process per trial) measures, the inference planner (the one the planner panel shows)
    /// predicts every trial and draws the curve.
    fn start_infer_run(&mut self, ctx: &egui::Context) {
        let preset = match self.derived.preset() {
            Ok(p) => p.clone(),
            Err(e) => {
                self.runs.error = Some(format!("Cannot run: the model is invalid ({e})"));
                return;
            }
        };
        let infer = &self.derived.infer;
        let Some(planner) = infer.planner().cloned() else {
            let e = infer
                .result()
                .err()
                .unwrap_or("the inference call is not planned");
            self.runs.error = Some(format!("Cannot run: {e}"));
            return;
        };
        let settings = self.state.run.clone();
        let predicted_max = self.predicted_max();
        let Some(batches) = self.batches(&settings) else {
            return;
        };
        let python = settings.python.trim();
        let mut config = vramlab_core::plan::TrainConfig::default();
        config.allocator = planner.config.allocator;
        let mut skel = skeleton(
            EngineKind::Torch,
            &preset.id,
            config,
            planner.config.prompt,
            predicted_max,
        );
        skel.inference = Some(Box::new(InferRun::of(&planner)));
        let req = BenchRequest {
            preset,
            config,
            engine: EngineKind::Torch,
            batches,
            steps: 1,
            python: (!python.is_empty()).then(|| python.into()),
            device_index: 0,
            predicted_max_batch: predicted_max,
            runner_env: Vec::new(),
            inference: Some(InferBench::new(planner.clone())),
        };
        let handle = (self.spawner)(req, repaint(ctx));
        self.runs.start_infer(handle, skel, planner);
    }

    fn save_run(&mut self, ctx: &egui::Context, ext: &str) {
        let Some(r) = self.runs.shown() else {
            self.error("No run to save.".into());
            return;
        };
        let name = suggested_run_name(&r.run, ext);
        let (text, what) = if ext == "csv" {
            (run_to_csv(&r.run), "run CSV")
        } else {
            (run_to_json(&r.run), "run JSON")
        };
        self.save_text(ctx, &name, text, what);
    }

    fn open_run(&mut self) {
        let Some(path) = (self.open_dialog)() else {
            self.message = Some(Message {
                text: format!("{NO_DIALOG} Type its path instead."),
                is_error: false,
            });
            self.path_prompt = Some(PathPrompt::new(OpenKind::Run));
            return;
        };
        self.open_run_at(&path);
    }

    pub(super) fn open_run_at(&mut self, path: &std::path::Path) {
        let source = path.display().to_string();
        let read = vramlab_core::fsutil::read_bounded(path, vramlab_core::fsutil::FileKind::Run);
        match read {
            Ok(bytes) => match run_from_json(&bytes) {
                Ok(run) => {
                    self.show_run(run, &source);
                    self.message = Some(Message {
                        text: format!("Opened {source}"),
                        is_error: false,
                    });
                }
                Err(e) => self.error(format!("Could not open {source}: {e:#}")),
            },
            Err(e) => self.error(format!("Could not open {source}: {e}")),
        }
    }
}
